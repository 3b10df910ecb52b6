"""A quantized Linear that keeps its r-bit codes packed: the memory of a slice is r bits per weight (plus fp16 scales,
uint8 zeros and the group index), not that of a float matrix.

Storage (buffers): `packed` uint8 [N, ⌈K·r/8⌉], the row-wise little-endian bit stream of formats.parent.pack_bits
(code k of a row in stream bits [k·r, (k+1)·r)); `scales` fp16 [N, G]; `zeros` uint8 [N, G] on the master grid;
`g_idx` int32 [K]. Forward: the weight is dequantized by QuantizedWeight.dequantize itself
(Ŵ = s[:, g] · (q · 2^shift − z[:, g]) in float32, cast to the model dtype) and multiplied with torch's own matmul,
so outputs equal those of the float model `matgptq.load(..., packed=False)` bit for bit (tested). The dequantized
weight lives only during the call (one layer at a time): this trades speed for memory; kernels that never
materialise it are issue #14's next step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..formats import QuantizedWeight
from ..formats.parent import pack_bits


def unpack_rows(packed: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """Inverse of pack_bits in torch: uint8 codes [N, k]."""
    if bits == 8:
        return packed[:, :k]
    planes = (packed[..., None] >> torch.arange(8, dtype=torch.uint8)) & 1  # [N, bytes, 8], little-endian bits
    planes = planes.reshape(packed.shape[0], -1)[:, : k * bits].reshape(packed.shape[0], k, bits)
    return (planes << torch.arange(bits, dtype=torch.uint8)).sum(-1, dtype=torch.uint8)


class PackedLinear(nn.Module):
    """y = x Ŵᵀ + b from packed r-bit codes (module docstring)."""

    def __init__(self, q: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.bits, self.shift, self.dtype = q.bits, q.shift, dtype
        self.register_buffer("packed", pack_bits(q.codes, q.bits))
        self.register_buffer("scales", q.scales.to(torch.float16).contiguous())
        self.register_buffer("zeros", q.zeros.to(torch.uint8).contiguous())
        self.register_buffer("g_idx", q.g_idx.to(torch.int32).contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    def dequantized_weight(self) -> torch.Tensor:
        codes = unpack_rows(self.packed, self.bits, self.in_features)
        return QuantizedWeight(codes, self.scales, self.zeros, self.g_idx, self.bits, self.shift).dequantize(self.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantized_weight(), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}"


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer of `model` (tied tensors once)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total
