"""The matgptq checkpoint's bit stream (`<name>.codes`, parent.py): each row of b-bit codes, 1 ≤ b ≤ 8, packed into
bytes, little-endian. Also the storage of the CPU's packed layers (runtime/packed.py)."""

from __future__ import annotations

import torch


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Row-wise little-endian bit stream of `bits`-bit codes: code k of a row occupies stream bits [k·b, (k+1)·b), and
    stream bit i is bit i mod 8 of byte ⌊i/8⌋ (the last byte zero-padded), uint8 [N, ⌈K·b/8⌉] on the codes' device.
    Eight codes fill b bytes: code j of each eight starts at bit j·b of them, so it adds its low bits to byte ⌊j·b/8⌋
    and, where it crosses a byte boundary, its high bits to the next."""
    c = codes.to(torch.uint8)
    if bits == 8:
        return c.contiguous().clone()
    rows, k = c.shape
    eights = torch.nn.functional.pad(c, (0, -k % 8)).view(rows, -1, 8)
    out = torch.zeros(rows, eights.shape[1], bits, dtype=torch.uint8, device=c.device)
    for j in range(8):
        byte, shift = divmod(j * bits, 8)
        out[..., byte] |= eights[..., j] << shift  # uint8: the bits past the byte drop out
        if shift + bits > 8:
            out[..., byte + 1] |= eights[..., j] >> (8 - shift)
    return out.view(rows, -1)[:, : -(-k * bits // 8)].contiguous()


def unpack_bits(packed: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """Inverse of pack_bits: uint8 codes [N, k], on the stream's device (code j of each eight read back from the bytes
    pack_bits put it in)."""
    if bits == 8:
        return packed[:, :k].contiguous()
    rows, runs = packed.shape[0], -(-k // 8)
    stream = torch.nn.functional.pad(packed, (0, runs * bits - packed.shape[1])).view(rows, runs, bits)
    out = torch.empty(rows, runs, 8, dtype=torch.uint8, device=packed.device)
    for j in range(8):
        byte, shift = divmod(j * bits, 8)
        code = stream[..., byte] >> shift
        if shift + bits > 8:
            code = code | (stream[..., byte + 1] << (8 - shift))
        out[..., j] = code & ((1 << bits) - 1)
    return out.view(rows, -1)[:, :k].contiguous()
