"""Group scales on llama.cpp's K-quant lattice, so a GGUF K-quant holds the solver's weights exactly.

A K-quant super-block (256 columns of one row) stores one float16 super-scale d and, per sub-block of 16 or 32
columns, a small integer sub-scale sc; its reader computes the sub-block's scale as fp32(d)·sc (docs/formats.md
§3.5–3.7; IST-DASLab's gptq-gguf-toolkit constrains GPTQ the same way). This project's group scales are
float16 (formats/quantized.py), so a symmetric grid is exact in both when, per row and super-block,

    s_g = d·sc_g,   sc_g ∈ [1, SC_MAX],   d float16 with at most 11 − bitlen(SC_MAX) significant bits

(then every d·sc_g has ≤ 11 significant bits: float16-exact, and exact in float32). Each type holds the symmetric
b-bit grid w = s·(q − 2^(b−1)) with its own fields (formats/gguf/tensors.py): Q3_K and Q6_K as
w = d·sc·(q − 4 | 32);
Q2_K, Q4_K and Q5_K as w = d·sc·q − dmin·m with dmin = 2^(b−1)·d and m = sc, so m ≤ SC_MAX too. SC_MAX is the
largest positive sub-scale of the type (Q2_K's 4-bit scales and mins: 15; Q3_K's signed 6-bit: 31; Q4_K/Q5_K's
6-bit: 63; Q6_K's int8: 127), and a lattice for a type also fits every type with a larger SC_MAX and a sub-block that
divides its group. An r-bit slice of a c-bit parent has scale s·2^(c−r) = (d·2^(c−r))·sc: the same lattice.

Q3_K and Q6_K store signed sub-scales, so their lattices also hold `--signed-scale` grids (llama.cpp Q4_0's: the
scale takes the sign of the group's extreme weight): s_g = d·sc_g with |sc_g| ∈ [1, SC_MAX] and d from the largest
|s_g|. The min types (Q2_K, Q4_K, Q5_K) cannot: w = d·sc·q − dmin·m needs sc ≥ 0.

d is the largest group scale of the super-block / SC_MAX, rounded *up* to its significant bits (so no sc exceeds
SC_MAX), and sc = round(s/d): a group scale moves by at most d/2 ≤ (1 + 2^(1−p))·max_g s_g / (2·SC_MAX), p the
significant bits of d: the same order as llama.cpp's own 6-bit sub-scales.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...formats.gguf import KQuantType

SUPER_BLOCK = 256
F16_SIGNIFICAND = 11  # bits, including the implicit one
F16_MIN_STEP = 2.0**-24  # spacing of float16 subnormals


@dataclass(frozen=True)
class ScaleLattice:
    sub_block: int  # columns sharing one sub-scale
    sc_max: int  # largest positive integer sub-scale
    signed: bool = False  # the type stores signed sub-scales (sc ∈ [−sc_max, sc_max] here)

    @property
    def d_bits(self) -> int:
        """Significant bits of d that keep every d·sc (sc ≤ sc_max) float16-exact."""
        return F16_SIGNIFICAND - self.sc_max.bit_length()

    def super_scales(self, scales: torch.Tensor, group_size: int) -> torch.Tensor:
        """d for every group of `scales` [N, G] (groups of `group_size` contiguous columns): the super-block's
        largest |scale| / sc_max, rounded up to `d_bits` significant bits (and to the float16 subnormal step)."""
        per_super = SUPER_BLOCK // group_size
        n, g = scales.shape
        pad = -g % per_super
        s = torch.nn.functional.pad(scales.double().abs(), (0, pad)).view(n, -1, per_super)
        x = s.amax(-1) / self.sc_max
        _, exp = torch.frexp(x)  # x = m·2^exp, m ∈ [0.5, 1)
        step = torch.clamp(torch.ldexp(torch.ones_like(x), exp - self.d_bits), min=F16_MIN_STEP)
        d = torch.ceil(x / step) * step
        return d.repeat_interleave(per_super, dim=1)[:, :g]

    def snap(self, scales: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """`scales` moved to the nearest d·sc with |sc| ∈ [1, sc_max], sc of the scale's sign (same shape, dtype)."""
        s = scales.double()
        if not self.signed and (s < 0).any():
            raise ValueError("negative scales on a K-quant lattice whose sub-scales are unsigned")
        sign = torch.where(s < 0, -1.0, 1.0).to(s.dtype)
        sc = torch.clamp(torch.round(s.abs() / d), 1, self.sc_max)
        return (d * sign * sc).to(scales.dtype)


LATTICES: dict[KQuantType, ScaleLattice] = {
    KQuantType.Q2_K: ScaleLattice(16, 15),
    KQuantType.Q3_K: ScaleLattice(16, 31, signed=True),
    KQuantType.Q4_K: ScaleLattice(32, 63),
    KQuantType.Q5_K: ScaleLattice(32, 63),
    KQuantType.Q6_K: ScaleLattice(16, 127, signed=True),
}


def lattice_for(kquant: KQuantType | None, group_size: int, in_features: int) -> ScaleLattice | None:
    """The lattice a layer's scales must lie on, or None where nothing constrains them: no K-quant asked; one scale
    per super-block (group ≥ 256, per channel: d = s, sc = 1 is exact already); rows K-quants cannot hold
    (in_features not a multiple of 256; GGUF export gives those a legacy type)."""
    if kquant is None or group_size == -1 or group_size % SUPER_BLOCK == 0 or in_features % SUPER_BLOCK:
        return None
    return LATTICES[KQuantType(kquant)]


def check_group_size(kquant: KQuantType, group_size: int) -> str | None:
    """Why `group_size` cannot lie on `kquant`'s super-blocks, or None."""
    lat = LATTICES[KQuantType(kquant)]
    if group_size == -1 or group_size % SUPER_BLOCK == 0:
        return None
    if SUPER_BLOCK % group_size or group_size % lat.sub_block:
        sizes = [g for g in (16, 32, 64, 128) if g % lat.sub_block == 0]
        return (
            f"group size {group_size} does not tile {KQuantType(kquant).value.upper()}'s super-blocks; use "
            f"{', '.join(map(str, sizes))}, a multiple of {SUPER_BLOCK} or -1"
        )
    return None
