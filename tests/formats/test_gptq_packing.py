"""Tests for matgptq.formats.gptq_packing against naive references and docs/formats.md §2.2-2.5."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from matgptq.formats.gptq_packing import (
    from_v1_zeros,
    pack_cols,
    pack_rows,
    packed_words,
    to_v1_zeros,
    unpack_cols,
    unpack_rows,
)

BITS = (2, 3, 4, 8)


def _block(bits: int) -> int:
    return 32 if bits == 3 else 32 // bits


def _as_int32(u: int) -> int:
    return (u ^ 0x80000000) - 0x80000000


def naive_pack_rows(codes: np.ndarray, bits: int) -> np.ndarray:
    """Whole column as one little-endian bit list (code i at bits [i*b, (i+1)*b)), cut into 32-bit words."""
    k, n = codes.shape
    out = np.zeros((k * bits // 32, n), dtype=np.int32)
    for col in range(n):
        stream: list[int] = []
        for value in codes[:, col].tolist():
            stream.extend((value >> t) & 1 for t in range(bits))
        for w in range(len(stream) // 32):
            out[w, col] = _as_int32(sum(bit << j for j, bit in enumerate(stream[32 * w : 32 * w + 32])))
    return out


def autogptq_loop_pack(intweight: np.ndarray, bits: int) -> np.ndarray:
    """Port of AutoGPTQ ``qlinear_cuda_old.QuantLinear.pack`` row loop (uint64 words, masked at the end)."""
    q = intweight.astype(np.uint64)
    qweight = np.zeros((q.shape[0] // 32 * bits, q.shape[1]), dtype=np.uint64)
    i = row = 0
    while row < qweight.shape[0]:
        if bits in (2, 4, 8):
            for j in range(i, i + 32 // bits):
                qweight[row] |= q[j] << np.uint64(bits * (j - i))
            i += 32 // bits
            row += 1
        else:  # 3 bits: 10 | 1 | 10 | 1 | 10
            for j in range(i, i + 10):
                qweight[row] |= q[j] << np.uint64(3 * (j - i))
            i += 10
            qweight[row] |= q[i] << np.uint64(30)
            row += 1
            qweight[row] |= (q[i] >> np.uint64(2)) & np.uint64(1)
            i += 1
            for j in range(i, i + 10):
                qweight[row] |= q[j] << np.uint64(3 * (j - i) + 1)
            i += 10
            qweight[row] |= q[i] << np.uint64(31)
            row += 1
            qweight[row] |= (q[i] >> np.uint64(1)) & np.uint64(3)
            i += 1
            for j in range(i, i + 10):
                qweight[row] |= q[j] << np.uint64(3 * (j - i) + 2)
            i += 10
            row += 1
    return (qweight & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32)


def _u32(a: np.ndarray) -> list[int]:
    return np.asarray(a).view(np.uint32).ravel().tolist()


# --- agreement with independent references -----------------------------------------------------


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("k,n", [(32, 1), (64, 3), (96, 5), (256, 7)])
def test_pack_rows_matches_naive_bitstream(bits: int, k: int, n: int) -> None:
    rng = np.random.default_rng(1000 * bits + k + n)
    codes = rng.integers(0, 2**bits, size=(k, n))
    got = pack_rows(codes, bits)
    assert got.dtype == np.int32 and got.shape == (k * bits // 32, n)
    np.testing.assert_array_equal(got, naive_pack_rows(codes, bits))


@pytest.mark.parametrize("bits", BITS)
def test_pack_rows_matches_autogptq_loop(bits: int) -> None:
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 2**bits, size=(128, 6))
    np.testing.assert_array_equal(pack_rows(codes, bits), autogptq_loop_pack(codes, bits))


@pytest.mark.parametrize("bits", BITS)
def test_pack_cols_is_transposed_pack_rows(bits: int) -> None:
    rng = np.random.default_rng(7 + bits)
    zeros = rng.integers(0, 2**bits, size=(5, 64))
    np.testing.assert_array_equal(pack_cols(zeros, bits), naive_pack_rows(zeros.T, bits).T)
    assert pack_cols(zeros, bits).flags["C_CONTIGUOUS"]


@pytest.mark.parametrize("bits,k", [(2, 16), (4, 8), (8, 4), (4, 40), (8, 12)])
def test_partial_blocks_for_power_of_two_widths(bits: int, k: int) -> None:
    codes = np.random.default_rng(k).integers(0, 2**bits, size=(k, 3))
    np.testing.assert_array_equal(pack_rows(codes, bits), naive_pack_rows(codes, bits))
    np.testing.assert_array_equal(unpack_rows(pack_rows(codes, bits), bits, k), codes)


# --- hand-checked vectors (docs/formats.md §2.2-2.4) ------------------------------------------------


def test_two_four_eight_bit_word_formula() -> None:
    # qweight[r] = sum_j q[r*pf + j] << (b*j)
    assert _u32(pack_rows(np.arange(8).reshape(8, 1), 4)) == [0x76543210]
    assert _u32(pack_rows(np.array([[0x12], [0x34], [0x56], [0x78]]), 8)) == [0x78563412]
    assert _u32(pack_rows(np.array([[1], [2], [3]] + [[0]] * 12 + [[3]]), 2)) == [0xC0000039]
    assert pack_rows(np.full((8, 1), 15), 4)[0, 0] == -1  # int32 bit pattern of 0xFFFFFFFF


def test_three_bit_straddling_values() -> None:
    codes = np.zeros((32, 1), dtype=np.int64)
    codes[10] = 0b101  # low 2 bits (01) -> w0 bits 30-31, bit 2 (1) -> w1 bit 0
    w0, w1, w2 = _u32(pack_rows(codes, 3))
    assert (w0, w1, w2) == (1 << 30, 1, 0)

    codes[:] = 0
    codes[21] = 0b011  # bit 0 (1) -> w1 bit 31, bits 1-2 (01) -> w2 bits 0-1
    assert _u32(pack_rows(codes, 3)) == [0, 1 << 31, 0b01]

    codes[:] = 0
    codes[10], codes[21] = 0b110, 0b110
    assert _u32(pack_rows(codes, 3)) == [1 << 31, 1, 0b11]


def test_three_bit_table_every_position() -> None:
    # value i = 7 (all ones) sets exactly the stream bits 3i..3i+2 (docs/formats.md §2.3).
    for i in range(32):
        codes = np.zeros((32, 1), dtype=np.int64)
        codes[i] = 7
        words = _u32(pack_rows(codes, 3))
        stream = words[0] | (words[1] << 32) | (words[2] << 64)
        assert stream == 0b111 << (3 * i), i
        if i <= 9:
            assert words[0] == 7 << (3 * i)
        elif 11 <= i <= 20:
            assert words[1] == 7 << (1 + 3 * (i - 11))
        elif 22 <= i:
            assert words[2] == 7 << (2 + 3 * (i - 22))


def test_three_bit_gptqmodel_unpack_fixups() -> None:
    # GM model_dequant._unpack_rows_3bit: v10 = ((w0>>30)&3) | ((w1<<2)&4); v21 = ((w1>>31)&1) | ((w2<<1)&6)
    codes = np.random.default_rng(3).integers(0, 8, size=(32, 50))
    q = pack_rows(codes, 3).view(np.uint32).astype(np.int64)
    w0, w1, w2 = q[0], q[1], q[2]
    np.testing.assert_array_equal(((w0 >> 30) & 3) | ((w1 << 2) & 4), codes[10])
    np.testing.assert_array_equal(((w1 >> 31) & 1) | ((w2 << 1) & 6), codes[21])


@pytest.mark.parametrize(
    "bits,v2_words,v1_words",
    [
        (2, [0xAAAAAAAA], [0x55555555]),
        (4, [0x88888888], [0x77777777]),
        (8, [0x80808080], [0x7F7F7F7F]),
        (3, [0x24924924, 0x49249249, 0x92492492], [0xDB6DB6DB, 0xB6DB6DB6, 0x6DB6DB6D]),
    ],
)
def test_symmetric_qzeros_constants(bits: int, v2_words: list[int], v1_words: list[int]) -> None:
    groups, n = 3, 64
    zeros = np.full((groups, n), 2 ** (bits - 1))
    v2 = pack_cols(zeros, bits)
    v1 = pack_cols(to_v1_zeros(zeros, bits), bits)
    assert v2.dtype == np.int32 and v2.shape == (groups, n * bits // 32)
    reps = n * bits // 32 // len(v2_words)
    assert _u32(v2) == v2_words * reps * groups
    assert _u32(v1) == v1_words * reps * groups
    # 3-bit: fields all 4 (v2) / all 3 (v1)
    assert (unpack_cols(v2, bits, n) == 2 ** (bits - 1)).all()
    assert (unpack_cols(v1, bits, n) == 2 ** (bits - 1) - 1).all()


@pytest.mark.parametrize("bits,word", [(2, 0x55555555), (4, 0x11111111), (8, 0x01010101)])
def test_v1_word_constants_match_gptqmodel(bits: int, word: int) -> None:
    # GPTQModel converts v1<->v2 by adding/subtracting pack(ones); without a zero field it is per-field.
    zeros = np.random.default_rng(bits).integers(1, 2**bits, size=(4, 32))
    ones = pack_cols(np.ones((1, 32), dtype=np.int64), bits)
    assert set(_u32(ones)) == {word}
    v1 = pack_cols(to_v1_zeros(zeros, bits), bits).view(np.uint32).astype(np.uint64)
    v2 = ((v1 + np.uint64(word)) & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32)
    np.testing.assert_array_equal(v2, pack_cols(zeros, bits))


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


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [1, 5, 6, 7, 16])
def test_unsupported_bits(bits: int) -> None:
    msg = rf"GPTQ has no packing for {bits}-bit; use 2/3/4/8 or GGUF"
    for call in (
        lambda: pack_rows(np.zeros((32, 1), dtype=np.int64), bits),
        lambda: pack_cols(np.zeros((1, 32), dtype=np.int64), bits),
        lambda: unpack_rows(np.zeros((4, 1), dtype=np.int32), bits, 32),
        lambda: unpack_cols(np.zeros((1, 4), dtype=np.int32), bits, 32),
        lambda: to_v1_zeros(np.ones((1, 32), dtype=np.int64), bits),
        lambda: from_v1_zeros(np.ones((1, 32), dtype=np.int64), bits),
    ):
        with pytest.raises(ValueError, match=msg):
            call()


@pytest.mark.parametrize("bits", [True, 4.0, "4", None])
def test_non_int_bits(bits: object) -> None:
    with pytest.raises(ValueError, match="bits must be an int"):
        pack_rows(np.zeros((32, 1), dtype=np.int64), bits)  # type: ignore[arg-type]


@pytest.mark.parametrize("bits,bad", [(4, 16), (4, -1), (3, 8), (2, 4), (8, 256)])
def test_out_of_range_codes(bits: int, bad: int) -> None:
    codes = np.zeros((32, 2), dtype=np.int64)
    codes[5, 1] = bad
    with pytest.raises(ValueError, match=rf"out of range for {bits}-bit.*clamp"):
        pack_rows(codes, bits)
    with pytest.raises(ValueError, match=rf"out of range for {bits}-bit"):
        pack_cols(codes.T, bits)


def test_non_integer_codes() -> None:
    with pytest.raises(ValueError, match="integer array"):
        pack_rows(np.zeros((32, 1), dtype=np.float32), 4)
    with pytest.raises(ValueError, match="integer array"):
        pack_rows(np.zeros((32, 1), dtype=bool), 4)
    with pytest.raises(ValueError, match="at least one dimension"):
        pack_rows(np.int64(3), 4)


@pytest.mark.parametrize("bits,k", [(3, 172), (3, 16), (4, 12), (2, 24), (8, 6)])
def test_unpackable_shapes(bits: int, k: int) -> None:
    with pytest.raises(ValueError, match=rf"cannot pack {k} rows at {bits} bits.*multiple of"):
        pack_rows(np.zeros((k, 4), dtype=np.int64), bits)
    with pytest.raises(ValueError, match=rf"cannot pack {k} columns at {bits} bits"):
        pack_cols(np.zeros((4, k), dtype=np.int64), bits)


def test_unpack_shape_and_dtype_errors() -> None:
    q = pack_rows(np.zeros((64, 3), dtype=np.int64), 3)  # [6, 3]
    with pytest.raises(ValueError, match="words along the packed axis"):
        unpack_rows(q, 3, 32)
    with pytest.raises(ValueError, match="cannot pack 172 values at 3 bits"):
        unpack_rows(q, 3, 172)
    with pytest.raises(ValueError, match="int32"):
        unpack_rows(q.astype(np.int64), 3, 64)
    with pytest.raises(ValueError, match="non-negative int"):
        unpack_rows(q, 3, -32)
    with pytest.raises(ValueError, match="words along the packed axis"):
        unpack_cols(q.T, 3, 32)
