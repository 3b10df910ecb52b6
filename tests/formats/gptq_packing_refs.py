"""The naive GPTQ packer the packing tests (tests/formats/test_gptq_packing*.py) compare against: the whole column as
one little-endian bit list, cut into 32-bit words (docs/formats.md §2.2-2.3)."""

from __future__ import annotations

import numpy as np

BITS = (2, 3, 4, 8)


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
