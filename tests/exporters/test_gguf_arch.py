"""GGUF for every architecture formats/gguf/arch.py maps (Llama, Mistral, Qwen2, Qwen3, Phi-3), on tiny random models.

Two independent oracles:
- llama.cpp's own converter (convert_hf_to_gguf.py of the pinned llama-cpp-python source, which `make interop`
  unpacks into the venv): its F32 file and ours have the same model metadata, the same tensor names and types and
  bit-identical tensor data. The converter runs in its own process with its own gguf-py; its vocabulary step is
  skipped (the tokenizer is tested in test_gguf_vocab.py; these models borrow stories260K's).
- llama.cpp itself (llama-cpp-python) runs our files: F32 logits equal transformers' (tolerance of
  test_gguf_interop.py: float summation order, ≤ 1e-4 with an F32 KV cache), and a GPTQ 4-bit export (Q4_0, bit-exact)
  equals matgptq.load once llama.cpp's Q8_0 activation quantization is emulated (median over positions ≤ 1e-4, as
  there), with the next narrower width as negative control.
The models have random norms, biases and q/k-norm weights (not HF's ones/zeros init), so each is visible in the logits.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import STORIES, quick_quantize, require_peer
from tests.exporters.gguf_converter import assert_same_file_as_converter
from tests.exporters.test_gguf_interop import F32_KV, TOKENS, cpp_logits, hf_logits, per_position

pytestmark = pytest.mark.interop
gguf = pytest.importorskip("gguf")

from matgptq.exporters.gguf import export_gguf  # noqa: E402
from matgptq.exporters.readers import gguf_readers  # noqa: E402
from matgptq.formats.gguf import read_gguf_weights  # noqa: E402

# The parent options (and float32 calibration) before issue #102 changed the defaults. With today's defaults (the
# scale search, λ_8 = 4, bfloat16 passes on a CPU with bfloat16 arithmetic)
# llama.cpp's logits on these random models leave our Q8_0-activation emulation at many positions (median 0.009 for
# llama), while the weights stay bit-identical: not yet explained, so the comparison keeps the codes it was derived on.
CODES = {"act_order": False, "group_act_order": True, "mse": False, "bit_weights": (1, 16), "dtype": "float32"}
ARCHS = ("llama", "mistral", "qwen2", "qwen3", "phi3")
ROPE_SCALING = ("qwen2-yarn", "phi3-longrope")  # metadata and RoPE-factor tensors, checked against the converter


def make_model(kind: str, path: Path) -> Path:
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Phi3Config, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0}
    longrope = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "original_max_position_embeddings": 64,
        "long_factor": [1.0 + i / 4 for i in range(8)],
        "short_factor": [1.0 + i / 16 for i in range(8)],
    }
    config = {
        "llama": lambda: LlamaConfig(**common),
        "mistral": lambda: MistralConfig(**common),
        "qwen2": lambda: Qwen2Config(**common),
        "qwen3": lambda: Qwen3Config(**common, head_dim=16),
        "phi3": lambda: Phi3Config(**common, pad_token_id=0),
        "qwen2-yarn": lambda: Qwen2Config(**common, rope_parameters=yarn),
        "phi3-longrope": lambda: Phi3Config(
            **common, pad_token_id=0, rope_parameters=longrope, original_max_position_embeddings=64
        ),
    }[kind]()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.mul_(5)  # as make_tiny_llama: quantization error visible, model still sane
            elif name.endswith("bias"):
                p.copy_(0.5 * torch.randn_like(p))
            else:  # RMSNorm weights (incl. Qwen3's per-head q/k norms)
                p.copy_(1 + 0.3 * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(STORIES / name, path / name)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf_arch")
    # not named after the architecture: llama.cpp gives the tokens of Phi-3's vocabulary special attributes when
    # general.name (the directory's name) contains "phi3", and the borrowed vocabulary has no <|endoftext|>
    return {kind: make_model(kind, root / kind / "model") for kind in ARCHS + ROPE_SCALING}


@pytest.mark.parametrize("kind", ARCHS + ROPE_SCALING)
def test_same_file_as_llamacpp_converter(converter, models, tmp_path, kind):
    assert_same_file_as_converter(gguf, converter, models[kind], tmp_path)


@pytest.mark.parametrize("kind", ARCHS)
def test_llamacpp_runs_each_architecture(models, tmp_path, kind):
    require_peer("llama_cpp")
    f32 = tmp_path / "f32.gguf"
    export_gguf(models[kind], f32)
    ref = hf_logits(models[kind], TOKENS)
    assert per_position(cpp_logits(f32, TOKENS, **F32_KV), ref).max() <= 1e-4

    parent = quick_quantize(models[kind], tmp_path / "q", method="matgptq", bits="4,8", group_size=32, **CODES)
    q4 = tmp_path / "q4.gguf"
    rep = export_gguf(parent, q4, bits=4)
    assert {t.ggml_type for t in rep.tensors if t.bits is not None} == {"Q4_0"} and rep.exact
    readers = gguf_readers(
        q4
    )  # what the export prints: llama.cpp runs it (asserted below), transformers tested on llama
    assert "llama.cpp (llama-cpp-python 0.3.36)" in readers.runs
    # (a Mistral model is written as a `llama`-architecture GGUF, as llama.cpp's converter writes it)
    assert ("transformers' GGUF reader (dequantized to float)" in readers.runs) == (kind in ("llama", "mistral"))
    weights = read_gguf_weights(q4)  # gguf-py's reading, Llama's permutation undone: matgptq's weights exactly
    model = __import__("matgptq").load(parent, bits=4, dtype=torch.float32)
    for name, w in weights.items():
        if name.endswith(".weight") and "norm" not in name:
            np.testing.assert_array_equal(
                w, model.get_submodule(name.removesuffix(".weight")).weight.detach().numpy(), name
            )
    got = cpp_logits(q4, TOKENS, **F32_KV)
    assert np.median(per_position(got, hf_logits(parent, TOKENS, 4, emulate=q4))) <= 1e-4
    assert np.median(per_position(got, hf_logits(parent, TOKENS, 3, emulate=q4))) >= 0.05  # negative control
