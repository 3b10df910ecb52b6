"""Tests for matgptq.formats.gptq.packing against naive references and docs/formats.md §2.2-2.5: the bit layouts —
agreement with the naive bit stream and AutoGPTQ's packing loop, and hand-checked words (2/4/8-bit formula, 3-bit
straddling values, symmetric qzeros constants, GPTQModel's v1 word constants). Round trips, v1 helpers and padding:
test_gptq_packing_round_trips.py; refusals: test_gptq_packing_errors.py."""

from __future__ import annotations

import numpy as np
import pytest

from matgptq.formats.gptq.packing import pack_cols, pack_rows, to_v1_zeros, unpack_cols, unpack_rows
from tests.formats.gptq_packing_refs import BITS, naive_pack_rows


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
