"""Matryoshka slicing: read an r-bit model out of c-bit master codes.

The rule is the official MatGPTQ implementation's `matryoshka_slice` (IST-DASLab/MatGPTQ; docs/formats.md §1.6),
generalised from its hard-coded 8-bit storage to any master width c:

    S(q, r) = min(⌊q / 2^(c−r)⌋ + bit_(c−r−1)(q), 2^r − 1)   for r < c   (top r bits + the next bit as a rounding carry,
    S(q, c) = q                                                          saturating at the top code)

and a slice is dequantized on the master grid with the master zero z and the master scale s — or, in a parent with
per-width scales (format v2, quantization/algorithm/refit.py), that width's own s_r:

    deq_r(q) = s_r · (S(q, r) · 2^(c−r) − z),   s_r = s unless the parent stores one for r.

`S(q, r)·2^(c−r)` is the slice's position on the master grid; `positions(...)` returns it.
"""

from __future__ import annotations

import torch


def slice_codes(codes: torch.Tensor, master_bits: int, bits: int) -> torch.Tensor:
    """S(q, r) for integer master codes `codes` (any integer dtype); same dtype out."""
    if not 1 <= bits <= master_bits:
        raise ValueError(f"slice width {bits} must be between 1 and the master width {master_bits}")
    if bits == master_bits:
        return codes
    drop = master_bits - bits
    q = codes.to(torch.int32)
    sliced = (q >> drop) + ((q >> (drop - 1)) & 1)
    return sliced.clamp_(max=(1 << bits) - 1).to(codes.dtype)


def positions(codes: torch.Tensor, master_bits: int, bits: int) -> torch.Tensor:
    """S(q, r) · 2^(c−r): where the r-bit slice of each code sits on the master grid (int32)."""
    return slice_codes(codes.to(torch.int32), master_bits, bits) << (master_bits - bits)


def position_table(master_bits: int, widths: tuple[int, ...]) -> torch.Tensor:
    """Table D[i, q] = positions(q, c, widths[i]) for every master code q: int32 [len(widths), 2^c]."""
    q = torch.arange(1 << master_bits, dtype=torch.int32)
    return torch.stack([positions(q, master_bits, r) for r in widths])
