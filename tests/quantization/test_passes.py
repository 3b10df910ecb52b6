"""The pass structure of the pipeline (quantization/passes.py) changes no result bit.

Oracle: the plain sequential GPTQ pipeline, written out here the slow, obvious way — for every group a whole forward
of the block with one Hessian per layer (no sharing, no early stop), and a whole re-run of the block for the next
block's inputs. Same solver, same hooks' arithmetic, so codes, scales and zeros must be *equal*, not close: every
shortcut in passes.py claims to perform the very same float operations on the very same operands.
"""

import math
import re

import pytest
import torch

from matgptq.api import make_config
from matgptq.models.arch import arch_spec, get_blocks, set_weight_matrix, weight_matrix
from matgptq.quantization.algorithm.refit import refit_master
from matgptq.quantization.algorithm.solver import gptq_quantize
from matgptq.quantization.block_groups import trace_groups
from matgptq.quantization.block_io import capture_block_inputs
from matgptq.quantization.layer import make_rounding
from matgptq.quantization.passes import PassTimes, collect_hessians
from matgptq.quantization.pipeline import quantize_model
from tests.quantization.test_pipeline import CONFIGS, tiny_model, windows

# the true-sequential groups of the architectures found from the model (no ArchSpec), written out by hand from their
# modeling code: the oracle for the groups the pipeline traces (block_groups.trace_groups)
LLAMA_LIKE = (
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("self_attn.o_proj",),
    ("mlp.gate_proj", "mlp.up_proj"),
    ("mlp.down_proj",),
)
HAND_GROUPS = {
    "gemma2": LLAMA_LIKE,
    "gemma3_text": LLAMA_LIKE,
    "olmo2": LLAMA_LIKE,
    "granite": LLAMA_LIKE,
    "opt": (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("self_attn.out_proj",), ("fc1",), ("fc2",)),
}


def reference_pipeline(model, ids, cfg, batch):
    spec = arch_spec(model)
    rounding = make_rounding(cfg)
    inputs = capture_block_inputs(model, spec, ids, batch)
    written = spec.groups or HAND_GROUPS[model.config.model_type]
    groups = written if cfg.true_sequential else (spec.layers,)  # one group: the layers in module order
    codes = {}
    for i, block in enumerate(get_blocks(model, spec)):
        for all_names in groups:
            group = [n for n in all_names if not any(re.search(p, f"{spec.blocks}.{i}.{n}") for p in cfg.skip)]
            sums, rows = {}, {}

            def hook(name):
                def fn(module, args, output):
                    x = args[0].reshape(-1, args[0].shape[-1]).float()
                    n_old = rows.get(name, 0)
                    h = sums.setdefault(name, torch.zeros(x.shape[1], x.shape[1]))
                    h.mul_(n_old / (n_old + x.shape[0]))
                    rows[name] = n_old + x.shape[0]
                    x = x * math.sqrt(2 / rows[name])
                    h.addmm_(x.T, x)

                return fn

            handles = [block.get_submodule(n).register_forward_hook(hook(n)) for n in group]
            with torch.no_grad():
                for hidden, kw in inputs:
                    block(hidden, **kw)
            for h in handles:
                h.remove()
            for name in group:
                module = block.get_submodule(name)
                res = gptq_quantize(
                    weight_matrix(module, spec).float(),
                    sums[name],
                    rounding,
                    group_size=cfg.group_size,
                    sym=cfg.sym,
                    act_order=cfg.act_order,
                    static_groups=cfg.static_groups,
                    damp=cfg.damp,
                    block_size=cfg.block_size,
                    mse=cfg.mse,
                    mse_weighted=cfg.mse_weighted,
                    group_order=cfg.group_act_order,
                )
                if cfg.refit_scales:  # the stored codes' scales refit to the Hessian (refit.py), as the pipeline does
                    res.scales = refit_master(
                        weight_matrix(module, spec).float(),
                        sums[name],
                        res.codes,
                        res.scales,
                        res.zeros,
                        res.g_idx,
                        cfg.bits,
                        res.damp,
                        None,
                    )
                codes[f"{spec.blocks}.{i}.{name}"] = res
                q = res.scales.float()[:, res.g_idx.long()] * (
                    res.codes.float() - res.zeros.float()[:, res.g_idx.long()]
                )
                set_weight_matrix(module, spec, q)
        with torch.no_grad():
            inputs = [((lambda o: o[0] if isinstance(o, tuple) else o)(block(h, **kw)), kw) for h, kw in inputs]
    return codes


