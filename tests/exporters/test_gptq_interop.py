"""GPTQ exports read by the peers: GPTQModel 7.6.0 and transformers + optimum (CPU), and GPTQModel's files read by us.

Run with the peers installed, e.g.  GPTQMODEL_CPU_WORKERS=2 python -m pytest -m interop tests/exporters/test_gptq_interop.py
(a missing peer skips, or fails under MATGPTQ_REQUIRE_PEERS=1). Each check records its measured differences with
`record_property`; benchmarks/interop/gptq_compat.py turns the junit XML into docs/results/gptq_compat.md.

What is asserted, and why it holds on every CPU (no observed tolerance anywhere):
  * weights: every quantized layer the peer dequantizes equals our weight cast to float16, bit for bit;
  * logits: bit-identical (torch.equal) to a reference that runs the peer's own arithmetic on *our* data: our model
    (`matgptq.load(source, bits=r, dtype=float16)`) with every quantized Linear replaced by the peer's kernel module
    (the class the peer picked: GPTQModel's TorchLinear, or transformers' default TorchAtenLinear for 4 bits) packed by
    the peer's packer from the QuantizedWeight we hold in memory, never from the exported file. Both sides then run
    the same torch ops on the same operands in the same order, so rounding is identical whatever the CPU's vector
    width (AVX2/AVX-512), torch's dispatch or the thread count: the bound is exactly 0.
Why not compare with our own float16 model: nn.Linear computes x·Wᵀ while TorchLinear computes matmul(x, W_kn) and
TorchAtenLinear an int4 bfloat16 GEMM; those are different float16 summation orders, so they differ by a few float16
ulps of the largest logit (measured 1.1e-3 relative on an AMD EPYC, 0 on an Intel Xeon, other values with
ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=1) — a number any fixed tolerance would have to be tuned to one machine for.
Those differences are still recorded (Δ16, Δ32 in docs/results/gptq_compat.md) but not asserted.
For scale: one zero point off by one, in one group of one layer, moves the logits by ~3e-2 (the negative control
test_zero_point_off_by_one_is_caught in test_gptq_interop_limits.py keeps this running), and any change at all fails
torch.equal.

Odd shapes: the real stories260K (MLP width 172, which fills no whole int32 word at 2 or 4 bits) exported padded as
GPTQModel pads it, with the same checks; its 4-bit files need the torch kernel in transformers (the default 4-bit
CPU kernel requires out_features % 16 == 0, asserted below so a peer upgrade that lifts it shows up).

This module holds every test benchmarks/interop/gptq_compat.py reads (TESTS there); helpers and the cache are in
gptq_interop_helpers.py, the fixtures in conftest.py (built once for this module and test_gptq_interop_limits.py:
the negative control, transformers' default-kernel limits and signed scales).
"""

import json
import re

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from matgptq.exporters.gptq import FORMATS, export_gptq
from matgptq.exporters.readers import gptq_readers
from matgptq.formats.gptq import gptq_layer
from matgptq.formats.parent import read_checkpoint
from matgptq.models.fused import fused_groups
from tests.conftest import require_peer
from tests.exporters.gptq_interop_helpers import (
    BITS,
    GROUP,
    IDS,
    MATRIX,
    _check_we_read_gptqmodel,
    _compare,
    _gptqmodel_logits,
    _gptqmodel_weights,
    _ids,
    _quant_modules,
)

pytestmark = pytest.mark.interop


@pytest.fixture(scope="module")
def cache(gptq_cache):  # conftest.py's: shared with test_gptq_interop_limits.py
    return gptq_cache


@pytest.fixture(scope="module")
def stories(gptq_stories):
    return gptq_stories


@pytest.mark.parametrize("bits,sym,fmt,ao", MATRIX, ids=IDS)
def test_gptqmodel_loads_export(gptqmodel, cache, record_property, bits, sym, fmt, ao):
    path = cache.export(bits, sym, fmt, ao)
    logits, model = _gptqmodel_logits(gptqmodel, path, cache.ids)
    weights = _gptqmodel_weights(gptqmodel, model)
    assert len(weights) == 14
    _compare(cache, record_property, model, logits, cache.source(sym, bits, ao), bits, sym, weights)


