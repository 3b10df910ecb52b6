"""compressed-tensors' int32 packing (`pack-quantized`, docs/formats.md §5): each row of unsigned b-bit values as one
little-endian bit stream, value k at stream bits [k·b, (k+1)·b), stream bit j = bit j mod 32 of word j // 32, so
codes straddle words at 3/5/6/7 bits; the last word zero-filled. `weight_packed` packs the codes along K,
`weight_zero_point` the zero points along N (transposed)."""

from __future__ import annotations

import numpy as np


def pack_int32(u: np.ndarray, bits: int) -> np.ndarray:
    """[rows, n] unsigned values < 2^bits → [rows, ceil(n·bits/32)] int32: one little-endian bit stream per row."""
    rows, n = u.shape
    planes = (u.astype(np.uint8)[:, :, None] >> np.arange(bits, dtype=np.uint8)) & 1
    stream = np.packbits(planes.reshape(rows, n * bits), axis=1, bitorder="little")
    words = -(-n * bits // 32)
    stream = np.pad(stream, ((0, 0), (0, 4 * words - stream.shape[1])))
    return np.ascontiguousarray(stream).view("<i4").astype(np.int32)


def unpack_int32(words: np.ndarray, bits: int, n: int) -> np.ndarray:
    """[rows, ceil(n·bits/32)] int32 words → [rows, n] uint8, each row a little-endian bit stream (pack_int32's)."""
    stream = np.ascontiguousarray(words.astype("<i4")).view(np.uint8)
    planes = np.unpackbits(stream, axis=1, count=n * bits, bitorder="little").reshape(words.shape[0], n, bits)
    return (planes << np.arange(bits, dtype=np.uint8)).sum(-1, dtype=np.uint8)
