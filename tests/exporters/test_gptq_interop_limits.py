"""GPTQ exports read by the peers (GPTQModel 7.6.0, transformers + optimum, CPU), the edges of the checks in
test_gptq_interop.py, whose module docstring explains them: the negative control of the logits check, transformers'
default 4-bit CPU kernel refusing a ragged last group (the export's readers line says so), and GPTQModel reading
group scales of either sign (`--target gguf`) to our weights bit for bit.

Negative control: one zero point off by one, in one group of one layer, moves the logits by ~3e-2, far above float16
rounding (~1e-3), and fails the bit-exact logits check (test_zero_point_off_by_one_is_caught).
"""

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import matgptq
from matgptq.exporters.gptq import export_gptq
from matgptq.exporters.readers import gptq_readers
from tests.conftest import require_peer
from tests.exporters.gptq_interop_helpers import _compare, _gptqmodel_logits, _gptqmodel_weights

pytestmark = pytest.mark.interop


@pytest.fixture(scope="module")
def cache(gptq_cache):  # conftest.py's: shared with test_gptq_interop.py
    return gptq_cache


def test_zero_point_off_by_one_is_caught(gptqmodel, cache, record_property, tmp_path):
    """Negative control for the logits check: one zero point off by one (one output row, one group, one layer) in an
    otherwise identical export must fail it, and moves the logits far above float16 rounding (~1e-3)."""
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear

    src, path = cache.source(True, 4, False), cache.export(4, True, "gptq_v2", False)
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    tensors = load_file(str(bad / "model.safetensors"))
    qzeros = tensors["model.layers.0.self_attn.q_proj.qzeros"]
    assert (qzeros[0, 0] & 0xF) == 8  # v2, symmetric 4-bit: the zero point 2^(b-1) of output row 0, group 0
    qzeros[0, 0] ^= 1  # 8 → 9
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    logits, model = _gptqmodel_logits(gptqmodel, bad, cache.ids)
    with pytest.raises(AssertionError, match="logits differ") as err:
        _compare(cache, record_property, model, logits, src, 4, True, {})  # the weight check would fail first
    ref = cache.peer_reference(src, 4, TorchLinear, True)
    d = float((logits - ref).abs().max()) / float(ref.abs().max())
    record_property("off_by_one_rel_diff", d)
    assert d > 4 * 2**-11, err.value  # several float16 ulps of the largest logit, not a rounding tie


def test_transformers_default_kernel_needs_whole_groups(gptqmodel, tmp_path):
    """in_features 96 with group size 64 (a ragged last group, like SmolLM2's 576 columns at g128) and every
    out_features a multiple of 16: transformers' default 4-bit CPU kernel refuses it on the first forward, the torch
    kernel runs it with our weights bit for bit, and the export's readers line says exactly that."""
    require_peer("optimum")
    from transformers import AutoModelForCausalLM, GPTQConfig

    from tests.conftest import make_tiny_llama, quick_quantize

    model_dir = make_tiny_llama(tmp_path / "m96", hidden=96, intermediate=192, heads=4, kv_heads=2)
    src = quick_quantize(model_dir, tmp_path / "q", bits=4, group_size=64)
    path = export_gptq(src, tmp_path / "g", "gptq_v1")
    readers = gptq_readers(path)
    assert (
        readers.fails[0].startswith("transformers' default 4-bit CPU kernel")
        and "96, group size 64" in readers.fails[0]
    )
    assert readers.untested[0].startswith("vLLM (expected to refuse it")  # Marlin: whole groups only (not run here)
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float16, device_map="cpu")
    with pytest.raises(RuntimeError, match="divisible by qGroupSize"), torch.no_grad():
        model(ids)
    qc = GPTQConfig(bits=4, backend=gptqmodel.BACKEND.GPTQ_TORCH.value)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float16, device_map="cpu", quantization_config=qc)
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()
    ours = matgptq.load(src, dtype=torch.float16, packed=False)
    for name, w in _gptqmodel_weights(gptqmodel, model).items():
        assert torch.equal(w.to(torch.float16), ours.get_submodule(name).weight), name


@pytest.mark.parametrize("fmt", ["gptq_v1", "gptq_v2"])
def test_gptqmodel_reads_signed_scales(gptqmodel, tiny_llama_dir, tmp_path, fmt):
    """A `--target gguf` checkpoint (llama.cpp's grid: group scales of either sign) exported as GPTQ: GPTQModel's
    torch kernel dequantizes scale · (q − z) with the stored fp16 scale, negative or not, to our weights bit for bit."""
    from tests.conftest import quick_quantize

    src = quick_quantize(tiny_llama_dir, tmp_path / "q", bits=4, target="gguf")
    assert bool((matgptq.load(src).matgptq.layers["model.layers.0.mlp.up_proj"].scales < 0).any())
    path = export_gptq(src, tmp_path / fmt, fmt)
    logits, model = _gptqmodel_logits(gptqmodel, path, torch.randint(0, 256, (1, 12)))
    assert torch.isfinite(logits).all()
    ours = matgptq.load(src, dtype=torch.float16, packed=False)
    weights = _gptqmodel_weights(gptqmodel, model)
    assert len(weights) == 14
    for name, w in weights.items():
        assert torch.equal(w.to(torch.float16), ours.get_submodule(name).weight), name
