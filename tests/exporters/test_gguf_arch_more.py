"""GGUF for OLMo 2, Granite, Gemma 2 and Gemma 3 (formats/gguf/arch.py, metadata_arch.py), on tiny random models,
against the same two oracles as test_gguf_arch.py (its converter run and tolerances, reused here):
- llama.cpp's converter writes the same F32 file: model metadata, tensor names, types and bit-identical data (Gemma's
  norms stored as 1 + w, Granite's Q/K RoPE permutation, OLMo 2's post-norms and full-width q/k norms).
- llama.cpp runs our files: F32 logits equal transformers' (≤ 1e-4, float summation order with an F32 KV cache, as
  test_gguf_interop.py derives), and a 4-bit export (Q4_0, bit-exact) equals matgptq.load with llama.cpp's Q8_0
  activation quantization emulated (median over positions ≤ 1e-4), the 3-bit slice as negative control.
The configs make every special feature visible in the logits: Granite's four multipliers are not 1, the Gemma models
have a sliding window (16) shorter than the 64 test tokens and query_pre_attn_scalar = head_dim (llama.cpp's scale);
Gemma 2 keeps its default soft-capping (50 / 30) and Gemma 3 its two RoPE bases (10^4 sliding, 10^6 full).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import STORIES, quick_quantize, require_peer
from tests.exporters.gguf_converter import assert_same_file_as_converter
from tests.exporters.test_gguf_interop import F32_KV, TOKENS, cpp_logits, hf_logits, model_logits, per_position

pytestmark = pytest.mark.interop
gguf = pytest.importorskip("gguf")

from matgptq.errors import UserError  # noqa: E402
from matgptq.exporters.gguf import export_gguf  # noqa: E402
from matgptq.exporters.readers import gguf_readers  # noqa: E402
from matgptq.formats.gguf import read_gguf_weights  # noqa: E402

# The parent options (and float32 calibration) before issue #102 changed the defaults. With today's defaults (the
# scale search, λ_8 = 4, bfloat16 passes on a CPU with bfloat16 arithmetic)
# llama.cpp's logits on these random models leave our Q8_0-activation emulation at many positions (median 0.009 for
# llama), while the weights stay bit-identical: not yet explained, so the comparison keeps the codes it was derived on.
CODES = {"act_order": False, "group_act_order": True, "mse": False, "bit_weights": (1, 16), "dtype": "float32"}
ARCHS = ("olmo2", "granite", "gemma2", "gemma3_text")
COMMON = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
EXTRA = {
    "olmo2": dict(tie_word_embeddings=False),
    "granite": dict(
        tie_word_embeddings=False,
        attention_multiplier=0.2,
        embedding_multiplier=3.0,
        residual_multiplier=0.5,
        logits_scaling=4.0,
    ),
    "gemma2": dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=16),
    "gemma3_text": dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=16),
}


# Gemma 2 only: its attention soft-capping (tanh, 1 ulp apart from torch's) moves a few GELU inputs across an fp16
# boundary of ggml's table, and its full-attention layer carries each such change to every later position (F32: median
# 5e-5, 1e-5 with the soft-cap off); in the 4-bit file those changes flip Q8_0 activation roundings at most positions
# (measured: 30% of positions within 2e-6, the others 2e-2..6e-2, median 0.025). The tolerance stays under the two
# wrong readings: the 4-bit slice without the Q8_0 emulation (median 0.13) and the 3-bit slice (median 3.6).
QUANT_TOL = {"gemma2": 0.05}


def make_model(kind: str, path: Path, **overrides) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(kind, **{**COMMON, **EXTRA[kind], **overrides})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.mul_(5)  # as make_tiny_llama: quantization error visible, model still sane
            else:  # RMSNorm weights (Gemma's: the w of 1 + w), random so that each one shows in the logits
                p.copy_(1 + 0.3 * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(STORIES / name, path / name)
    return path


class GgmlGelu(torch.nn.Module):
    """ggml's CPU GELU (ggml_vec_gelu_f32 with GGML_GELU_FP16): x rounded to fp16, looked up in a table of
    fp16(gelu_tanh(x)); x ≤ −10 → 0, x ≥ 10 → x."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.gelu(x.half().float(), approximate="tanh").half().float()
        return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, y))


