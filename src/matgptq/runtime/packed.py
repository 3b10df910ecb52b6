"""A quantized Linear that keeps its r-bit codes packed: the memory of a slice is r bits per weight (plus fp16 scales,
uint8 zeros and the group index), not that of a float matrix.

Storage (buffers): `packed` uint8 [N, ⌈K·r/8⌉], the row-wise little-endian bit stream of formats.bitstream.pack_bits
(code k of a row in stream bits [k·r, (k+1)·r)); `scales` fp16 [N, G]; `zeros` uint8 [N, G] on the master grid;
`g_idx` int32 [K]. Forward: the weight is dequantized by QuantizedWeight.dequantize itself
(Ŵ = s[:, g] · (q · 2^shift − z[:, g]) in float32, cast to the model dtype) and multiplied with torch's own matmul,
so outputs equal those of the float model `matgptq.load(..., packed=False)` bit for bit (tested). The dequantized
weight lives only during the call (one layer at a time): this trades speed for memory.

Kernel.INT4 (the default for bfloat16 models, where torch has a vectorised int4 kernel; int4_cpu.py): the codes are
held in torch's int4 layout (4 bits per weight for r ≤ 4, two planes for r ≤ 8) with bfloat16 scale/zero pairs, and
calls of fewer than PREFILL_ROWS rows (PREFILL_ROWS / 2 for two planes; decode and ordinary prompts) go through
`_weight_int4pack_mm_for_cpu`: outputs equal the dequantized reference within the tolerance derived in
tests/runtime/test_int4_cpu.py (the kernel's scales are rounded to bfloat16). Larger calls (long prompts) read the
codes back, dequantize exactly like the bit-stream path and use F.linear, so they equal the reference bit for bit.
Kernel.BITSTREAM keeps the smallest memory (r bits per weight).
"""

from __future__ import annotations

from enum import Enum

import torch
import torch.nn.functional as F
from torch import nn

from ..formats import QuantizedWeight
from ..formats.bitstream import pack_bits, unpack_bits
from .int4_cpu import build, int4_codes, int4_dequantize, int4_matmul

# Rows per call from which the int4 path dequantizes (exactly, int4_cpu.int4_dequantize) and uses F.linear instead of
# the kernel, for a one-plane layer (r ≤ 4); a two-plane layer (r > 4) calls the kernel twice, so its break-even is
# half as many rows. The kernel's cost grows linearly with the rows, dequantization costs a fixed amount per call plus
# a dense matmul, so the kernel wins for few rows and dequantization for many; the crossing depends on the shape and
# the machine (research/bench_prefill_rows.py, at commit 748a49c, measured it).
PREFILL_ROWS = 256


class Kernel(str, Enum):
    AUTO = "auto"  # INT4 for bfloat16 layers the kernel can serve, else BITSTREAM
    INT4 = "int4"  # torch's int4 weight-only CPU matmul (int4_cpu.py); BITSTREAM where it cannot serve the layer
    BITSTREAM = "bitstream"  # r-bit row stream, dequantized per call (exact, smallest)


class PackedLinear(nn.Module):
    """y = x Ŵᵀ + b from packed r-bit codes (module docstring)."""

    def __init__(
        self, q: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype, kernel: Kernel = Kernel.AUTO
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.bits, self.shift, self.dtype = q.bits, q.shift, dtype
        kernel = Kernel(kernel)
        ops = None
        if kernel == Kernel.INT4 or (kernel == Kernel.AUTO and dtype == torch.bfloat16):
            ops = build(q.codes, q.scales, q.zeros, q.g_idx, q.bits, q.shift, torch.bfloat16)
        self.kernel = Kernel.BITSTREAM if ops is None else Kernel.INT4
        if ops is None:
            self.register_buffer("packed", pack_bits(q.codes, q.bits))
        else:
            planes, sz, self.group, perm, groups = ops
            self.planes = len(planes)
            for i, (w, z) in enumerate(zip(planes, sz)):
                self.register_buffer(f"plane{i}", w)
                self.register_buffer(f"scale_zero{i}", z)
            self.register_buffer("perm", perm)
            self.register_buffer("kernel_scales", q.scales.to(torch.float16)[:, groups].contiguous())
            self.register_buffer("kernel_zeros", q.zeros.to(torch.uint8)[:, groups].contiguous())
        self.register_buffer("scales", q.scales.to(torch.float16).contiguous())
        self.register_buffer("zeros", q.zeros.to(torch.uint8).contiguous())
        self.register_buffer("g_idx", q.g_idx.to(torch.int32).contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    def _int4(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        n = range(self.planes)
        return [getattr(self, f"plane{i}") for i in n], [getattr(self, f"scale_zero{i}") for i in n]

    def codes(self) -> torch.Tensor:
        if self.kernel == Kernel.INT4:
            return int4_codes(self._int4()[0], self.perm, self.out_features, self.in_features).to(torch.uint8)
        return unpack_bits(self.packed, self.bits, self.in_features)

    def dequantized_weight(self) -> torch.Tensor:
        if self.kernel == Kernel.INT4:
            return int4_dequantize(
                self._int4()[0], self.perm, self.kernel_scales, self.kernel_zeros, self.group, self.shift, self.dtype
            )
        q = QuantizedWeight(self.codes(), self.scales, self.zeros, self.g_idx, self.bits, self.shift)
        return q.dequantize(self.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            self.kernel == Kernel.INT4
            and x.dtype == torch.bfloat16
            and x.device.type == "cpu"
            and x.numel() * self.planes < PREFILL_ROWS * self.in_features
        ):
            planes, sz = self._int4()
            y = int4_matmul(x, planes, sz, self.group, self.perm)
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.dequantized_weight(), self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
            f"kernel={self.kernel.value}"
        )


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer of `model` (tied tensors once)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total
