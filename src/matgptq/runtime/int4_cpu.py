"""A slice's weight on torch's int4 weight-only CPU matmul (`aten._weight_int4pack_mm_for_cpu`), the fast decode path.

What the kernel computes (on torch at TORCH, exporters/tested.py; checked by tests/runtime/test_int4_cpu.py against
the formula below):

    y[m, n] = Σ_k x[m, k] · ((q[n, k] − 8) · SZ[k // gs, n, 0] + SZ[k // gs, n, 1]),   q ∈ [0, 15]

with `q` given to `_convert_weight_to_int4pack_for_cpu(int32 [N, K], 1)` (which wants N % 16 == 0, K even), group
size gs ∈ {32, 64, 128, 256} dividing K, and SZ of x's dtype. Only bfloat16 has a vectorised path here (float32 and
float16 are slower than a dense F.linear), so PackedLinear uses it for bfloat16 models only.

Mapping a slice W = s · (q · 2^h − z) (formats/quantized.py, h = c − r) onto it, per group:

    r ≤ 4:   one plane q,             scale = s·2^h,        zero = s·(8·2^h − z)
    r 5..8:  two planes q = 16·a + b:  a: scale = 16·s·2^h,  zero = s·(8·16·2^h − z);   b: scale = s·2^h, zero = 8·s·2^h

(expand (q − 8)·scale + zero: it gives s·(q·2^h − z), resp. the sum of both planes does). All of these products of
an fp16 scale and an integer below 2^12 are exact in float32 and are rounded once to bfloat16. A 2- or 3-bit code
uses the 4-bit kernel (its values < 8 are valid int4 codes), so such a layer holds 4 bits per weight, 8 for r > 4.

Groups: the kernel's group of column k is k // gs. Act-order groups (g_idx not monotone) are made contiguous by
permuting the columns once (stable sort of g_idx; x is gathered with the same permutation per call); gs is the largest
of 256/128/64/32 that divides K and inside whose blocks the sorted group index is constant (a 128-column parent group
on K = 576 gives gs = 64, its last group being 64 wide). Anything else (N % 16 ≠ 0, K odd, groups no kernel size
fits) → None: the caller keeps the bit-stream path.

The packed layout depends on the CPU build torch dispatches to (aten/src/ATen/native/cpu/int4mm_kernel.cpp,
`weight_to_int4pack_kernel`): rows in blocks of B, each block stored as bytes [K, B/2]. With AVX-512, B = 64 and byte
j holds row j (low nibble) and row j + 32 (high); with AVX2, B = 32 and byte j holds rows j and j + 16; a last block
of fewer rows (a multiple of 16), and every block of the plain build (B = 32), holds rows 2j and 2j + 1 in byte j.
`layout` finds which of these this process's torch writes by packing random codes once and reading them back; where
none matches (another torch, another CPU family) the kernel is not used, so no slice is ever read in a wrong layout.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import torch

ops = torch.ops.aten
KERNEL_GROUPS = (256, 128, 64, 32)  # the group sizes _weight_int4pack_mm_for_cpu accepts, largest first


def kernel_group_size(g_sorted: torch.Tensor) -> int | None:
    """Largest kernel group size gs with K % gs == 0 and g_sorted constant on each block of gs columns."""
    k = g_sorted.numel()
    for gs in KERNEL_GROUPS:
        if k % gs == 0:
            blocks = g_sorted.view(-1, gs)
            if torch.equal(blocks, blocks[:, :1].expand_as(blocks)):
                return gs
    return None


class Layout(NamedTuple):
    block: int  # rows per block
    split: bool  # a full block's byte j holds rows j and j + block/2 (else rows 2j and 2j + 1)


LAYOUTS = (Layout(64, True), Layout(32, True), Layout(32, False))  # AVX-512, AVX2, the plain build


def unpack_int4pack(w: torch.Tensor, n: int, k: int, lay: Layout | None = None) -> torch.Tensor:
    """int32 codes [N, K] from `_convert_weight_to_int4pack_for_cpu`'s uint8 [N, K/2] (module doc), in the layout
    `lay` (default: this process's, `layout()`)."""
    block, split = lay or _found()
    flat, full = w.reshape(-1), n // block * block
    rows = []
    if split and full:
        head = flat[: full * k // 2].view(n // block, k, block // 2)  # byte j: row j (low nibble), j + block/2 (high)
        rows.append(torch.cat([head & 15, head >> 4], dim=-1).permute(0, 2, 1).reshape(full, k))
    elif full:
        head = flat[: full * k // 2].view(n // block, k, block // 2)  # byte j: rows 2j (low), 2j + 1 (high)
        rows.append(
            torch.stack([head & 15, head >> 4], dim=-1).view(n // block, k, block).permute(0, 2, 1).reshape(full, k)
        )
    if n > full:
        tail = flat[full * k // 2 :].view(k, (n - full) // 2)  # byte j: rows 2j (low), 2j + 1 (high)
        rows.append(torch.stack([tail & 15, tail >> 4], dim=-1).view(k, n - full).t())
    return torch.cat(rows).to(torch.int32)


@lru_cache(maxsize=1)
def layout() -> Layout | None:
    """The layout this process's torch packs in: the one of LAYOUTS that reads back random codes of 208 rows (full
    blocks of 64 and of 32, and a last block of 16) exactly; None if none does."""
    q = torch.randint(0, 16, (208, 64), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    try:
        packed = ops._convert_weight_to_int4pack_for_cpu(q, 1)
    except (RuntimeError, NotImplementedError):  # a torch build without the CPU kernel
        return None
    return next((lay for lay in LAYOUTS if torch.equal(unpack_int4pack(packed, 208, 64, lay), q)), None)


def _found() -> Layout:
    found = layout()
    if found is None:  # build() returns None first, so no PackedLinear reads planes without a layout
        raise RuntimeError("torch's int4 CPU packing is in no known layout")
    return found


def build(codes, scales, zeros, g_idx, bits, shift, dtype=torch.bfloat16):
    """The kernel operands of a slice (mapping in the module doc): (planes, scale_zeros, gs, perm, groups) with 1
    plane for r ≤ 4, 2 for r ≤ 8, perm None when the groups are in order and groups[j] the parent group of kernel
    group j; None when the kernel cannot serve the layer."""
    n, k = codes.shape
    if bits > 8 or n % 16 or k % 2 or layout() is None:
        return None
    g = g_idx.long()
    perm = torch.argsort(g, stable=True)
    g_sorted = g[perm]
    gs = kernel_group_size(g_sorted)
    if gs is None:
        return None
    if torch.equal(perm, torch.arange(k)):
        perm = None
    else:
        codes = codes[:, perm]
    groups = g_sorted[::gs]  # parent group of each kernel group
    s = scales.float()[:, groups].t()  # [G', N], fp16 values: every product below is exact in float32
    z = zeros.float()[:, groups].t()
    step = float(1 << shift)
    q = codes.to(torch.int32)
    if bits <= 4:
        parts = [(q, s * step, s * (8 * step - z))]
    else:
        parts = [(q >> 4, s * (16 * step), s * (128 * step - z)), (q & 15, s * step, s * (8 * step))]
    planes = [ops._convert_weight_to_int4pack_for_cpu(p.contiguous(), 1) for p, _, _ in parts]
    sz = [torch.stack([sc, ze], dim=-1).to(dtype).contiguous() for _, sc, ze in parts]
    return planes, sz, gs, None if perm is None else perm.to(torch.int32), groups


def int4_matmul(x: torch.Tensor, planes, scale_zeros, gs: int, perm: torch.Tensor | None) -> torch.Tensor:
    """x [..., K] (bfloat16) → x Ŵᵀ [..., N] through the kernel, one call per plane."""
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    if perm is not None:
        x = x.index_select(1, perm)
    x = x.contiguous()
    y = ops._weight_int4pack_mm_for_cpu(x, planes[0], gs, scale_zeros[0])
    for w, sz in zip(planes[1:], scale_zeros[1:]):
        y = y + ops._weight_int4pack_mm_for_cpu(x, w, gs, sz)
    return y.view(*shape[:-1], y.shape[-1])


def _sorted_codes(planes, n: int, k: int) -> torch.Tensor:
    q = unpack_int4pack(planes[0], n, k)
    return q if len(planes) == 1 else (q << 4) | unpack_int4pack(planes[1], n, k)


def int4_dequantize(planes, perm, scales, zeros, gs: int, shift: int, dtype: torch.dtype) -> torch.Tensor:
    """Ŵ [N, K] from the planes with QuantizedWeight.dequantize's float32 arithmetic, s · (q · 2^h − z) in that order,
    so bit-identical to it; per kernel group instead of per column (no [N, K] gather of scales).
    `scales`/`zeros` [N, K/gs] are the parent's per kernel group (sorted column order)."""
    n, k = scales.shape[0], scales.shape[1] * gs
    q = _sorted_codes(planes, n, k).view(n, -1, gs).float()
    w = (scales.float()[..., None] * (q * float(1 << shift) - zeros.float()[..., None])).view(n, k).to(dtype)
    if perm is None:
        return w
    out = torch.empty_like(w)
    out[:, perm.long()] = w
    return out


def int4_codes(planes, perm: torch.Tensor | None, n: int, k: int) -> torch.Tensor:
    """The slice codes [N, K] (int32) in the original column order, read back from the planes."""
    q = _sorted_codes(planes, n, k)
    if perm is not None:
        out = torch.empty_like(q)
        out[:, perm.long()] = q
        q = out
    return q