def ref_logits(kind: str, src: Path, bits=None, emulate: Path | None = None, gelu: bool = True) -> np.ndarray:
    """hf_logits, with the Gemma MLPs' GELU computed as llama.cpp's CPU backend does (gelu=True)."""
    if not kind.startswith("gemma"):
        return hf_logits(src, TOKENS, bits, emulate)
    model = __import__("matgptq").load(src, bits=bits, dtype=torch.float32)
    for mod in model.modules():
        if gelu and hasattr(mod, "act_fn"):
            mod.act_fn = GgmlGelu()
    return model_logits(model, TOKENS, emulate)


# metadata variants, checked against the converter only: Gemma 3's linear RoPE scaling of its full-attention layers
VARIANTS = {
    "gemma3_text-linear": (
        "gemma3_text",
        dict(
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            }
        ),
    )
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf_arch_more")
    out = {kind: make_model(kind, root / kind / "model") for kind in ARCHS}
    for name, (kind, overrides) in VARIANTS.items():
        out[name] = make_model(kind, root / name / "model", **overrides)
    return out


@pytest.mark.parametrize("kind", ARCHS + tuple(VARIANTS))
def test_same_file_as_llamacpp_converter(converter, models, tmp_path, kind):
    assert_same_file_as_converter(gguf, converter, models[kind], tmp_path)


@pytest.mark.parametrize("kind", ARCHS)
def test_llamacpp_runs_each_architecture(models, tmp_path, kind):
    require_peer("llama_cpp")
    f32 = tmp_path / "f32.gguf"
    export_gguf(models[kind], f32)
    cpp = cpp_logits(f32, TOKENS, **F32_KV)
    got = per_position(cpp, ref_logits(kind, models[kind]))
    if kind.startswith("gemma"):
        # ggml's fp16 GELU table, emulated: the median position as close as the other architectures' worst one; a
        # GELU input on the other side of an fp16 rounding boundary (summation order) moves a few positions by one
        # fp16 ulp of an activation (measured: max 9e-4 for gemma2, 3e-4 for gemma3, median 5e-5 / 1e-5), as
        # llama.cpp's Q8_0 activations do in the quantized comparisons below.
        assert np.median(got) <= 1e-4
        # and the table is the cause: with transformers' float32 GELU, the median is ~1.6e-3 for both
        assert np.median(per_position(cpp, ref_logits(kind, models[kind], gelu=False))) >= 5e-4
    else:
        assert got.max() <= 1e-4

    parent = quick_quantize(models[kind], tmp_path / "q", method="matgptq", bits="4,8", group_size=32, **CODES)
    q4 = tmp_path / "q4.gguf"
    rep = export_gguf(parent, q4, bits=4)
    assert {t.ggml_type for t in rep.tensors if t.bits is not None} == {"Q4_0"} and rep.exact
    assert "llama.cpp (llama-cpp-python 0.3.36)" in gguf_readers(q4).runs
    weights = read_gguf_weights(q4)  # gguf-py's reading (permutation and Gemma's 1 + w undone): matgptq's weights
    model = __import__("matgptq").load(parent, bits=4, dtype=torch.float32)
    for name, w in weights.items():
        mine = model.get_submodule(name.removesuffix(".weight")).weight.detach().numpy()
        if "norm" not in name:
            np.testing.assert_array_equal(w, mine, name)
        else:  # (1 + w) − 1 loses w's low bits: within one ulp of 1 + w (< 4 here: w = 1 + 0.3·N(0, 1))
            np.testing.assert_allclose(w, mine, rtol=0, atol=np.spacing(np.float32(4)), err_msg=name)
    got = cpp_logits(q4, TOKENS, **F32_KV)
    assert np.median(per_position(got, ref_logits(kind, parent, 4, emulate=q4))) <= QUANT_TOL.get(kind, 1e-4)
    assert np.median(per_position(got, ref_logits(kind, parent, 3, emulate=q4))) >= 0.05  # negative control


@pytest.mark.parametrize(
    "kind, overrides, match",
    [
        ("gemma2", dict(query_pre_attn_scalar=256), "query_pre_attn_scalar"),
        ("gemma2", dict(tie_word_embeddings=False), "lm_head"),
        ("gemma3_text", dict(layer_types=["full_attention", "sliding_attention"]), "layer_types"),
        ("granite", dict(head_dim=8), "head_dim"),
    ],
)
def test_refuses_what_llamacpp_would_compute_differently(tmp_path, kind, overrides, match):
    src = make_model(kind, tmp_path / "model", **overrides)
    with pytest.raises(UserError, match=match):
        export_gguf(src, tmp_path / "out.gguf")
