"""`QuantizedWeight`: the integer form of one Linear weight, shared by checkpoints, slicing, runtime and exports; and
`Checkpoint`, a quantized model as every reader returns it (parent.py, gptq/, compressed_tensors/).

    W[n, k] = scale[n, g] · (code[n, k] · 2^shift − zero[n, g]),   g = g_idx[k]

A GPTQ/RTN layer and a MatGPTQ parent have shift = 0. An r-bit slice of a c-bit parent keeps the parent's zero and
has codes S(q, r) with shift = c − r (slicing.py), so every slice is exact, including asymmetric ones whose zero is not
a multiple of 2^(c−r). Its scale is the parent's, or, where the parent holds per-width scales (`width_scales`, the
least-squares refit of quantization/algorithm/refit.py), the r-bit ones. Scales are float16 values; the product above is exact
in float32.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .slicing import slice_codes


@dataclass(frozen=True)
class QuantizedWeight:
    codes: torch.Tensor  # uint8 [N, K] (out, in), original column order
    scales: torch.Tensor  # float16 [N, G]
    zeros: torch.Tensor  # uint8 [N, G], on the master grid
    g_idx: torch.Tensor  # int32 [K]
    bits: int  # width of `codes`
    shift: int = 0
    perm: torch.Tensor | None = None  # act-order processing order (informational; g_idx already encodes groups)
    width_scales: dict[int, torch.Tensor] | None = None  # parent only: width r < bits -> float16 [N, G] for its slice

    @property
    def master_bits(self) -> int:
        return self.bits + self.shift

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)  # type: ignore[return-value]

    def to(self, device: torch.device | str) -> "QuantizedWeight":
        """This weight with every tensor on `device` (itself where they are there already)."""
        device = torch.device(device)
        if self.codes.device == device:
            return self
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        scales = {r: move(t) for r, t in self.width_scales.items()} if self.width_scales else None
        return replace(
            self,
            codes=move(self.codes),
            scales=move(self.scales),
            zeros=move(self.zeros),
            g_idx=move(self.g_idx),
            perm=move(self.perm),
            width_scales=scales,
        )

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        idx = self.g_idx.long()
        scale = self.scales.float()[:, idx]
        zero = self.zeros.float()[:, idx]
        return (scale * (self.codes.float() * float(1 << self.shift) - zero)).to(dtype)

    def slice(self, bits: int) -> "QuantizedWeight":
        """The r-bit slice of this (parent) weight; r == bits returns self."""
        if bits == self.bits:
            return self
        if self.shift:
            raise ValueError(f"this weight is already a {self.bits}-bit slice; slice the parent instead")
        if not 2 <= bits <= self.bits:
            raise ValueError(f"cannot slice {bits} bits out of a {self.bits}-bit parent (use 2..{self.bits})")
        scales = self.width_scales[bits] if self.width_scales and bits in self.width_scales else self.scales
        return replace(
            self,
            codes=slice_codes(self.codes, self.bits, bits),
            scales=scales,
            bits=bits,
            shift=self.bits - bits,
            width_scales=None,
        )


def width_scale_name(name: str, bits: int) -> str:
    """Where a parent file keeps layer `name`'s scales for its `bits`-wide slice (formats/parent.py)."""
    return f"{name}.scales.{bits}"


def width_scale_tensors(name: str, q: QuantizedWeight) -> dict[str, torch.Tensor]:
    """The tensors a parent file stores for `q`'s per-width scales (none without them)."""
    widths = sorted((q.width_scales or {}).items())
    return {width_scale_name(name, r): s.to(torch.float16).contiguous() for r, s in widths}


@dataclass
class Checkpoint:
    """A quantized model read from disk: its quantized layers, the unquantized tensors and the records beside them."""

    meta: dict
    config: dict  # HF config.json without quantization_config
    layers: dict[str, QuantizedWeight]
    tensors: dict[str, torch.Tensor]  # unquantized tensors
    path: Path

    @property
    def stored_bits(self) -> int:
        return max(q.bits for q in self.layers.values())