CASES = {
    "gptq4": dict(method="gptq", bits=4, group_size=16),
    "gptq3-act-order-asym": dict(method="gptq", bits=3, act_order=True, static_groups=False, sym=False),
    "not-true-sequential": dict(method="gptq", bits=4, true_sequential=False),
    "matgptq-348": dict(method="matgptq", bits=(3, 4, 8), group_size=16),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_pipeline_equals_the_plain_pipeline_bit_for_bit(kind, case):
    opts = dict(CASES[case])
    method, bits = opts.pop("method"), opts.pop("bits")
    cfg = make_config(method, bits, **opts)
    ids = windows(6, 20)
    expected = reference_pipeline(tiny_model(kind), ids, cfg, batch=4)
    layers, _, times = quantize_model(tiny_model(kind), ids, cfg, batch_tokens=4 * 20, progress=False)
    assert list(layers) == list(expected)
    for name, q in layers.items():
        e = expected[name]
        assert torch.equal(q.codes, e.codes) and torch.equal(q.scales, e.scales) and torch.equal(q.zeros, e.zeros), name
    # the shortcuts were taken: true-sequential runs one pass per group and no re-run (4 groups, 2 blocks); a block
    # found from the model alone takes none (ArchSpec.residual_last is off): one pass per group and a re-run
    shortcuts = arch_spec(tiny_model(kind)).residual_last
    assert times.forward_passes == (2 * (4 + (not shortcuts)) if cfg.true_sequential else 2 * 2)


def test_skipping_the_last_linear_falls_back_to_a_re_run():
    cfg = make_config("gptq", 4, skip=(r"mlp\.down_proj$",))
    ids = windows(6, 20)
    expected = reference_pipeline(tiny_model("llama"), ids, cfg, batch=4)
    layers, _, times = quantize_model(tiny_model("llama"), ids, cfg, batch_tokens=80, progress=False)
    assert times.forward_passes == 2 * (3 + 1)  # three groups, then a re-run: nothing to replay
    assert list(layers) == list(expected)
    assert all(torch.equal(q.codes, expected[n].codes) for n, q in layers.items())


def test_shared_inputs_share_one_hessian_and_the_pass_stops_early():
    model = tiny_model("llama")
    spec = arch_spec(model)
    inputs = capture_block_inputs(model, spec, windows(4, 16), 2)
    block = get_blocks(model, spec)[0]
    calls = []
    handles = [
        block.get_submodule(n).register_forward_hook(lambda *a, n=n: calls.append(n))
        for n in ("mlp", "self_attn.v_proj")
    ]
    hessians, kept, _, rows = collect_hessians(block, spec.groups[0], inputs, PassTimes())
    for handle in handles:
        handle.remove()
    assert calls == [] and kept == []  # stopped before v_proj computed: neither it nor the MLP ran
    assert rows == dict.fromkeys(spec.groups[0], 4 * 16)  # every calibration token, counted once
    assert hessians["self_attn.q_proj"] is hessians["self_attn.k_proj"] is hessians["self_attn.v_proj"]
    with torch.no_grad():  # and it is the Hessian of the normalized input, (2/n) Σ x xᵀ, in float64
        x = torch.cat([block.input_layernorm(h) for h, _ in inputs]).reshape(-1, 32).double()
    expected = 2 * x.T @ x / x.shape[0]
    # float32 running mean over 2 batches of 32 rows: relative error ≲ (rows + 2)·2⁻²⁴ ≈ 2e-6 of Σ|x||x|
    assert torch.allclose(hessians["self_attn.q_proj"].double(), expected, rtol=0, atol=1e-5 * expected.abs().max())


def test_attention_runs_once_per_block_after_its_output_projection_is_quantized():
    """Per batch and block: q/k run in the q/k/v pass on the first batch only (it stops before v; from the second
    batch on it stops before q, whose input k and v share) and in the o pass; the gate/up and down passes use the
    cached attention output. up_proj is skipped by the gate/up pass's early stop and runs once, in the down pass.
    (The plain pipeline runs q_proj 4 times and up_proj 3 times per batch: once per group + the re-run.)"""
    model = tiny_model("llama")
    calls: dict[str, int] = {}
    for name in ("self_attn.q_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
        model.model.layers[0].get_submodule(name).register_forward_hook(
            lambda *a, n=name: calls.__setitem__(n, calls.get(n, 0) + 1)
        )
    batches = 3
    quantize_model(model, windows(9, 20), make_config("gptq", 4), batch_tokens=3 * 20, progress=False)
    assert calls == {
        "self_attn.q_proj": 1 + batches,
        "self_attn.v_proj": batches,
        "mlp.gate_proj": 1 + batches,
        "mlp.up_proj": batches,
    }


@pytest.mark.parametrize("windows_per_batch", [1, 2, 4])
def test_hessians_do_not_depend_on_the_batch_size(windows_per_batch):
    """The batch size enters a result only through the Hessians' float32 summation order: whatever the batching,
    each Hessian is (2/n) Σ x xᵀ within the float32 bound. The codes are a deterministic function of the Hessians
    (the pass structure is pinned bit for bit above), so that bound is the whole of the batch size's effect."""
    model = tiny_model("llama")
    spec = arch_spec(model)
    ids = windows(4, 16)
    inputs = capture_block_inputs(model, spec, ids, windows_per_batch)
    block = get_blocks(model, spec)[0]
    assert len(inputs) == 4 // windows_per_batch
    with torch.no_grad():  # float64 references: the normalized input of q/k/v, and of gate/up after the attention
        h = torch.cat([hid for hid, _ in inputs])
        x_attn = block.input_layernorm(h).reshape(-1, 32).double()
    for group, x in ((spec.groups[0], x_attn), (spec.groups[2], None)):
        hessians = collect_hessians(block, group, inputs, PassTimes()).hessians
        if x is None:  # gate/up: the float64 reference from the same block run on all windows at once
            got = []
            handle = block.mlp.gate_proj.register_forward_pre_hook(lambda m, args: got.append(args[0]))
            with torch.no_grad():
                for hid, kwargs in capture_block_inputs(model, spec, ids, 4):
                    block(hid, **kwargs)
            handle.remove()
            x = got[0].reshape(-1, 32).double()
        expected = 2 * x.T @ x / x.shape[0]
        # float32: (rows + batches)·2⁻²⁴ ≈ 4e-6 of Σ|x||x| ≤ max|H| (derivation in the test above)
        for name in group:
            assert torch.allclose(hessians[name].double(), expected, rtol=0, atol=1e-5 * expected.abs().max()), name


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_traced_groups_are_the_ones_written_by_hand(kind):
    """block_groups.trace_groups on a block's forward gives the groups models/arch.py writes out (llama ... gpt2) or the
    ones read off the modeling code (HAND_GROUPS, for the architectures found from the model alone)."""
    model = tiny_model(kind)
    spec = arch_spec(model)
    inputs = capture_block_inputs(model, spec, windows(2, 12), 2)
    traced = trace_groups(get_blocks(model, spec)[0], spec.layers, inputs)
    assert traced == (spec.groups or HAND_GROUPS[model.config.model_type])
