"""GPTQ exports of fused mixture-of-experts checkpoints (formats/gptq/experts.py) read by GPTQModel 7.6.0 on the CPU:
qwen3_moe, mixtral and gpt_oss, each as a plain GPTQ 4-bit asymmetric v2 export, a 4-bit slice of a MatGPTQ act-order
parent as v1, and a per-layer mix of that parent (per-expert `dynamic` overrides) as v2. At the end: the dense
gemma2, gemma3_text, olmo2 and granite, which have no architecture table of their own, read bit-exactly.

Run with the peer installed, e.g.  GPTQMODEL_CPU_WORKERS=2 python -m pytest tests/exporters/test_gptq_moe_interop.py
(a missing peer skips, or fails under MATGPTQ_REQUIRE_PEERS=1). GPTQModel runs in one child process per model type
(gptq_moe_helpers.gptqmodel_runs: its Defuser replaces transformers' MoE block classes for the rest of a process).

GPTQModel loads these models through Defuser, which gives each expert plain Linears (gate_proj, up_proj, down_proj)
and its own routing loop, while our reference (matgptq.load of the source, float16) runs transformers' fused experts
module. What is asserted:
  * the modules: GPTQModel quantizes exactly the layers the export names (every expert's gate_proj, up_proj and
    down_proj, the attention projections), each at its width (the mix: the `dynamic` override of its name);
  * weights and biases: every quantized layer GPTQModel dequantizes equals, bit for bit in float16, the rows of our
    weight that transformers' forward uses for it (gptq_moe_helpers.gptq_weight: gate = first half of gate_up's rows);
  * logits: within TOL of ours. Not bit-identical, and no peer-kernel reference can make them so: the experts are
    computed by different code (per-expert Linears and Defuser's routing loop vs transformers' fused gate_up matmul
    and index_add), i.e. the same float16 products summed in another order and rounded at other points.
TOL, relative to the largest |logit| of the reference: float16 rounds each result to u = 2^-11 relative; a different
summation or rounding order moves a float16 logit by a few u of the largest logit after two tiny blocks (measured on
this machine's CPU: 5.9e-4..1.7e-3 relative, 1.2u..3.5u, over the 9 cases). TOL = 16u = 7.8e-3 leaves 4× room for
other CPUs' GEMM paths and is still two orders of magnitude below what one wrong row block does: the negative
control (each expert's gate and up rows written under each other's names) moved the logits by 120%..148% of the
largest logit; asserted: more than 10·TOL.
"""

import re

import pytest
import torch

import matgptq
from matgptq.exporters.gptq import export_gptq
from matgptq.formats.gptq import experts as gptq_experts
from matgptq.formats.gptq.experts import gptq_widths
from tests.exporters.gptq_interop_helpers import Cache, _compare, _gptqmodel_logits, _gptqmodel_weights
from tests.exporters.gptq_moe_helpers import MoECache, gptq_bias, gptq_weight, gptqmodel_runs
from tests.models.test_arch import FOUND, tiny_dir

pytestmark = pytest.mark.interop

