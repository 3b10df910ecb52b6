"""Tests for matgptq.formats.gptq.packing: round trips (fixed shapes and Hypothesis), the v1 zero-point helpers, and
the padded layout GPTQModel 7.6.0 writes for 2/4/8 bits (docs/formats.md §2.5), against a port of its packer."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from matgptq.formats.gptq.packing import (
    from_v1_zeros,
    pack_cols,
    pack_rows,
    packed_words,
    to_v1_zeros,
    unpack_cols,
    unpack_rows,
)
from tests.formats.gptq_packing_refs import BITS, naive_pack_rows


def _block(bits: int) -> int:
    return 32 if bits == 3 else 32 // bits


# --- round trips -------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("k,n", [(0, 4), (32, 1), (64, 96), (4096, 11), (352, 33)])
def test_round_trip_rows(bits: int, k: int, n: int) -> None:
    codes = np.random.default_rng(k * n + bits).integers(0, 2**bits, size=(k, n), dtype=np.uint8)
    out = unpack_rows(pack_rows(codes, bits), bits, k)
    assert out.shape == (k, n)
    np.testing.assert_array_equal(out, codes)


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("g,n", [(1, 32), (7, 64), (32, 352), (2, 4096)])
def test_round_trip_cols(bits: int, g: int, n: int) -> None:
    zeros = np.random.default_rng(g * n + bits).integers(0, 2**bits, size=(g, n))
    packed = pack_cols(zeros, bits)
    assert packed.shape == (g, n * bits // 32)
    np.testing.assert_array_equal(unpack_cols(packed, bits, n), zeros)


def test_unpack_accepts_uint32_words_and_extremes() -> None:
    for bits in BITS:
        codes = np.full((32, 2), 2**bits - 1)
        packed = pack_rows(codes, bits)
        assert (packed == -1).all()
        np.testing.assert_array_equal(unpack_rows(packed.view(np.uint32), bits, 32), codes)


@st.composite
def _codes(draw: st.DrawFn) -> tuple[int, np.ndarray]:
    bits = draw(st.sampled_from(BITS))
    k = _block(bits) * draw(st.integers(0, 6))
    n = draw(st.integers(1, 5))
    flat = draw(st.lists(st.integers(0, 2**bits - 1), min_size=k * n, max_size=k * n))
    return bits, np.array(flat, dtype=np.int64).reshape(k, n)


@settings(max_examples=200, deadline=None)
@given(_codes())
def test_property_round_trip_and_reference(case: tuple[int, np.ndarray]) -> None:
    bits, codes = case
    packed = pack_rows(codes, bits)
    np.testing.assert_array_equal(packed, naive_pack_rows(codes, bits))
    np.testing.assert_array_equal(unpack_rows(packed, bits, codes.shape[0]), codes)
    np.testing.assert_array_equal(unpack_cols(pack_cols(codes.T, bits), bits, codes.shape[0]), codes.T)


@settings(max_examples=100, deadline=None)
@given(_codes())
def test_property_v1_round_trip(case: tuple[int, np.ndarray]) -> None:
    bits, zeros = case
    zeros = np.maximum(zeros, 1)
    stored = to_v1_zeros(zeros, bits)
    np.testing.assert_array_equal(stored, zeros - 1)
    np.testing.assert_array_equal(from_v1_zeros(stored, bits), zeros)


# --- v1 helpers --------------------------------------------------------------------------------


def test_from_v1_top_field_decodes_like_per_field_readers() -> None:
    assert from_v1_zeros(np.array([[15, 0, 7]]), 4).tolist() == [[16, 1, 8]]
    assert from_v1_zeros(np.array([[255]], dtype=np.uint8), 8).tolist() == [[256]]


def test_to_v1_rejects_zero_zero_point() -> None:
    with pytest.raises(ValueError, match=r"GPTQ v1 cannot store.*gptq_v2"):
        to_v1_zeros(np.array([[0, 5, 8, 15, 0, 0, 3, 1]]), 4)


# --- padding (GPTQModel's ceil layout, 2/4/8 bits) ----------------------------------------------


def gptqmodel_pack_original_rows(intweight: np.ndarray, bits: int) -> np.ndarray:
    """Port of GPTQModel 7.6.0 ``PackableQuantLinear.pack_original`` for 2/4/8 bits: ceil(K*b/32) zeroed words,
    ``for j in range(min(pf, K - row*pf))`` so the last word's unused fields stay 0."""
    pf, k = 32 // bits, intweight.shape[0]
    q = intweight.astype(np.uint64)
    out = np.zeros((-(-k * bits // 32), q.shape[1]), dtype=np.uint64)
    for row in range(out.shape[0]):
        for j in range(min(pf, k - row * pf)):
            out[row] |= q[row * pf + j] << np.uint64(bits * j)
    return (out & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("k", [1, 6, 170, 172, 176])
def test_padded_packing_matches_gptqmodel(bits: int, k: int) -> None:
    codes = np.random.default_rng(k + bits).integers(0, 2**bits, size=(k, 3))
    packed = pack_rows(codes, bits, pad=True)
    assert packed.shape == (packed_words(k, bits, pad=True), 3) == (-(-k * bits // 32), 3)
    np.testing.assert_array_equal(packed, gptqmodel_pack_original_rows(codes, bits))
    np.testing.assert_array_equal(pack_cols(codes.T, bits, pad=True), packed.T)
    np.testing.assert_array_equal(unpack_rows(packed, bits, k, pad=True), codes)
    np.testing.assert_array_equal(unpack_cols(packed.T, bits, k, pad=True), codes.T)


def test_padding_words_and_refusals() -> None:
    assert [packed_words(172, b, pad=True) for b in (2, 4, 8)] == [11, 22, 43]
    assert packed_words(192, 3) == packed_words(192, 3, pad=True) == 18 and packed_words(0, 4) == 0
    with pytest.raises(ValueError, match=r"cannot pack 172 values at 4 bits.*pass pad=True"):
        packed_words(172, 4)
    with pytest.raises(ValueError, match=r"cannot pack 172 rows at 3 bits.*multiple of 32.*no loader reads partially"):
        pack_rows(np.zeros((172, 2), dtype=np.int64), 3, pad=True)
    with pytest.raises(ValueError, match=r"cannot pack 172 values at 3 bits"):
        unpack_cols(np.zeros((2, 17), dtype=np.int32), 3, 172, pad=True)
    with pytest.raises(ValueError, match=r"has 21 words along the packed axis but 172 4-bit values need 22"):
        unpack_rows(np.zeros((21, 2), dtype=np.int32), 4, 172, pad=True)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([2, 4, 8]), st.integers(0, 70), st.integers(1, 3), st.randoms(use_true_random=False))
def test_property_padded_round_trip(bits: int, k: int, n: int, rnd) -> None:
    codes = np.array([[rnd.randrange(2**bits) for _ in range(n)] for _ in range(k)], dtype=np.int64).reshape(k, n)
    packed = pack_rows(codes, bits, pad=True)
    np.testing.assert_array_equal(unpack_rows(packed, bits, k, pad=True), codes)
    fill = k % (32 // bits) * bits
    if fill:  # the unused fields of the last word are zero
        assert not (packed[-1].view(np.uint32) >> np.uint32(fill)).any()
