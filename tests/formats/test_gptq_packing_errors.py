"""Tests for matgptq.formats.gptq.packing: what it refuses, with the message — widths GPTQ has no packing for,
non-int widths, out-of-range or non-integer codes, shapes that fill no whole block, and packed arrays of the wrong
shape or dtype."""

from __future__ import annotations

import numpy as np
import pytest

from matgptq.formats.gptq.packing import from_v1_zeros, pack_cols, pack_rows, to_v1_zeros, unpack_cols, unpack_rows

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