@pytest.mark.parametrize("fmt", ["gptq_v1", "gptq_v2"])
def test_gptqmodel_loads_per_layer_mix(gptqmodel, cache, record_property, tmp_path, fmt):
    src = cache.source(True, None, True)
    names = list(read_checkpoint(src).layers)
    mix = {n: BITS[i % 4] for i, n in enumerate(names)}
    path = export_gptq(src, tmp_path / "mix", fmt, bits_config=mix)
    assert gptq_readers(path).fails[0].startswith("transformers + optimum (it ignores `dynamic`")
    logits, model = _gptqmodel_logits(gptqmodel, path, cache.ids)
    weights = _gptqmodel_weights(gptqmodel, model)
    assert {n: m.bits for n, m in model.named_modules() if n in weights} == mix
    _compare(cache, record_property, model, logits, src, mix, True, weights)


def test_gptqmodel_loads_a_mix_with_one_rule_per_fused_group(gptqmodel, cache, record_property, tmp_path):
    """A mix giving q/k/v and gate/up one width each is written with one `dynamic` rule per group, which also
    matches the name vLLM gives the fused layer (formats/gptq/writer.py dynamic_rules): GPTQModel still reads each
    layer's width from it, and computes what the source computes."""
    src = cache.source(True, None, True)
    ckpt = read_checkpoint(src)
    groups = fused_groups(ckpt.config, ckpt.layers)
    mix = {n: BITS[i % 4] for i, group in enumerate(groups) for n in group}
    path = export_gptq(src, tmp_path / "tied", "gptq_v2", bits_config=mix)
    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    rules, off = qc["dynamic"], {g for g in groups if len(g) > 1 and mix[g[0]] != qc["bits"]}
    assert off and len(rules) < sum(r != qc["bits"] for r in mix.values())  # one rule per group, not per layer
    for group in off:  # vLLM's name for the fused layer gets the group's width (first matching rule)
        fused = group[0].rpartition(".")[0] + (".qkv_proj" if "self_attn" in group[0] else ".gate_up_proj")
        assert next(v["bits"] for p, v in rules.items() if re.match(p.removeprefix("+:"), fused)) == mix[group[0]]
    logits, model = _gptqmodel_logits(gptqmodel, path, cache.ids)
    weights = _gptqmodel_weights(gptqmodel, model)
    assert {n: m.bits for n, m in model.named_modules() if n in weights} == mix
    _compare(cache, record_property, model, logits, src, mix, True, weights)


@pytest.mark.parametrize("bits,sym,fmt,ao", MATRIX, ids=IDS)
def test_transformers_optimum_loads_export(gptqmodel, cache, record_property, bits, sym, fmt, ao):
    require_peer("optimum")
    from transformers import AutoModelForCausalLM, GPTQConfig

    path = cache.export(bits, sym, fmt, ao)
    assert "transformers + optimum" in gptq_readers(path).runs  # what `matgptq export` prints of this file
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float16, device_map="cpu")
    with torch.no_grad():
        logits = model(cache.ids).logits.float()
    modules = _quant_modules(model)
    kernels = sorted({type(m).__name__ for m in modules.values()})
    record_property("kernel", ",".join(kernels))
    assert len(modules) == 14
    src = cache.source(sym, bits, ao)
    if "TorchAtenLinear" not in kernels:
        return _compare(cache, record_property, model, logits, src, bits, sym, _gptqmodel_weights(gptqmodel, model))
    _compare(cache, record_property, model, logits, src, bits, sym, {})  # int4pack: no dequantize_weight to compare
    # the same file through transformers with the generic torch kernel: weights compared bit for bit as well
    qc = GPTQConfig(bits=bits, backend=gptqmodel.BACKEND.GPTQ_TORCH.value)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float16, device_map="cpu", quantization_config=qc)
    with torch.no_grad():
        logits = model(cache.ids).logits.float()
    ref16, _ = cache.reference(src, bits, torch.float16)
    record_property("rel_diff_vs_fp16_torch_kernel", float((logits - ref16).abs().max()) / float(ref16.abs().max()))
    assert {type(m).__name__ for m in _quant_modules(model).values()} == {"TorchLinear"}
    _compare(cache, lambda *a: None, model, logits, src, bits, sym, _gptqmodel_weights(gptqmodel, model))


# ----------------------------------------------------------------------------------- GPTQModel's files, our reader

GM_CASES = [
    (4, True, "gptq", False),
    (3, False, "gptq_v2", True),
    (2, False, "gptq", False),
    (8, True, "gptq_v2", True),
]


