"""Q6_K for float tensors (formats/gguf/quantize.py) against llama.cpp's own quantizer (llama_model_quantize of
llama-cpp-python, the reference C code): the same bytes, tensor by tensor; gguf-py reads them back."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tests.conftest import make_tiny_llama, require_peer

gguf = pytest.importorskip("gguf")

from matgptq.exporters.gguf import export_gguf  # noqa: E402
from matgptq.formats.gguf.quantize import quantize_q6_k  # noqa: E402


def test_special_blocks_read_back():
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((4, 512)) * 0.05).astype(np.float32)
    w[1, :256] = 0  # an all-zero super-block
    w[2, 16:32] = 0  # an all-zero sub-block
    w[3, 7] = 40.0  # one outlier: the other sub-blocks get small integer scales
    back = gguf.quants.dequantize(quantize_q6_k(w), gguf.GGMLQuantizationType.Q6_K).reshape(w.shape)
    assert not back[1, :256].any() and not back[2, 16:32].any()
    # a 6-bit grid per 16 weights, its scale rounded to int8 steps of the super-block's: ≤ ~1/30 of a block's range
    err = np.abs(back - w).reshape(4, -1, 16).max(-1) / np.abs(w).reshape(4, -1, 16).max(-1).clip(1e-12)
    assert err[0].max() < 0.05 and back[3, 7] == pytest.approx(40.0, rel=0.02)
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize_q6_k(np.zeros((2, 100), np.float32))


def test_same_bytes_as_llamacpp_quantizer(tmp_path):
    llama_cpp = require_peer("llama_cpp")
    model = make_tiny_llama(tmp_path / "k256", hidden=256, intermediate=512, heads=4, kv_heads=2, layers=1)
    f32, q6 = tmp_path / "f32.gguf", tmp_path / "q6.gguf"
    export_gguf(model, f32)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = 18  # LLAMA_FTYPE_MOSTLY_Q6_K: every matrix to Q6_K by quantize_row_q6_K_ref (no imatrix)
    assert llama_cpp.llama_model_quantize(str(f32).encode(), str(q6).encode(), ctypes.byref(params)) == 0
    floats = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(f32)).tensors}
    checked = 0
    for t in gguf.GGUFReader(str(q6)).tensors:
        if t.tensor_type == gguf.GGMLQuantizationType.Q6_K:
            ours = quantize_q6_k(floats[t.name])
            np.testing.assert_array_equal(ours, np.asarray(t.data).reshape(ours.shape), err_msg=t.name)
            checked += 1
    assert checked == 9  # token_embd, output and the 7 block matrices
