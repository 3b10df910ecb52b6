"""GPTQ int32 bit packing of codes (``qweight``) and zero points (``qzeros``).

One rule covers every GPTQ width b in {2, 3, 4, 8} (docs/formats.md §2.2-2.4): along the packed
axis, each block of 32 consecutive codes forms a little-endian bit-stream, code i occupying
stream bits ``[i*b, (i+1)*b)``, cut into b consecutive 32-bit words; a word is stored as the
int32 bit pattern of the uint32 value. For b = 2/4/8 this is GPTQ's
``qweight[r] |= q[r*pf + j] << (b*j)`` with ``pf = 32 // b``; for b = 3 it is the
"10 | 1 | 10 | 1 | 10" layout in which values 10 and 21 straddle words.
``qweight`` packs along rows (input features, ``[K, N] -> [K*b/32, N]``); ``qzeros`` packs
along columns (output features, ``[G, N] -> [G, N*b/32]``).

Lengths that are not a multiple of ``32/b`` (2/4/8 bits), e.g. 172 output features at 4 bits, are
packed with ``pad=True`` the way GPTQModel writes them (its buffers are ``ceil(length*b/32)`` words):
the missing codes of the last word are zero-filled, and unpacking crops them again. 3-bit values
straddle words in blocks of 32 (3 words) and no GPTQ loader reads a partial block, so 3-bit
lengths must stay multiples of 32.

Zero-point conventions (docs/formats.md §2.5): ``gptq_v2`` stores the true zero z, ``gptq``
(v1) stores z - 1 per field. ``to_v1_zeros``/``from_v1_zeros`` work on *unpacked* zeros;
``to_v1_words`` converts packed ``qzeros`` words the way GPTQModel does (constants.V1_WORD_ADD).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .constants import SUPPORTED_BITS, V1_WORD_ADD

__all__ = [
    "packed_words",
    "pack_rows",
    "unpack_rows",
    "pack_cols",
    "unpack_cols",
    "to_v1_zeros",
    "from_v1_zeros",
    "to_v1_words",
]

_MASK32 = np.uint64(0xFFFFFFFF)


def _check_bits(bits: int) -> None:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)):
        raise ValueError(f"bits must be an int in {SUPPORTED_BITS}, got {bits!r}.")
    if int(bits) not in SUPPORTED_BITS:
        raise ValueError(f"GPTQ has no packing for {int(bits)}-bit; use 2/3/4/8 or GGUF.")


def _block(bits: int) -> int:
    """Codes per independent block: 32 for 3-bit (3 words), else one word's worth (32 // b)."""
    return 32 if bits == 3 else 32 // bits


def _padded_length(length: int, bits: int, what: str, pad: bool) -> int:
    """The length actually packed: `length` itself, or (pad, 2/4/8 bits) rounded up to whole words."""
    g = _block(bits)
    if length % g == 0:
        return length
    if pad and bits != 3:
        return length + (-length % g)
    hint = (
        "3-bit GPTQ packs whole blocks of 32 values, which no loader reads partially; use another bit-width"
        if bits == 3
        else f"pass pad=True to zero-fill the last word, or pad it to {-(-length // g) * g}"
    )
    raise ValueError(
        f"cannot pack {length} {what} at {bits} bits: GPTQ needs a multiple of {g} along the packed axis; {hint}."
    )


def packed_words(length: int, bits: int, pad: bool = False) -> int:
    """Number of int32 words that hold `length` b-bit values (``ceil(length*b/32)`` with pad); ValueError if none."""
    _check_bits(bits)
    return _padded_length(int(length), int(bits), "values", pad) * int(bits) // 32


def _check_codes(codes: ArrayLike, bits: int, what: str) -> NDArray[np.integer]:
    arr = np.asarray(codes)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{what} must be an integer array, got dtype {arr.dtype}; cast with astype().")
    if arr.ndim < 1:
        raise ValueError(f"{what} must have at least one dimension, got a scalar.")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > (1 << bits) - 1):
        raise ValueError(
            f"{what} out of range for {bits}-bit: found [{int(arr.min())}, {int(arr.max())}], "
            f"allowed [0, {(1 << bits) - 1}]; clamp them before packing."
        )
    return arr


def _check_words(packed: ArrayLike, bits: int, length: int, axis: int, what: str, pad: bool) -> NDArray[np.uint64]:
    arr = np.asarray(packed)
    if arr.dtype not in (np.dtype(np.int32), np.dtype(np.uint32)):
        raise ValueError(f"{what} must be int32 (or uint32) words, got dtype {arr.dtype}; pass the raw tensor.")
    if arr.ndim < 1:
        raise ValueError(f"{what} must have at least one dimension, got a scalar.")
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 0:
        raise ValueError(f"the unpacked length must be a non-negative int, got {length!r}.")
    words = _padded_length(int(length), bits, "values", pad) * bits // 32
    if arr.shape[axis] != words:
        raise ValueError(
            f"{what} has {arr.shape[axis]} words along the packed axis but {length} {bits}-bit values "
            f"need {words}; pass the original length."
        )
    return arr.view(np.uint32).astype(np.uint64)


def _zero_fill(arr: NDArray[np.integer], length: int) -> NDArray[np.integer]:
    """`arr` extended with zeros along axis 0 to `length`."""
    if arr.shape[0] == length:
        return arr
    return np.concatenate([arr, np.zeros((length - arr.shape[0], *arr.shape[1:]), dtype=arr.dtype)])


