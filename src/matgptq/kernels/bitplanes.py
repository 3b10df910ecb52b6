"""The nested bit-plane layout: one stored parent serves every width r without re-packing.

The slicing rule S(q, r) (formats/slicing.py, docs/formats.md §1.6) reads exactly the top r + 1 bits of q:
⌊q / 2^(c−r)⌋ is bits c−1 … c−r and the rounding carry is bit c−r−1. So the layout stores q as c one-bit planes, most
significant first — plane p holds bit c−1−p of every code — and width r reads planes 0 … r (r + 1 planes; r = c reads
all c):

    top   = Σ_{p<r} plane_p · 2^(r−1−p)              (= ⌊q / 2^(c−r)⌋)
    carry = plane_r                  (r < c; 0 at r = c)
    S     = min(top + carry, 2^r − 1)

which is S(q, r) bit for bit, including the saturation at the top code. The weight is the slice's (quantized.py),
with the parent's master zero and the width's own scales where the parent has them (width_scales), else the master
scale. A layout may keep only the top P planes (`widths=` at build: P = the planes the widest requested width needs);
it then serves the widths r with r + 1 ≤ P (and r = c when P = c); any other width is a UserError naming the widths
it serves.

A layout built from an r-bit slice (shift c − r > 0) instead stores S itself in r planes (`sliced`: plane p = bit
r−1−p of S, no carry plane) and serves r alone: r bits per weight, the memory of the slice.

Memory: P bits per weight plus fp16 scales per stored width and uint8 zeros, for all widths ≤ P − 1 at once (the
MatGPTQ paper's kernel stores 2-bit + 1-bit planes for 2–4 bits, i.e. without the rounding bit; here the extra plane
makes its rule exact). Packing: plane p, column k (after sorting columns by group, see below), row n is bit (k mod 32)
of the int32 word planes[p, k // 32, n] — K-major so that a GPU tile of BLOCK_K × BLOCK_N loads whole words along N
(coalesced); K is zero-padded to a multiple of 32. Groups are made contiguous (group of column k = k // group_size) by
a stable sort of the parent's g_idx; act-order layers therefore carry `perm` and the input is gathered with it, like
the CPU int4 path (runtime/int4_cpu.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import UserError
from ..formats import QuantizedWeight


@dataclass(frozen=True)
class NestedLayout:
    planes: torch.Tensor  # int32 [P, ⌈K/32⌉, N], plane p = bit c−1−p of the (column-sorted) codes
    scales: dict[int, torch.Tensor]  # width → float16 [G, N] (the master scale under the master width c)
    zeros: torch.Tensor  # uint8 [G, N], master grid
    group_size: int  # columns per group after sorting (K for one group per row)
    master_bits: int
    in_features: int
    perm: torch.Tensor | None  # int64 [K]: x[..., perm] is the sorted column order; None when already sorted
    sliced: bool = False  # planes hold the bits of S(q, r) for r = P (a slice's layout, module doc), no carry plane

    @property
    def out_features(self) -> int:
        return self.planes.shape[2]

    @property
    def widths(self) -> tuple[int, ...]:
        """Widths this layout serves exactly: r + 1 ≤ P planes (r = c with all c planes), at least 1 bit."""
        p, c = self.planes.shape[0], self.master_bits
        if self.sliced:
            return (p,)
        return tuple(r for r in range(1, c + 1) if (r + 1 <= p) or (r == c and p == c))

    @property
    def carry(self) -> bool:
        """Whether width r < c reads plane r as the rounding carry (a parent's layout) or not (a slice's)."""
        return not self.sliced

    def check(self, bits: int) -> None:
        if bits not in self.widths and self.sliced:
            raise UserError(
                f"this layout holds a {self.widths[0]}-bit slice and serves no other width ({bits} "
                "asked); build it from the parent to switch widths"
            )
        if bits not in self.widths:
            have = self.widths
            raise UserError(
                f"this nested layout holds {self.planes.shape[0]} of the {self.master_bits} bit planes and "
                f"serves widths {have[0]}..{have[-1]}, not {bits}; rebuild it with "
                f"NestedLayout.build(parent, widths=[..., {bits}])"
            )

    def to(self, device: torch.device | str) -> "NestedLayout":
        """The same layout with its tensors on `device`."""
        perm = None if self.perm is None else self.perm.to(device)
        return NestedLayout(
            self.planes.to(device),
            {r: s.to(device) for r, s in self.scales.items()},
            self.zeros.to(device),
            self.group_size,
            self.master_bits,
            self.in_features,
            perm,
            self.sliced,
        )

    def scale(self, bits: int) -> torch.Tensor:
        return self.scales[bits] if bits in self.scales else self.scales[self.master_bits]

    @classmethod
    def build(cls, parent: QuantizedWeight, widths: tuple[int, ...] | list[int] | None = None) -> "NestedLayout":
        """The layout of a c-bit parent (shift 0) keeping the planes the widest of `widths` needs (all by default),
        or of an r-bit slice (shift > 0: its r planes, serving r alone; `widths` must then be None or (r,))."""
        c = parent.master_bits
        if parent.shift and tuple(widths or (parent.bits,)) != (parent.bits,):
            raise UserError(
                f"a nested layout serving several widths is built from a parent; this weight is already a "
                f"{parent.bits}-bit slice: load the parent checkpoint"
            )
        widths = tuple(widths or (parent.bits,))
        bad = [r for r in widths if not 1 <= r <= c]
        if bad:
            raise UserError(f"cannot serve {bad[0]} bits from a {c}-bit parent; widths 1..{c} exist")
        keep = parent.bits if parent.shift else min(max(widths) + 1, c)
        n, k = parent.shape
        g = parent.g_idx.long()
        perm = torch.argsort(g, stable=True)
        counts = torch.bincount(g)
        gs = int(counts[0])
        if (counts[:-1] != gs).any() or int(counts[-1]) > gs:
            raise UserError(
                "a nested layout needs equal groups (every group but the last of the same size); this "
                "layer's g_idx has uneven groups: re-quantize without --no-static-groups"
            )
        codes = parent.codes[:, perm].to(torch.int64)
        k32 = -(-k // 32)
        codes = torch.nn.functional.pad(codes, (0, k32 * 32 - k))  # [N, K32*32], zero columns never loaded
        dev = parent.codes.device  # built where the parent is (a GPU builds an 8192² layout in milliseconds)
        weights = torch.ones(32, dtype=torch.int64, device=dev) << torch.arange(32, device=dev)
        planes = []
        for p in range(keep):
            bit = (codes >> (parent.bits - 1 - p)) & 1
            word = (bit.view(n, k32, 32) * weights).sum(-1)  # < 2^32: fits an int64, stored as its int32 bit pattern
            planes.append(torch.where(word >= 2**31, word - 2**32, word).to(torch.int32).t())
        scales = {parent.bits: parent.scales.t().contiguous()}
        for r, s in (parent.width_scales or {}).items():
            scales[r] = s.t().contiguous()
        sorted_already = torch.equal(perm, torch.arange(k, device=dev))
        return cls(
            torch.stack(planes).contiguous(),
            scales,
            parent.zeros.t().contiguous(),
            gs,
            c,
            k,
            None if sorted_already else perm,
            sliced=bool(parent.shift),
        )

    def slice_codes(self, bits: int) -> torch.Tensor:
        """S(q, r) [N, K] (int32, the original column order) read from planes 0..r as in the module doc (torch)."""
        self.check(bits)
        c, k = self.master_bits, self.in_features
        dev = self.planes.device
        shifts = torch.arange(32, dtype=torch.int32, device=dev)

        def plane(p: int) -> torch.Tensor:  # [N, K] bits
            w = self.planes[p].t()  # [N, K32]
            return ((w[..., None] >> shifts) & 1).reshape(w.shape[0], -1)[:, :k]

        top = torch.zeros(self.out_features, k, dtype=torch.int32, device=dev)
        for p in range(bits):
            top = (top << 1) | plane(p)
        s = top + plane(bits) if bits < c and self.carry else top
        s = s.clamp(max=(1 << bits) - 1)
        if self.perm is not None:
            out = torch.empty_like(s)
            out[:, self.perm] = s
            s = out
        return s

    def dequantize(self, bits: int) -> torch.Tensor:
        """Ŵ [N, K] float32 of width r from the layout: s_r · (S · 2^(c−r) − z) (the kernels' arithmetic)."""
        q = self.slice_codes(bits).float() * float(1 << (self.master_bits - bits))
        g = torch.arange(self.in_features, device=self.planes.device) // self.group_size
        if self.perm is not None:  # column perm[j] sits at sorted position j: its group is g[j]
            inv = torch.empty_like(g)
            inv[self.perm] = g.clone()
            g = inv
        return self.scale(bits).float().t()[:, g] * (q - self.zeros.float().t()[:, g])