@pytest.mark.parametrize("bits,sym,fmt,ao", GM_CASES, ids=_ids(GM_CASES))
def test_we_read_gptqmodel_checkpoints(gptqmodel, cache, record_property, tmp_path, bits, sym, fmt, ao):
    _check_we_read_gptqmodel(gptqmodel, cache, record_property, tmp_path / "gm", bits, sym, fmt, ao)


# ------------------------------------------------------------------------------- our packing == GPTQModel's packing


@pytest.mark.parametrize("sym", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("bits", BITS)
def test_packing_matches_gptqmodel_packer(gptqmodel, cache, bits, sym):
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.utils.model import convert_gptq_v2_to_v1_format_module

    ao = bits == 3
    src = cache.source(sym, bits, ao)
    exports = {
        f: load_file(str(cache.export(bits, sym, f, ao) / "model.safetensors"))
        for f in ("gptq_v1", "gptq_v2")
        if sym or f == "gptq_v2"
    }
    for name, q in read_checkpoint(src).layers.items():
        q = q.slice(bits)
        codes, scales, zeros = gptq_layer(name, q)
        n, k = q.shape
        linear = torch.nn.Linear(k, n, bias=False)
        linear.weight.data = q.dequantize()  # s·(q − z) is exact in fp32; GPTQModel recovers q = round(W/s + z)
        for pack in ("pack_block", "pack_original"):
            ql = TorchLinear(
                bits=bits,
                group_size=GROUP,
                sym=sym,
                desc_act=ao,
                in_features=k,
                out_features=n,
                bias=False,
                pack_dtype=torch.int32,
            )
            getattr(ql, pack)(linear, torch.from_numpy(scales).float(), torch.from_numpy(zeros).float(), q.g_idx)
            v2 = exports["gptq_v2"]
            assert np.array_equal(ql.qweight.numpy(), v2[f"{name}.qweight"].numpy()), (name, pack)
            assert np.array_equal(ql.qzeros.numpy(), v2[f"{name}.qzeros"].numpy()), (name, pack)
            assert torch.equal(ql.scales, v2[f"{name}.scales"]) and torch.equal(ql.g_idx.int(), v2[f"{name}.g_idx"])
            if sym:
                convert_gptq_v2_to_v1_format_module(ql, gptqmodel.QuantizeConfig(bits=bits, group_size=GROUP))
                assert np.array_equal(ql.qzeros.numpy(), exports["gptq_v1"][f"{name}.qzeros"].numpy()), (name, pack)


# ------------------------------------------------------------------ odd shapes: the real stories260K (MLP width 172)

STORIES_MATRIX = [(b, True, f, False) for b in (2, 4, 8) for f in ("gptq_v1", "gptq_v2")]
STORIES_LAYERS = 35  # 5 blocks × 7 projections


@pytest.mark.parametrize("bits,sym,fmt,ao", STORIES_MATRIX, ids=_ids(STORIES_MATRIX))
def test_gptqmodel_loads_padded_stories_export(gptqmodel, stories, record_property, bits, sym, fmt, ao):
    path = stories.export(bits, sym, fmt, ao)
    qweight = load_file(str(path / "model.safetensors"))["model.layers.0.mlp.down_proj.qweight"]
    assert qweight.shape == (-(-172 * bits // 32), 64)  # 22 rows for 172 inputs at 4 bits: padded, not refused
    logits, model = _gptqmodel_logits(gptqmodel, path, stories.ids)
    weights = _gptqmodel_weights(gptqmodel, model)
    assert len(weights) == STORIES_LAYERS
    _compare(stories, record_property, model, logits, stories.source(sym, bits, ao), bits, sym, weights)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_transformers_optimum_loads_padded_stories_export(gptqmodel, stories, record_property, bits):
    require_peer("optimum")
    from transformers import AutoModelForCausalLM, GPTQConfig

    path, src = stories.export(bits, True, "gptq_v1", False), stories.source(True, bits, False)
    readers = gptq_readers(path)  # what `matgptq export` prints of this file
    assert ("transformers + optimum" in readers.runs) == (bits != 4)
    if bits == 4:  # TorchAtenLinear (_convert_weight_to_int4pack_cpu) needs out_features % 16 == 0; 172 is not
        assert 'transformers + optimum with GPTQConfig(bits=4, backend="gptq_torch")' in readers.runs
        assert readers.fails[0].startswith("transformers' default 4-bit CPU kernel")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float16, device_map="cpu")
        assert "TorchAtenLinear" in {type(m).__name__ for m in _quant_modules(model).values()}
        with pytest.raises(RuntimeError, match="dividable by 16"), torch.no_grad():  # repacks on the first forward
            model(stories.ids)
        record_property("default_kernel", "rejects out_features 172 (TorchAtenLinear needs % 16)")
    # (quantization_config=None would load the model unquantized: pass the argument only when forcing the kernel)
    qc = {"quantization_config": GPTQConfig(bits=bits, backend=gptqmodel.BACKEND.GPTQ_TORCH.value)} if bits == 4 else {}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float16, device_map="cpu", **qc)
    with torch.no_grad():
        logits = model(stories.ids).logits.float()
    modules = _quant_modules(model)
    assert len(modules) == STORIES_LAYERS and {type(m).__name__ for m in modules.values()} == {"TorchLinear"}
    record_property("kernel", "TorchLinear" + (" (backend=gptq_torch)" if qc else ""))
    _compare(stories, record_property, model, logits, src, bits, True, _gptqmodel_weights(gptqmodel, model))


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_padded_stories_packing_matches_gptqmodel_packer(gptqmodel, stories, bits):
    """Our stories260K files, byte for byte, against GPTQModel's packer given the same codes: pack_block where it
    accepts the shape, else pack_original (GPTQModel's pack_module falls back the same way), v1 via its converter."""
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.utils.model import convert_gptq_v2_to_v1_format_module

    exports = {f: load_file(str(stories.export(bits, True, f, False) / "model.safetensors")) for f in FORMATS}
    padded = 0
    for name, q in read_checkpoint(stories.source(True, bits, False)).layers.items():
        q = q.slice(bits)
        _, scales, zeros = gptq_layer(name, q)
        n, k = q.shape
        linear = torch.nn.Linear(k, n, bias=False)
        linear.weight.data = q.dequantize()
        ql = TorchLinear(
            bits=bits,
            group_size=GROUP,
            sym=True,
            desc_act=False,
            in_features=k,
            out_features=n,
            bias=False,
            pack_dtype=torch.int32,
        )
        args = (linear, torch.from_numpy(scales).float(), torch.from_numpy(zeros).float(), q.g_idx)
        try:
            ql.pack_block(*args)
        except ValueError:
            ql.pack_original(*args)
        padded += (k * bits) % 32 != 0 or (n * bits) % 32 != 0
        assert np.array_equal(ql.qweight.numpy(), exports["gptq_v2"][f"{name}.qweight"].numpy()), name
        assert np.array_equal(ql.qzeros.numpy(), exports["gptq_v2"][f"{name}.qzeros"].numpy()), name
        convert_gptq_v2_to_v1_format_module(ql, gptqmodel.QuantizeConfig(bits=bits, group_size=GROUP))
        assert np.array_equal(ql.qzeros.numpy(), exports["gptq_v1"][f"{name}.qzeros"].numpy()), name
    assert padded == (15 if bits in (2, 4) else 0)  # gate/up/down_proj of 5 blocks


STORIES_GM_CASES = [(4, True, "gptq", False), (2, False, "gptq", False)]


@pytest.mark.parametrize("bits,sym,fmt,ao", STORIES_GM_CASES, ids=_ids(STORIES_GM_CASES))
def test_we_read_gptqmodel_padded_stories_checkpoints(
    gptqmodel, stories, record_property, tmp_path, bits, sym, fmt, ao
):
    ckpt = _check_we_read_gptqmodel(gptqmodel, stories, record_property, tmp_path / "gm", bits, sym, fmt, ao)
    theirs = load_file(str(tmp_path / "gm" / "model.safetensors"))
    assert theirs["model.layers.0.mlp.down_proj.qweight"].shape == (-(-172 * bits // 32), 64)  # GPTQModel pads too
    assert ckpt.layers["model.layers.0.mlp.gate_proj"].shape == (172, 64)
    if sym:  # re-exported by us in the same format: GPTQModel's quantized tensors, byte for byte (v1 borrows included)
        with pytest.warns(UserWarning, match="zero-padded"):
            out = export_gptq(tmp_path / "gm", tmp_path / "ours", {"gptq": "gptq_v1"}.get(fmt, fmt))
        ours = load_file(str(out / "model.safetensors"))
        keys = [k for k in theirs if k.endswith((".qweight", ".qzeros", ".scales", ".g_idx"))]
        assert len(keys) == 4 * STORIES_LAYERS and all(torch.equal(ours[k], theirs[k]) for k in keys)
