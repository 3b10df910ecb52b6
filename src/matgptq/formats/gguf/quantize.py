"""llama.cpp's reference quantizer for float tensors that GPTQ does not touch (token embeddings, output head) in
the K-quant type its presets use there: Q6_K (gguf-py has no K-quant quantizer). The legacy types (Q8_0, Q4_0, ...)
come from gguf-py's own `quants.quantize`.

`quantize_q6_k` is ggml-quants.c `quantize_row_q6_K_ref` (llama-cpp-python's vendored llama.cpp, the version:
LLAMA_CPP_PYTHON in exporters/tested.py), vectorised over sub-blocks with the same float32 operations in the same
order:

    per 16 weights: scale = make_qx_quants(16, nmax = 32, x, rmse_type = 1): iscale = −32/max (max = the weight of
        largest |x|), l = clamp(nearest_int(iscale·x), −32, 31), weights w = x², scale = Σwxl / Σwl²; then the 18
        iscales −(32 + 0.1·is)/max, is = ±1..±9, each kept if (Σwxl)² > best·Σwl² (best = scale·Σwxl);
    per 256: iscale = −128/max_scale (the sub-scale of largest |·|), d = fp16(1/iscale),
        sc_k = min(127, nearest_int(iscale·scale_k)); l = clamp(nearest_int(x / (d·sc_k)), −32, 31) + 32.

nearest_int rounds half to even (the 1.5·2²³ trick), as numpy's rint does in float32. A C compiler may contract
`sumlx += w*x*l` into an FMA; then rare near-ties in the 19-way scale choice can go the other way — the result is a
valid Q6_K block with the same error statistics, not necessarily the same bytes (tests compare errors with
llama.cpp's quantizer, not bytes).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .blocks import QK_K, pack_q6_k

GROUP_MAX_EPS = np.float32(1e-15)  # ggml-quants.c


def _sums(x: NDArray[np.float32], iscale: NDArray[np.float32], nmax: int):
    """l, Σ w·x·l and Σ w·l² (w = x²) per row of x [n, 16], accumulated in float32 left to right as the C loop."""
    lv = np.clip(np.rint(iscale[:, None] * x), -nmax, nmax - 1).astype(np.float32)
    w = x * x
    sumlx = np.zeros(x.shape[0], np.float32)
    suml2 = np.zeros(x.shape[0], np.float32)
    for i in range(x.shape[1]):
        sumlx = sumlx + w[:, i] * x[:, i] * lv[:, i]
        suml2 = suml2 + w[:, i] * lv[:, i] * lv[:, i]
    return lv, sumlx, suml2


def _make_qx_quants(x: NDArray[np.float32], nmax: int) -> NDArray[np.float32]:
    """make_qx_quants(16, nmax, x, L, rmse_type = 1, NULL) for every row of x [n, 16]: the scale (L is recomputed by
    the caller, as quantize_row_q6_K_ref does)."""
    idx = np.abs(x).argmax(axis=1)  # first index of the largest |x|, as the C loop's strict '>'
    mx = x[np.arange(x.shape[0]), idx]
    zero = np.abs(mx) < GROUP_MAX_EPS
    mx_safe = np.where(zero, np.float32(1), mx)
    iscale = (np.float32(-nmax) / mx_safe).astype(np.float32)
    _, sumlx, suml2 = _sums(x, iscale, nmax)
    scale = np.where(suml2 != 0, sumlx / np.where(suml2 != 0, suml2, 1), 0).astype(np.float32)
    best = (scale * sumlx).astype(np.float32)
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = (-(np.float32(nmax) + np.float32(0.1) * np.float32(step)) / mx_safe).astype(np.float32)
        _, sumlx, suml2 = _sums(x, iscale, nmax)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        new_scale = (sumlx / np.where(suml2 > 0, suml2, 1)).astype(np.float32)
        scale = np.where(better, new_scale, scale)
        best = np.where(better, (new_scale * sumlx).astype(np.float32), best)
    return np.where(zero, np.float32(0), scale)


def quantize_q6_k(w: NDArray) -> NDArray[np.uint8]:
    """Q6_K bytes [rows, K / 256 · 210] of a float matrix [rows, K] (K a multiple of 256)."""
    x = np.ascontiguousarray(w, dtype=np.float32)
    rows, k = x.shape
    if k % QK_K:
        raise ValueError(f"Q6_K needs rows of a multiple of {QK_K} weights, got {k}")
    sub = x.reshape(-1, 16)
    scales = _make_qx_quants(sub, 32).reshape(rows, k // QK_K, 16)
    abs_scales = np.abs(scales)
    pick = abs_scales.argmax(axis=-1)
    max_scale = np.take_along_axis(scales, pick[..., None], axis=-1)[..., 0]
    empty = np.abs(max_scale) < GROUP_MAX_EPS
    iscale = np.where(empty, np.float32(0), np.float32(-128) / np.where(empty, np.float32(1), max_scale))
    iscale = iscale.astype(np.float32)
    d = np.where(empty, 0, (np.float32(1) / np.where(empty, np.float32(1), iscale))).astype(np.float16)
    sc = np.minimum(127, np.rint(iscale[..., None] * scales)).astype(np.int32)
    sc = np.where(empty[..., None], 0, sc)
    dk = (d.astype(np.float32)[..., None] * sc.astype(np.float32)).astype(np.float32)  # [rows, nb, 16]
    xs = x.reshape(rows, k // QK_K, 16, 16)
    safe = np.where(dk == 0, np.float32(1), dk)[..., None]
    lv = np.clip(np.rint(xs / safe), -32, 31) + 32
    # where d·sc = 0 the C code keeps make_qx_quants' L (and an all-zero super-block is zeroed): those weights
    # dequantize to 0 whatever the code, so the zero code 32 is written — the same tensor, not the same bytes
    lv = np.where((dk == 0)[..., None], 32, lv)
    return pack_q6_k(lv.reshape(rows, k).astype(np.uint8), sc.reshape(rows, -1), d)