TOL = 16 * 2.0**-11  # relative to max |logit| (module docstring)
TYPES = ["qwen3_moe", "mixtral", "gpt_oss"]
CASES = {  # case -> (source kind, format, width spec: an int or "mix")
    "gptq4-asym-v2": ("gptq4", "gptq_v2", 4),
    "slice4-act_order-v1": ("parent", "gptq_v1", 4),
    "mix-v2": ("parent", "gptq_v2", "mix"),
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return MoECache(tmp_path_factory.mktemp("gptq_moe_interop"))


@pytest.fixture(scope="module")
def peer(gptqmodel, cache, tmp_path_factory):
    """model type -> {case: (source, width spec, GPTQModel's results)}: every case of the type and the negative
    control ("swapped") exported, then read by one GPTQModel child process (gptq_moe_helpers.gptqmodel_runs)."""
    runs = {}

    def run(model_type):
        if model_type not in runs:
            base = tmp_path_factory.mktemp(f"peer-{model_type}")
            exports = {case: _export(cache, base, model_type, case) for case in CASES}
            exports["swapped"] = _swapped_export(cache, base, model_type)
            results = gptqmodel_runs([out for _, _, out in exports.values()], cache.ids, base)
            runs[model_type] = {case: (src, bits, results[str(out)]) for case, (src, bits, out) in exports.items()}
        return runs[model_type]

    return run


def _export(cache, base, model_type, case):
    kind, fmt, spec = CASES[case]
    src = cache.source(model_type, kind)
    bits = cache.mix(model_type) if spec == "mix" else spec
    out = export_gptq(src, base / case, fmt, **({"bits_config": bits} if spec == "mix" else {"bits": bits}))
    return src, bits, out


def _swapped_export(cache, base, model_type):
    """The negative control of TOL: the 4-bit export with each expert's gate and up rows written under each other's
    name (still a loadable file)."""
    src = cache.source(model_type, "gptq4")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(gptq_experts.SPLIT, "gate_up_proj", ("up_proj", "gate_proj"))
        return src, 4, export_gptq(src, base / "swapped", "gptq_v2", bits=4)


def _reference(cache, src, bits):
    model = matgptq.load(src, bits=bits, dtype=torch.float16)
    with torch.no_grad():
        return model(cache.ids).logits.float(), model


def _rel(logits, ref) -> float:
    return float((logits - ref).abs().max()) / float(ref.abs().max())


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("model_type", TYPES)
def test_gptqmodel_loads_moe_export(peer, cache, record_property, model_type, case):
    src, bits, result = peer(model_type)[case]
    ref, ours = _reference(cache, src, bits)
    widths = gptq_widths(ours.matgptq.bits)
    layers = result["layers"]
    assert {n: b for n, (b, _, _) in layers.items()} == widths
    assert sum(1 for n in widths if re.search(r"\.experts\.\d+\.(gate|up|down)_proj$", n)) == 2 * 4 * 3
    for name, (_, weight, bias) in layers.items():
        assert torch.equal(weight.to(torch.float16), gptq_weight(ours, name)), name
        expected = gptq_bias(ours, name)
        assert (bias is None) == (expected is None), name
        if bias is not None:
            assert torch.equal(bias.to(torch.float16), expected), name
    d = _rel(result["logits"], ref)
    record_property("rel_diff_vs_fp16", d)
    assert d <= TOL, f"GPTQModel's logits differ from ours by {d:.2e} of the largest logit (TOL {TOL:.2e})"


@pytest.mark.parametrize("model_type", TYPES)
def test_swapped_gate_and_up_halves_are_caught(peer, cache, record_property, model_type):
    src, bits, result = peer(model_type)["swapped"]
    d = _rel(result["logits"], _reference(cache, src, bits)[0])
    record_property("rel_diff_vs_fp16", d)
    assert d > 10 * TOL, f"swapping gate and up moved the logits by only {d:.2e}"


# --- dense architectures without a table of their own (tests/models/test_arch.py's FOUND) -----------------------------
# Loaded in this process, as test_gptq_interop.py does for Llama (Defuser has no patch for these types), and held to
# test_gptq_interop.py's bit-exact standard: weights equal ours in float16, logits torch.equal to our model with each
# quantized Linear run by GPTQModel's own kernel on our data (gptq_interop_helpers._compare).


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    caches = {}

    def get(model_type):
        if model_type not in caches:
            base = tmp_path_factory.mktemp(f"dense-{model_type}")
            model = tiny_dir(base / "fp", model_type, **FOUND[model_type])
            caches[model_type] = Cache(model, base, widths=(4, 8), nsamples=4)
        return caches[model_type]

    return get


@pytest.mark.parametrize("model_type", sorted(FOUND))
def test_gptqmodel_loads_dense_export(gptqmodel, dense, record_property, model_type):
    cache = dense(model_type)
    path = cache.export(4, True, "gptq_v1", True)  # a 4-bit slice of an act-order MatGPTQ parent
    logits, model = _gptqmodel_logits(gptqmodel, path, cache.ids)
    weights = _gptqmodel_weights(gptqmodel, model)
    assert len(weights) == 2 * 7
    _compare(cache, record_property, model, logits, cache.source(True, 4, True), 4, True, weights)
