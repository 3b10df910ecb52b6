"""GGUF block encoders checked against gguf-py's independent dequantizer (docs/formats.md §3.4-3.6)."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGML_QUANT_SIZES  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402

from matgptq.formats.gguf.blocks import (  # noqa: E402
    KQuantBlocks,
    encode_q2_k,
    encode_q3_k,
    encode_q4_0,
    encode_q4_1,
    encode_q4_k,
    encode_q5_0,
    encode_q5_1,
    encode_q5_k,
    encode_q6_k,
    encode_q8_0,
)

F32, F16 = np.float32, np.float16


def _deq(data: np.ndarray, qtype: T, rows: int, k: int) -> np.ndarray:
    block, nbytes = GGML_QUANT_SIZES[qtype]
    assert data.dtype == np.uint8 and data.shape == (rows, k // block * nbytes)
    out = gguf.quants.dequantize(data, qtype)
    assert out.shape == (rows, k)
    return out.astype(F32)


def _fp16(rng: np.random.Generator, shape: tuple[int, ...], lo: float = -0.1, hi: float = 0.1) -> np.ndarray:
    return rng.uniform(lo, hi, size=shape).astype(F16)


# --- legacy types: exact ---------------------------------------------------------------

LEGACY = [  # qtype, encoder, code range, has m, offset
    (T.Q4_0, encode_q4_0, (0, 15), False, 8),
    (T.Q4_1, encode_q4_1, (0, 15), True, 0),
    (T.Q5_0, encode_q5_0, (0, 31), False, 16),
    (T.Q5_1, encode_q5_1, (0, 31), True, 0),
    (T.Q8_0, encode_q8_0, (-128, 127), False, 0),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("qtype,enc,rng_codes,has_m,off", LEGACY, ids=[c[0].name for c in LEGACY])
def test_legacy_exact(qtype, enc, rng_codes, has_m, off, seed):
    rng = np.random.default_rng(seed)
    rows, k = 5, 32 * (1 + seed * 3)
    codes = rng.integers(rng_codes[0], rng_codes[1] + 1, size=(rows, k), dtype=np.int64)
    d = _fp16(rng, (rows, k // 32))
    d[0, 0] = 0.0
    d_rep = np.repeat(d.astype(F32), 32, axis=1)
    if has_m:
        m = _fp16(rng, (rows, k // 32))
        data = enc(codes.astype(np.uint8), d, m)
        expected = d_rep * codes.astype(F32) + np.repeat(m.astype(F32), 32, axis=1)  # w = d*q + m
    else:
        data = enc(codes.astype(np.int8 if off == 0 else np.uint8), d)
        expected = d_rep * (codes - off).astype(F32)  # w = d*(q - off)
    assert np.array_equal(_deq(data, qtype, rows, k), expected)


@pytest.mark.parametrize(
    "qtype,enc,off", [(T.Q4_0, encode_q4_0, 8), (T.Q5_0, encode_q5_0, 16), (T.Q8_0, encode_q8_0, 0)]
)
def test_bytes_match_gguf_quantize(qtype, enc, off):
    """gguf-py's own quantizer picks the same d and codes when a block holds the extreme code."""
    rng = np.random.default_rng(7)
    rows, k = 4, 128
    lo, hi = (-127, 127) if qtype == T.Q8_0 else (0, 2 * off - 1)
    codes = rng.integers(lo, hi + 1, size=(rows, k))
    codes[:, ::32] = lo  # pins gguf's d = max/(-8) (Q4_0), max/(-16) (Q5_0), amax/127 (Q8_0)
    d = rng.uniform(1e-3, 0.1, size=(rows, k // 32)).astype(F16)
    x = np.repeat(d.astype(F32), 32, axis=1) * (codes - off).astype(F32)
    ours = enc(codes, d)
    assert np.array_equal(ours, gguf.quants.quantize(x, qtype))


def test_q4_0_nibble_order():
    codes = np.arange(32, dtype=np.uint8)[None] % 16
    codes[0, 16:] = 15 - codes[0, 16:]
    data = encode_q4_0(codes, np.ones((1, 1), F16))
    assert list(data[0, 2:]) == [int(codes[0, j]) | int(codes[0, j + 16]) << 4 for j in range(16)]


# --- K-quants ---------------------------------------------------------------------------

KQ = [(T.Q6_K, encode_q6_k, 63, 32), (T.Q3_K, encode_q3_k, 7, 4)]


def _rep16(x: np.ndarray) -> np.ndarray:
    return np.repeat(x, 16, axis=1)


@pytest.mark.parametrize("qtype,enc,top,off", KQ, ids=[c[0].name for c in KQ])
def test_kquant_exact_equal_scales(qtype, enc, top, off):
    rng = np.random.default_rng(3)
    rows, k = 3, 512
    codes = rng.integers(0, top + 1, size=(rows, k))
    s = np.repeat(_fp16(rng, (rows, k // 256), 1e-4, 0.05), 16, axis=1)  # one scale per super-block
    res = enc(codes, s)
    expected = _rep16(s.astype(F32)) * (codes - off).astype(F32)
    assert np.array_equal(_deq(res.data, qtype, rows, k), expected)
    assert res.scale_error == 0.0 and res.max_error == 0.0


def test_q2_k_exact_equal_scales_and_mins():
    rng = np.random.default_rng(4)
    rows, k = 3, 512
    codes = rng.integers(0, 4, size=(rows, k))
    s = np.repeat(_fp16(rng, (rows, 2), 1e-4, 0.05), 16, axis=1)
    m = np.repeat(_fp16(rng, (rows, 2), 0.0, 0.1), 16, axis=1)
    m[0] = 0.0
    res = encode_q2_k(codes, s, m)
    expected = _rep16(s.astype(F32)) * codes.astype(F32) - _rep16(m.astype(F32))  # w = s*q - m
    assert np.array_equal(_deq(res.data, T.Q2_K, rows, k), expected)
    assert res.scale_error == res.min_error == res.max_error == 0.0


def _check_approx(
    res: KQuantBlocks, deq: np.ndarray, codes: np.ndarray, s: np.ndarray, off: int, m: np.ndarray | None = None
) -> None:
    eff = _rep16(res.scales)
    eff_m = np.zeros_like(eff) if res.mins is None else _rep16(res.mins)
    # the reader's values are exactly what the reported effective scales/mins give
    assert np.array_equal(deq, eff * (codes - off).astype(F32) - eff_m)
    # codes are preserved: (w + min) / scale recovers them
    nz = eff != 0
    assert np.array_equal(np.rint((deq + eff_m)[nz] / eff[nz]) + off, codes[nz])
    assert np.abs(res.scales - s).max() <= res.scale_error
    want = _rep16(s.astype(np.float64)) * (codes - off)
    if m is not None:
        want -= _rep16(m.astype(np.float64))
    assert np.abs(deq.astype(np.float64) - want).max() <= res.max_error * (1 + 1e-6) + 1e-12


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("qtype,enc,top,off", KQ, ids=[c[0].name for c in KQ])
def test_kquant_approx_scales(qtype, enc, top, off, seed):
    rng = np.random.default_rng(10 + seed)
    rows, k = 4, 768
    codes = rng.integers(0, top + 1, size=(rows, k))
    s = np.repeat(rng.uniform(1e-3, 0.05, (rows, k // 256)), 16, axis=1) * rng.uniform(0.5, 1.0, (rows, k // 16))
    s = s.astype(F16).astype(F32)
    res = enc(codes, s)
    _check_approx(res, _deq(res.data, qtype, rows, k), codes, s, off)
    grid = 128 if qtype == T.Q6_K else 32  # largest scale maps to sc = -grid; error <= d/2
    assert res.scale_error <= s.max() / grid / 2 * (1 + 2**-9)
    assert res.scale_error > 0


@pytest.mark.parametrize("qtype,enc,top,off", KQ, ids=[c[0].name for c in KQ])
def test_kquant_mixed_sign_scales(qtype, enc, top, off):
    rng = np.random.default_rng(5)
    rows, k = 2, 256
    codes = rng.integers(0, top + 1, size=(rows, k))
    s = rng.uniform(-0.05, 0.05, (rows, k // 16)).astype(F16).astype(F32)
    res = enc(codes, s)
    _check_approx(res, _deq(res.data, qtype, rows, k), codes, s, off)


def test_q2_k_approx():
    rng = np.random.default_rng(6)
    rows, k = 4, 512
    codes = rng.integers(0, 4, size=(rows, k))
    s = rng.uniform(0.005, 0.05, (rows, k // 16)).astype(F16).astype(F32)
    m = (s * rng.integers(0, 4, (rows, k // 16))).astype(F16).astype(F32)  # GPTQ: min = s*z
    res = encode_q2_k(codes, s, m)
    _check_approx(res, _deq(res.data, T.Q2_K, rows, k), codes, s, 0, m)
    assert res.scale_error <= s.max() / 15 / 2 * (1 + 2**-9)
    assert res.min_error <= m.max() / 15 / 2 * (1 + 2**-9)


# --- Q4_K / Q5_K (per-32 scale and min), and scales on the K-quant lattice ---------------

K45 = [(T.Q4_K, encode_q4_k, 15), (T.Q5_K, encode_q5_k, 31)]


@pytest.mark.parametrize("qtype,enc,top", K45, ids=[c[0].name for c in K45])
def test_q45_k_exact_on_a_lattice(qtype, enc, top):
    """Scales d·sc and mins dmin·m with fp16 d, dmin and 6-bit integers: gguf-py reads back exactly d·sc·q − dmin·m
    (products of an fp16 value and integers below 2^13 are exact in fp32, so the expected values are exact)."""
    rng = np.random.default_rng(7)
    rows, k = 3, 512
    codes = rng.integers(0, top + 1, size=(rows, k))
    d = _fp16(rng, (rows, k // 256, 1), 1e-4, 0.01).astype(F32)
    dmin = _fp16(rng, (rows, k // 256, 1), 1e-4, 0.01).astype(F32)
    sc, m = rng.integers(1, 64, (rows, k // 256, 8)), rng.integers(0, 64, (rows, k // 256, 8))
    sc[..., 0], m[..., 0] = 63, 63  # one pivot at the grid's end, as the lattice's largest scale is
    s, mn = (d * sc).reshape(rows, -1), (dmin * m).reshape(rows, -1)
    res = enc(codes, s, mn)
    expected = np.repeat(s, 32, axis=1) * codes.astype(F32) - np.repeat(mn, 32, axis=1)
    assert np.array_equal(_deq(res.data, qtype, rows, k), expected)
    assert res.scale_error == res.min_error == res.max_error == 0.0


@pytest.mark.parametrize("qtype,enc,top", K45, ids=[c[0].name for c in K45])
def test_q45_k_approx(qtype, enc, top):
    """Arbitrary scales: codes kept, the reader's values are exactly the reported effective scales and mins, and
    the scale error is at most half a step of the 6-bit grid (d = max/63 rounded up to fp16)."""
    rng = np.random.default_rng(8)
    rows, k = 4, 512
    codes = rng.integers(0, top + 1, size=(rows, k))
    s = rng.uniform(0.005, 0.05, (rows, k // 32)).astype(F16).astype(F32)
    mn = (s * rng.integers(0, top + 1, (rows, k // 32))).astype(F16).astype(F32)
    res = enc(codes, s, mn)
    deq = _deq(res.data, qtype, rows, k)
    rep = lambda x: np.repeat(x, 32, axis=1)  # noqa: E731
    assert np.array_equal(deq, rep(res.scales) * codes.astype(F32) - rep(res.mins))
    assert 0 < res.scale_error <= s.max() / 63 / 2 * (1 + 2**-9)
    assert res.min_error <= mn.max() / 63 / 2 * (1 + 2**-9)


@pytest.mark.parametrize("qtype,enc,top,off", KQ, ids=[c[0].name for c in KQ])
def test_kquant_finds_the_exact_lattice(qtype, enc, top, off):
    """Sub-scales d·sc whose largest sc is below the grid's end (a lattice made for a narrower type, e.g. sc ≤ 15
    for Q2_K written as Q6_K): the encoder finds an exact d instead of rounding onto max/127."""
    rng = np.random.default_rng(9)
    rows, k = 3, 512
    codes = rng.integers(0, top + 1, size=(rows, k))
    d = _fp16(rng, (rows, k // 256, 1), 1e-4, 0.01).astype(F32)
    sc = rng.integers(1, 16, (rows, k // 256, 16))
    s = (d * sc).reshape(rows, -1)
    res = enc(codes, s)
    assert res.max_error == 0.0
    assert np.array_equal(_deq(res.data, qtype, rows, k), _rep16(s) * (codes - off).astype(F32))


# --- validation -------------------------------------------------------------------------


def test_validation_errors():
    ok16 = np.ones((2, 1), F16)
    with pytest.raises(ValueError, match="multiple of 32"):
        encode_q4_0(np.zeros((2, 48), np.uint8), ok16)
    with pytest.raises(ValueError, match=r"\[0, 15\]"):
        encode_q4_0(np.full((2, 32), 16, np.uint8), ok16)
    with pytest.raises(ValueError, match=r"\[0, 31\]"):
        encode_q5_1(np.full((2, 32), -1), ok16, ok16)
    with pytest.raises(ValueError, match="shape"):
        encode_q4_1(np.zeros((2, 64), np.uint8), ok16, ok16)
    with pytest.raises(ValueError, match="integer"):
        encode_q8_0(np.zeros((2, 32), np.float32), ok16)
    with pytest.raises(ValueError, match="float16"):
        encode_q4_0(np.zeros((2, 32), np.uint8), np.full((2, 1), 0.1, np.float32))
    with pytest.raises(ValueError, match="multiple of 256"):
        encode_q6_k(np.zeros((2, 128), np.uint8), np.ones((2, 8), F32))
    with pytest.raises(ValueError, match=r"\[0, 7\]"):
        encode_q3_k(np.full((1, 256), 8), np.ones((1, 16), F32))
    with pytest.raises(ValueError, match="shape"):
        encode_q6_k(np.zeros((1, 256), np.uint8), np.ones((1, 8), F32))
    with pytest.raises(ValueError, match="non-negative"):
        encode_q2_k(np.zeros((1, 256), np.uint8), np.ones((1, 16)), -np.ones((1, 16)))
