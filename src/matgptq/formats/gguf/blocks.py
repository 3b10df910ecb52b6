"""GGUF quantized-block encoders that keep GPTQ integer codes (no re-quantization).

Every encoder returns a uint8 array ``[rows, n_blocks * block_bytes]`` (rows = output
features, blocks run along the row, i.e. along K), ready for
``GGUFWriter.add_tensor(name, arr, raw_dtype=GGMLQuantizationType.X)``. Byte layouts follow
docs/formats.md §3.4-3.5, i.e. ggml's ``ggml-common.h`` structs (struct order = byte order) with the
element order of ``ggml-quants.c`` / gguf-py ``quants.py``. All multi-byte fields are
little-endian; ``d``, ``m``, ``dmin`` are fp16; ``e`` is the element index in the block.

Legacy blocks, 32 elements (exact: codes and fp16 parameters are stored as given):

- Q4_0 (18 B): ``d | qs[16]``; ``qs[j] = q[j] | q[j+16] << 4`` (NOT pairs 2j, 2j+1).
- Q4_1 (20 B): ``d | m | qs[16]``, nibbles as Q4_0.
- Q5_0 (22 B): ``d | qh[4] | qs[16]``; low 4 bits as Q4_0; ``qh`` = LE uint32, bit e = bit 4 of q[e].
- Q5_1 (24 B): ``d | m | qh[4] | qs[16]``, bits as Q5_0.
- Q8_0 (34 B): ``d | qs[32]`` int8, sequential.

K-quants, super-blocks of 256 = 16 sub-blocks of 16 (codes exact; each sub-block scale is
``d * sc`` with one fp16 ``d`` per super-block and a small integer ``sc``, so an arbitrary
per-16 scale is rounded onto that grid and the error is reported; exact when all 16 scales
(and mins) of a super-block are equal: ``d = s, sc = 1``). Element e of a super-block:
``h = e // 128, t = (e % 128) // 32, l = e % 32``.

- Q2_K (84 B): ``scales[16] | qs[64] | d | dmin``; ``scales[k] = sc_k | m_k << 4`` (4 bit each);
  code bits ``2t..2t+1`` of ``qs[32h + l]``.
- Q3_K (110 B): ``hmask[32] | qs[64] | scales[12] | d``; low 2 bits as Q2_K; bit 2 of the code
  is bit ``e // 32`` of ``hmask[e % 32]``; 6-bit ``L_k = sc_k + 32``: low nibble in
  ``scales[k]`` (k < 8) or high nibble of ``scales[k - 8]``, top 2 bits at bits ``2(k // 4)``
  of ``scales[8 + k % 4]``.
- Q4_K (144 B), Q5_K (176 B): 8 sub-blocks of 32 with 6-bit scale and min (``encode_q4_k``).
- Q6_K (210 B): ``ql[128] | qh[64] | scales[16] (int8) | d``; low nibble of code e in
  ``ql[64h + 32(t % 2) + l]`` (low nibble for t < 2, high for t >= 2); top 2 bits at
  bits ``2t..2t+1`` of ``qh[32h + l]``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "KQuantBlocks",
    "encode_q4_0",
    "encode_q4_1",
    "encode_q5_0",
    "encode_q5_1",
    "encode_q8_0",
    "encode_q2_k",
    "encode_q3_k",
    "encode_q4_k",
    "encode_q5_k",
    "encode_q6_k",
]

QK = 32  # legacy block size
QK_K = 256  # K-quant super-block size
_SHIFT2 = np.array([0, 2, 4, 6], dtype=np.uint8)


class KQuantBlocks(NamedTuple):
    """Result of a K-quant encoder.

    ``scales``/``mins`` are the effective per-16 values a reader computes (``d * sc`` in fp32),
    ``scale_error``/``min_error`` the largest ``|effective - requested|``, and ``max_error``
    the largest extra weight error ``|w_gguf - w_requested|`` over all elements.
    """

    data: NDArray[np.uint8]
    scales: NDArray[np.float32]
    mins: NDArray[np.float32] | None
    scale_error: float
    min_error: float
    max_error: float


def _codes(codes: ArrayLike, lo: int, hi: int, block: int) -> NDArray[np.int16]:
    a = np.asarray(codes)
    if a.ndim != 2 or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"codes must be a 2-D integer array [rows, K], got {a.dtype} of shape {a.shape}.")
    if a.shape[1] == 0 or a.shape[1] % block:
        raise ValueError(f"Row length K={a.shape[1]} must be a positive multiple of {block} for this GGUF type.")
    if a.size and (int(a.min()) < lo or int(a.max()) > hi):
        raise ValueError(f"codes must lie in [{lo}, {hi}], got [{int(a.min())}, {int(a.max())}].")
    return a.astype(np.int16)


def _param(x: ArrayLike, shape: tuple[int, ...], name: str) -> NDArray[np.float16]:
    a = np.asarray(x)
    if a.shape != shape:
        raise ValueError(f"{name} must have shape {shape} (one per block), got {a.shape}.")
    h = a.astype(np.float16)
    if a.dtype != np.float16 and not np.array_equal(h.astype(np.float64), a.astype(np.float64), equal_nan=True):
        raise ValueError(f"{name} is not exactly representable in float16; round it to float16 first.")
    return h


def _f16_bytes(x: NDArray[np.float16]) -> NDArray[np.uint8]:
    """[..., n] fp16 -> [..., n, 2] little-endian bytes."""
    return np.ascontiguousarray(x.astype("<f2")).view(np.uint8).reshape(*x.shape, 2)


def _join(rows: int, *parts: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """Concatenate per-block byte fields [rows, nb, ...] into [rows, nb * block_bytes]."""
    nb = parts[0].shape[1]
    return np.concatenate([p.reshape(rows, nb, -1).astype(np.uint8) for p in parts], axis=-1).reshape(rows, -1)


def _nibbles(q: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """[R, nb, 32] -> qs[16]: qs[j] = q[j] & 15 | (q[j+16] & 15) << 4."""
    return (q[..., :16] & 15) | ((q[..., 16:] & 15) << 4)


def _legacy(codes: ArrayLike, bits: int, d: ArrayLike, m: ArrayLike | None) -> NDArray[np.uint8]:
    q = _codes(codes, 0, (1 << bits) - 1, QK).astype(np.uint8)
    rows, nb = q.shape[0], q.shape[1] // QK
    q = q.reshape(rows, nb, QK)
    fields = [_f16_bytes(_param(d, (rows, nb), "d"))]
    if m is not None:
        fields.append(_f16_bytes(_param(m, (rows, nb), "m")))
    if bits == 5:  # qh: LE uint32, bit e = bit 4 of q[e]  ->  byte k bit b = element 8k + b
        fields.append(np.packbits((q >> 4) & 1, axis=-1, bitorder="little"))
    return _join(rows, *fields, _nibbles(q))


def encode_q4_0(codes: ArrayLike, d: ArrayLike) -> NDArray[np.uint8]:
    """Q4_0 blocks; codes in [0, 15], ``w = d * (code - 8)``; d fp16 [rows, K // 32]."""
    return _legacy(codes, 4, d, None)


def encode_q4_1(codes: ArrayLike, d: ArrayLike, m: ArrayLike) -> NDArray[np.uint8]:
    """Q4_1 blocks; codes in [0, 15], ``w = d * code + m``; d, m fp16 [rows, K // 32]."""
    return _legacy(codes, 4, d, m)


def encode_q5_0(codes: ArrayLike, d: ArrayLike) -> NDArray[np.uint8]:
    """Q5_0 blocks; codes in [0, 31], ``w = d * (code - 16)``; d fp16 [rows, K // 32]."""
    return _legacy(codes, 5, d, None)


def encode_q5_1(codes: ArrayLike, d: ArrayLike, m: ArrayLike) -> NDArray[np.uint8]:
    """Q5_1 blocks; codes in [0, 31], ``w = d * code + m``; d, m fp16 [rows, K // 32]."""
    return _legacy(codes, 5, d, m)


def encode_q8_0(values: ArrayLike, d: ArrayLike) -> NDArray[np.uint8]:
    """Q8_0 blocks; values int in [-128, 127], ``w = d * value``; d fp16 [rows, K // 32]."""
    q = _codes(values, -128, 127, QK).astype(np.int8)
    rows, nb = q.shape[0], q.shape[1] // QK
    return _join(rows, _f16_bytes(_param(d, (rows, nb), "d")), q.view(np.uint8))


def _subparam(x: ArrayLike, rows: int, k: int, name: str, sub: int = 16) -> NDArray[np.float64]:
    a = np.asarray(x, dtype=np.float64)
    if a.shape != (rows, k // sub):
        raise ValueError(f"{name} must have shape {(rows, k // sub)} (one per {sub} elements), got {a.shape}.")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} must be finite.")
    return a.reshape(rows, k // QK_K, QK_K // sub)


def _exact_fit(
    s: NDArray[np.float64], lo: int, hi: int
) -> tuple[NDArray[np.float16], NDArray[np.int16], NDArray[np.bool_]]:
    """Where one exists, an fp16 d and integers sc in [lo, hi] with fp32(d)·sc == s exactly, per super-block of
    `s` [R, nsb, n]; the mask says where. Scales put on the K-quant lattice by quantization/algorithm/kquant_scales.py have one
    (d = the largest |s| / its sc); tries d = max|s| / j for j from the grid's end down (a few steps for those)."""
    flat = s.reshape(-1, s.shape[-1])
    pivot = np.abs(flat).max(-1)
    d_out = np.zeros(len(flat), np.float16)
    sc_out = np.zeros(flat.shape, np.int16)
    found = np.zeros(len(flat), bool)
    todo = np.flatnonzero((pivot > 0) & ~(flat == flat[:, :1]).all(-1))  # equal scales: d = s, sc = 1 (_fit)
    for j in range(max(hi, -lo), 0, -1):
        if not todo.size:
            break
        d = (pivot[todo] / j).astype(np.float16)
        df = d.astype(np.float64)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            sc = np.rint(flat[todo] / df)
        ok = (df[:, 0] > 0) & ((sc >= lo) & (sc <= hi) & (df * sc == flat[todo])).all(-1)
        hit = todo[ok]
        d_out[hit], sc_out[hit], found[hit] = d[ok], sc[ok], True
        todo = todo[~ok]
    return d_out.reshape(s.shape[:-1]), sc_out.reshape(s.shape), found.reshape(s.shape[:-1])


def _fit(s: NDArray[np.float64], lo: int, hi: int) -> tuple[NDArray[np.float16], NDArray[np.int16]]:
    """Per super-block fp16 d and integer sc in [lo, hi] with d * sc ~= s; s is [R, nsb, n].

    Exact where possible: equal scales in a super-block: ``d = s, sc = 1``; scales on a K-quant lattice
    (``_exact_fit``). Otherwise generic: the largest-magnitude scale s* maps to the grid end of its sign
    (``d = s*/lo`` for signed grids, as ggml's make_qx_quants, else ``s*/hi``), d rounded away from zero to fp16 so
    ``|s / d|`` never exceeds the grid, then ``sc = round(s / d)``: ``|d * sc - s| <= d / 2``.
    """
    pivot = np.take_along_axis(s, np.abs(s).argmax(-1)[..., None], -1)[..., 0]
    want = pivot / (lo if lo < 0 else hi)
    d = want.astype(np.float16)
    short = np.abs(d.astype(np.float64)) < np.abs(want)
    d = np.where(short, np.nextafter(d, np.copysign(np.inf, want).astype(np.float16)), d)
    equal = (s == s[..., :1]).all(-1)
    d = np.where(equal, s[..., 0].astype(np.float16), d)
    if not np.isfinite(d).all():
        raise ValueError("Sub-block scales are too large for a float16 super-block scale.")
    df = d.astype(np.float64)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df != 0, np.rint(s / df), 0.0)
    sc = np.where(equal[..., None], 1.0, np.clip(sc, lo, hi))
    d_x, sc_x, exact = _exact_fit(s, lo, hi)
    exact &= ~equal
    return np.where(exact, d_x, d), np.where(exact[..., None], sc_x, sc).astype(np.int16)


def _eff(d: NDArray[np.float16], sc: NDArray[np.int16]) -> NDArray[np.float32]:
    """Effective per-16 value as readers compute it: fp32(d) * sc (exact in fp32)."""
    return d.astype(np.float32)[..., None] * sc.astype(np.float32)


def _qs2(q: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """[R, nsb, 256] -> qs[64]: bits 2t..2t+1 of qs[32h + l] = low 2 bits of code (h, t, l)."""
    q = (q & 3).reshape(*q.shape[:2], 2, 4, 32) << _SHIFT2[:, None]
    return np.bitwise_or.reduce(q, axis=3)


def _result(
    data: NDArray[np.uint8],
    s: NDArray[np.float64],
    eff: NDArray[np.float32],
    qc: NDArray[np.int16],
    m: NDArray[np.float64] | None = None,
    eff_m: NDArray[np.float32] | None = None,
) -> KQuantBlocks:
    rows = s.shape[0]
    ds = eff.astype(np.float64) - s
    dw = ds[..., None] * qc.reshape(*s.shape, -1)
    dm = np.zeros_like(s) if m is None or eff_m is None else eff_m.astype(np.float64) - m
    dw = dw - dm[..., None]
    return KQuantBlocks(
        data,
        eff.reshape(rows, -1),
        None if eff_m is None else eff_m.reshape(rows, -1),
        float(np.max(np.abs(ds), initial=0.0)),
        float(np.max(np.abs(dm), initial=0.0)),
        float(np.max(np.abs(dw), initial=0.0)),
    )


def encode_q6_k(codes: ArrayLike, sub_scales: ArrayLike) -> KQuantBlocks:
    """Q6_K; codes in [0, 63], ``w = d * sc_k * (code - 32)``, sc int8; sub_scales [rows, K // 16]."""
    qc = _codes(codes, 0, 63, QK_K)
    rows, k = qc.shape
    s = _subparam(sub_scales, rows, k, "sub_scales")
    d, sc = _fit(s, -128, 127)
    return _result(pack_q6_k(qc, sc, d), s, _eff(d, sc), qc - 32)


def pack_q6_k(codes: NDArray, sc: NDArray, d: NDArray[np.float16]) -> NDArray[np.uint8]:
    """Q6_K bytes of codes [rows, K] in [0, 63], int8 sub-scales [rows, K // 16] and fp16 d [rows, K // 256]."""
    rows, k = codes.shape
    q = codes.astype(np.uint8).reshape(rows, k // QK_K, 2, 4, 32)
    ql = np.concatenate(
        [(q[:, :, :, 0] & 15) | ((q[:, :, :, 2] & 15) << 4), (q[:, :, :, 1] & 15) | ((q[:, :, :, 3] & 15) << 4)],
        axis=-1,
    )
    qh = np.bitwise_or.reduce((q >> 4) << _SHIFT2[:, None], axis=3)
    return _join(rows, ql, qh, np.asarray(sc).astype(np.int8).view(np.uint8), _f16_bytes(np.asarray(d, np.float16)))


def encode_q3_k(codes: ArrayLike, sub_scales: ArrayLike) -> KQuantBlocks:
    """Q3_K; codes in [0, 7], ``w = d * sc_k * (code - 4)``, sc in [-32, 31]; sub_scales [rows, K // 16]."""
    qc = _codes(codes, 0, 7, QK_K)
    rows, k = qc.shape
    s = _subparam(sub_scales, rows, k, "sub_scales")
    d, sc = _fit(s, -32, 31)
    q = qc.astype(np.uint8).reshape(rows, k // QK_K, QK_K)
    hbit = ((q >> 2) & 1).reshape(rows, -1, 8, 32).swapaxes(-1, -2)  # [.., l, c]: hmask[l] bit c
    hmask = np.packbits(hbit, axis=-1, bitorder="little")
    lv = (sc + 32).astype(np.uint8)  # L_k in [0, 63]
    low = (lv[..., :8] & 15) | ((lv[..., 8:] & 15) << 4)
    high = np.bitwise_or.reduce((lv >> 4).reshape(rows, -1, 4, 4) << _SHIFT2[:, None], axis=2)
    data = _join(rows, hmask, _qs2(q), low, high, _f16_bytes(d))
    return _result(data, s, _eff(d, sc), qc - 4)


def encode_q2_k(codes: ArrayLike, sub_scales: ArrayLike, sub_mins: ArrayLike) -> KQuantBlocks:
    """Q2_K; codes in [0, 3], ``w = d * sc_k * code - dmin * m_k``, sc, m in [0, 15]; scales, mins >= 0."""
    qc = _codes(codes, 0, 3, QK_K)
    rows, k = qc.shape
    s = _subparam(sub_scales, rows, k, "sub_scales")
    mn = _subparam(sub_mins, rows, k, "sub_mins")
    if (s < 0).any() or (mn < 0).any():
        raise ValueError("Q2_K needs non-negative sub_scales and sub_mins (w = scale * code - min).")
    d, sc = _fit(s, 0, 15)
    dmin, mi = _fit(mn, 0, 15)
    q = qc.astype(np.uint8).reshape(rows, k // QK_K, QK_K)
    scales = sc.astype(np.uint8) | (mi.astype(np.uint8) << 4)
    data = _join(rows, scales, _qs2(q), _f16_bytes(d), _f16_bytes(dmin))
    return _result(data, s, _eff(d, sc), qc, mn, _eff(dmin, mi))


def _scales_k4(sc: NDArray, m: NDArray) -> NDArray[np.uint8]:
    """[R, nsb, 8] 6-bit scales and mins -> scales[12], the inverse of ggml's get_scale_min_k4: bytes 0-3 = sc_j and
    4-7 = m_j (j < 4), each with the top 2 bits of sc_{j+4} / m_{j+4} in bits 6-7; bytes 8-11 = low nibbles of
    sc_{j+4} | m_{j+4} << 4."""
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    return np.concatenate(
        [
            sc[..., :4] | ((sc[..., 4:] >> 4) << 6),
            m[..., :4] | ((m[..., 4:] >> 4) << 6),
            (sc[..., 4:] & 15) | ((m[..., 4:] & 15) << 4),
        ],
        axis=-1,
    )


def _encode_q45_k(codes: ArrayLike, sub_scales: ArrayLike, sub_mins: ArrayLike, bits: int) -> KQuantBlocks:
    qc = _codes(codes, 0, (1 << bits) - 1, QK_K)
    rows, k = qc.shape
    s = _subparam(sub_scales, rows, k, "sub_scales", 32)
    mn = _subparam(sub_mins, rows, k, "sub_mins", 32)
    if (s < 0).any() or (mn < 0).any():
        raise ValueError(f"Q{bits}_K needs non-negative sub_scales and sub_mins (w = scale * code - min).")
    d, sc = _fit(s, 0, 63)
    dmin, mi = _fit(mn, 0, 63)
    q = qc.astype(np.uint8).reshape(rows, k // QK_K, 4, 2, 32)  # 64-element chunks: first 32 low, next 32 high nibbles
    qs = ((q[:, :, :, 0] & 15) | ((q[:, :, :, 1] & 15) << 4)).reshape(rows, -1, 128)
    fields = [_f16_bytes(d), _f16_bytes(dmin), _scales_k4(sc, mi)]
    if bits == 5:  # bit 4 of code e is bit e // 32 of qh[e % 32]
        hbit = ((qc.astype(np.uint8) >> 4) & 1).reshape(rows, -1, 8, 32).swapaxes(-1, -2)
        fields.append(np.packbits(hbit, axis=-1, bitorder="little"))
    return _result(_join(rows, *fields, qs), s, _eff(d, sc), qc, mn, _eff(dmin, mi))


def encode_q4_k(codes: ArrayLike, sub_scales: ArrayLike, sub_mins: ArrayLike) -> KQuantBlocks:
    """Q4_K (144 B per 256): ``d | dmin | scales[12] | qs[128]``; codes in [0, 15], ``w = d * sc_j * code - dmin *
    m_j`` with 6-bit sc, m per 32 columns; sub_scales, sub_mins >= 0, [rows, K // 32]."""
    return _encode_q45_k(codes, sub_scales, sub_mins, 4)


def encode_q5_k(codes: ArrayLike, sub_scales: ArrayLike, sub_mins: ArrayLike) -> KQuantBlocks:
    """Q5_K (176 B per 256): ``d | dmin | scales[12] | qh[32] | qs[128]``; as Q4_K with codes in [0, 31]."""
    return _encode_q45_k(codes, sub_scales, sub_mins, 5)
