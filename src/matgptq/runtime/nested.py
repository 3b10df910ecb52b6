"""A quantized Linear served by the nested Triton kernels: its bit planes stay packed where the model runs (the GPU).

Storage (buffers, the layout of kernels/bitplanes.py): `planes` int32 [P, ⌈K/32⌉, N], plane p holding one bit of
every code, most significant first, 32 columns per word along K; `scale{r}` float16 [G, N] for each width with its
own scales (the master's under the master width c); `zeros` uint8 [G, N] on the master grid; `perm` int64 [K] for
act-order layers (the input's columns in group order), else None. What the planes hold is the `Resident` choice:

- Resident.SLICE: the r planes of the slice S(q, r) alone (NestedLayout.build(q.slice(r)); at r = c the parent's c
  planes): r bits per weight, the memory of a slice file, serving r only. Another width is a new module built from
  the parent held in memory (loader.set_bits).
- Resident.PARENT: all c planes of the parent (NestedLayout.build(q)), serving every width 1..c: `set_width(r)`
  changes one integer and copies no weight.

Arithmetic: y = x Ŵ_rᵀ + b, Ŵ_r = s_r[g, n]·(S(q, r)·2^(c−r) − z[g, n]), rebuilt tile by tile in float32 by
kernels/triton_nested.nested_matmul (accumulation error derived in tests/kernels/test_triton_nested.py); y has x's
dtype. `dequantized_weight()` is the same Ŵ_r read back exactly (NestedLayout.dequantize) in the model's dtype.
"""

from __future__ import annotations

import importlib
from enum import Enum

import torch
from torch import nn

from ..errors import UserError
from ..formats import QuantizedWeight
from ..kernels import NestedLayout
from ..kernels.triton_nested import nested_matmul


class Resident(str, Enum):
    SLICE = "slice"  # the loaded width's r planes alone: r bits per weight, one width
    PARENT = "parent"  # the parent's c planes: every width, switched in place


RESIDENT_CHOICES = (
    "slice (the loaded width's planes alone: about r bits per weight; set_bits rebuilds a layer from "
    "the parent in memory) or parent (all the parent's planes: set_bits switches every width in "
    "place, copying no weight)"
)


def resident_choice(value: Resident | str) -> Resident:
    """`value` as a Resident; anything else is a one-line UserError listing the choices."""
    try:
        return Resident(value)
    except ValueError:
        raise UserError(f"resident={value!r} is not a choice; use {RESIDENT_CHOICES}") from None


def kernels_missing() -> str | None:
    """Why this process cannot run the nested kernels (Triton does not import), or None."""
    try:
        importlib.import_module("triton")
    except ImportError:
        return "the nested GPU kernels need Triton: pip install 'matgptq[kernels]'"
    return None


class NestedLinear(nn.Module):
    """y = x Ŵ_rᵀ + b from nested bit planes (module docstring); UserError where the layout cannot hold `parent`."""

    def __init__(
        self,
        parent: QuantizedWeight,
        bits: int,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        resident: Resident | str = Resident.SLICE,
    ) -> None:
        super().__init__()
        self.resident = resident_choice(resident)
        if self.resident is Resident.SLICE:
            try:
                parent = parent.slice(bits)
            except ValueError as e:  # a width the checkpoint does not hold
                raise UserError(str(e)) from None
        layout = NestedLayout.build(parent)
        layout.check(bits)
        self.out_features, self.in_features = parent.shape
        self.bits, self.dtype = bits, dtype
        self.group_size, self.master_bits, self.sliced = layout.group_size, layout.master_bits, layout.sliced
        self.scale_widths = tuple(sorted(layout.scales))
        self.register_buffer("planes", layout.planes)
        for r in self.scale_widths:
            self.register_buffer(f"scale{r}", layout.scales[r])
        self.register_buffer("zeros", layout.zeros)
        self.register_buffer("perm", layout.perm)
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(dtype).clone(), requires_grad=False)

    def layout(self) -> NestedLayout:
        """The NestedLayout over this module's buffers, wherever they are (a view: nothing is copied)."""
        return NestedLayout(
            planes=self.planes,
            scales={r: getattr(self, f"scale{r}") for r in self.scale_widths},
            zeros=self.zeros,
            group_size=self.group_size,
            master_bits=self.master_bits,
            in_features=self.in_features,
            perm=self.perm,
            sliced=self.sliced,
        )

    @property
    def widths(self) -> tuple[int, ...]:
        """The widths this layer serves: its own alone (SLICE), or every width of the parent (PARENT)."""
        return self.layout().widths if self.resident is Resident.PARENT else (self.bits,)

    def set_width(self, bits: int) -> None:
        """Compute with width `bits` from here on (PARENT: no weight is copied)."""
        if bits == self.bits:
            return
        if self.resident is Resident.SLICE:
            raise UserError(
                f"this layer holds its {self.bits}-bit slice alone and serves no other width ({bits} "
                "asked); load with resident='parent' to switch widths in place"
            )
        self.layout().check(bits)
        self.bits = bits

    def dequantized_weight(self) -> torch.Tensor:
        return self.layout().dequantize(self.bits).to(self.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nested_matmul(x, self.layout(), self.bits)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
            f"resident={self.resident.value}, planes={self.planes.shape[0]}"
        )