def _pack_axis0(codes: NDArray[np.integer], bits: int) -> NDArray[np.int32]:
    g, rest = _block(bits), codes.shape[1:]
    c = codes.astype(np.uint64).reshape(codes.shape[0] // g, g, *rest)
    out = np.zeros((c.shape[0], g * bits // 32, *rest), dtype=np.uint64)
    for i in range(g):
        w, s = divmod(i * bits, 32)
        out[:, w] |= (c[:, i] << np.uint64(s)) & _MASK32
        if s + bits > 32:  # 3-bit values 10 and 21 straddle into the next word
            out[:, w + 1] |= c[:, i] >> np.uint64(32 - s)
    return out.astype(np.uint32).view(np.int32).reshape(-1, *rest)


def _unpack_axis0(words: NDArray[np.uint64], bits: int, length: int) -> NDArray[np.uint8]:
    g, rest = _block(bits), words.shape[1:]
    wd = words.reshape(length // g, g * bits // 32, *rest)
    out = np.empty((wd.shape[0], g, *rest), dtype=np.uint8)
    mask = np.uint64((1 << bits) - 1)
    for i in range(g):
        w, s = divmod(i * bits, 32)
        v = wd[:, w] >> np.uint64(s)
        if s + bits > 32:
            v |= wd[:, w + 1] << np.uint64(32 - s)
        out[:, i] = v & mask
    return out.reshape(length, *rest)


def pack_rows(codes: ArrayLike, bits: int, pad: bool = False) -> NDArray[np.int32]:
    """Pack codes ``[K, ...]`` along axis 0 into int32 ``qweight`` ``[K*bits/32, ...]`` (pad: ``ceil``, zero-filled)."""
    _check_bits(bits)
    arr = _check_codes(codes, bits, "codes")
    return _pack_axis0(_zero_fill(arr, _padded_length(arr.shape[0], bits, "rows", pad)), bits)


def unpack_rows(qweight: ArrayLike, bits: int, k: int, pad: bool = False) -> NDArray[np.uint8]:
    """Inverse of :func:`pack_rows`: int32 ``[k*bits/32, ...]`` -> uint8 codes ``[k, ...]`` (pad: crop the fill)."""
    _check_bits(bits)
    words = _check_words(qweight, bits, k, 0, "qweight", pad)
    return _unpack_axis0(words, bits, words.shape[0] * 32 // bits)[: int(k)]


def pack_cols(zeros: ArrayLike, bits: int, pad: bool = False) -> NDArray[np.int32]:
    """Pack values ``[..., N]`` along the last axis into int32 ``qzeros`` ``[..., N*bits/32]`` (pad: as pack_rows)."""
    _check_bits(bits)
    arr = np.moveaxis(_check_codes(zeros, bits, "zeros"), -1, 0)
    packed = _pack_axis0(_zero_fill(arr, _padded_length(arr.shape[0], bits, "columns", pad)), bits)
    return np.ascontiguousarray(np.moveaxis(packed, 0, -1))


def unpack_cols(qzeros: ArrayLike, bits: int, n: int, pad: bool = False) -> NDArray[np.uint8]:
    """Inverse of :func:`pack_cols`: int32 ``[..., n*bits/32]`` -> uint8 values ``[..., n]`` (pad: crop the fill)."""
    _check_bits(bits)
    words = np.moveaxis(_check_words(qzeros, bits, n, -1, "qzeros", pad), -1, 0)
    return np.ascontiguousarray(np.moveaxis(_unpack_axis0(words, bits, words.shape[0] * 32 // bits)[: int(n)], 0, -1))


def to_v1_zeros(zeros: ArrayLike, bits: int) -> NDArray[np.int32]:
    """True (v2) zero points -> GPTQ v1 stored fields ``z - 1`` (unpacked, int32)."""
    _check_bits(bits)
    arr = _check_codes(zeros, bits, "zeros")
    if arr.size and int(arr.min()) == 0:
        raise ValueError(
            f"{int(np.count_nonzero(arr == 0))} zero point(s) equal 0, which GPTQ v1 cannot store "
            "(z - 1 = -1); write checkpoint_format='gptq_v2' instead."
        )
    return arr.astype(np.int32) - 1


def from_v1_zeros(stored: ArrayLike, bits: int) -> NDArray[np.int32]:
    """GPTQ v1 stored fields -> true zero points ``stored + 1`` (unpacked, int32).

    Like the per-field readers (vLLM, AutoGPTQ, convert_hf_to_gguf), a field of ``2**bits - 1``
    decodes to ``2**bits``; no quantizer produces that zero, it marks a v1 field whose true zero
    0 wrapped (docs/formats.md §2.5).
    """
    _check_bits(bits)
    return _check_codes(stored, bits, "stored zeros").astype(np.int32) + 1


def to_v1_words(qzeros: np.ndarray, bits: int) -> np.ndarray:
    """GPTQModel's v2 → v1 (convert_gptq_v2_to_v1_format_module): one subtracted per field, as a word constant at
    2/4/8 bits (only zero-filled padding fields borrow; v1 is written for symmetric zeros ≥ 1), field by field at 3."""
    if bits == 3:
        return pack_cols(unpack_cols(qzeros, 3, qzeros.shape[-1] * 32 // 3).astype(np.int32) - 1, 3)
    words = (qzeros.view(np.uint32).astype(np.int64) - V1_WORD_ADD[bits]) & 0xFFFFFFFF
    return words.astype(np.uint32).view(np.int32)
