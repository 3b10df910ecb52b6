"""The integer quantization grid shared by RTN, GPTQ and MatGPTQ: scale/zero search and code rounding.

Grid (docs/formats.md §4.1, GPTQ's `Quantizer`): per group of weights w with b-bit codes, maxq = 2^b − 1,
  xmin = min(min w, 0), xmax = max(max w, 0)            (the range always contains 0)
  sym:  s = 2·max(|xmin|, xmax) / maxq,  z = 2^(b−1)
  asym: s = (xmax − xmin) / maxq,        z = round(−xmin / s) ∈ [0, maxq]
  code q = clamp(round(w / s) + z, 0, maxq),  w ≈ s · (q − z)        (round = half to even, as torch/GPTQ)
Scales are rounded to float16 *before* codes are chosen, so every exported format (GPTQ fp16 scales, GGUF fp16 block
scales) holds exactly the weights this project evaluated; s·(q − z) is then exact in float32.
Signed scale (`signed=True`, symmetric only; llama.cpp's Q4_0 grid): s = −m / 2^(b−1) with m the group's weight of
largest magnitude, sign kept, z = 2^(b−1): m lands exactly on code 0 and the 2^b-th level that 2·max|w|/maxq leaves
unused is spent on the side of m; s may be negative.
MSE search (`mse=True`, the shrink grid of IST-DASLab/gptq): try ranges p·[xmin, xmax] for p = 1, 0.99, …, 0.21 and
keep, per group, the one with the smallest Σ_j d_j·|ŵ_j − w_j|^2.4, with d_j = 1 (GPTQ's search), or, given column
weights (`--mse-weighted`), d_j = H_jj: the input's mean square, the importance llama.cpp's imatrix quantizers weight
their block-scale search by (llama.cpp ggml-quants.c, quantize_row_q4_0_impl; there also scaled by √(σ² + w_j²)).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol

import torch

MSE_GRID = 100
MSE_MAX_SHRINK = 0.8
MSE_NORM = 2.4
# [S, rows, n] elements per search chunk on the CPU (4 MB of float32: the chunk's ~9 elementwise passes stay in cache;
# 16 MB took 1.25x as long on SmolLM2's layer shapes, same result bits); 64x on a GPU
SEARCH_ELEMENTS = 1 << 20


class Rounding(Protocol):
    """How codes are chosen on a grid and which error is fed back; see NearestRounding and multibit.MatryoshkaRounding."""

    bits: int

    def codes(self, w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor: ...

    def residual(self, w: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
        """The error GPTQ propagates to later columns (w − ŵ, or a mean over slices)."""
        ...

    def search_loss(self, w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, norm: float) -> torch.Tensor:
        """|w − ŵ|^norm elementwise for the codes `codes` picks (summed over slices for MatGPTQ): the MSE scale
        search's error."""
        ...


class NearestRounding:
    """Plain round-to-nearest on a b-bit grid (GPTQ, RTN)."""

    def __init__(self, bits: int) -> None:
        self.bits = bits
        self.maxq = (1 << bits) - 1

    def codes(self, w, scale, zero):  # clamp(round(w / s) + z, 0, maxq), in place on one buffer
        return torch.div(w, scale).round_().add_(zero).clamp_(0, self.maxq)

    def residual(self, w, codes, scale, zero):
        return w - scale * (codes - zero)

    def search_loss(self, w, scale, zero, norm):
        """|w − s·(q − z)|^norm in place on one buffer: q − z = clamp(round(w/s) + z, 0, maxq) − z is
        clamp(round(w/s), −z, maxq − z) exactly (small integers in float), and |a − b| = |b − a| exactly, so these
        are the bits of codes() followed by the subtraction, with two passes and one temporary fewer."""
        q = torch.div(w, scale).round_().clamp_(min=-zero, max=self.maxq - zero)
        return q.mul_(scale).sub_(w).abs_().pow_(norm)


def _range(w: torch.Tensor, signed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """What the grid is fit to, per row: (min(min w, 0), max(max w, 0)), or for the signed grid the weight of largest
    magnitude (twice, so both forms are a pair)."""
    if signed:
        m = torch.gather(w, -1, w.abs().argmax(dim=-1, keepdim=True))[..., 0]
        return m, m
    return torch.clamp(w.min(dim=-1).values, max=0), torch.clamp(w.max(dim=-1).values, min=0)


def _params(lo: torch.Tensor, hi: torch.Tensor, bits: int, sym: bool, shrink: float | torch.Tensor, signed: bool):
    """Scale and zero from a row range (`_range`) shrunk by `shrink` (module docstring)."""
    maxq = (1 << bits) - 1
    if signed:
        half = float(1 << (bits - 1))
        scale = ((lo * shrink) / -half).to(torch.float16).to(lo.dtype)
        scale = torch.where((scale != 0) & torch.isfinite(scale), scale, torch.ones_like(scale))
        return scale, torch.full_like(scale, half)
    xmin, xmax = lo * shrink, hi * shrink
    if sym:
        amax = torch.maximum(-xmin, xmax)
        scale = 2 * amax / maxq
    else:
        scale = (xmax - xmin) / maxq
    scale = scale.to(torch.float16).to(lo.dtype)
    scale = torch.where((scale > 0) & torch.isfinite(scale), scale, torch.ones_like(scale))
    if sym:
        zero = torch.full_like(scale, float(1 << (bits - 1)))
    else:
        zero = torch.clamp(torch.round(-xmin / scale), 0, maxq)
    return scale, zero


def minmax_params(w: torch.Tensor, bits: int, sym: bool, shrink: float | torch.Tensor = 1.0, signed: bool = False):
    """Scale and zero for each row of `w` ([rows, n]) from its (shrunk) range; scale float16-representable, ≠ 0."""
    return _params(*_range(w, signed), bits, sym, shrink, signed)


def find_params(w: torch.Tensor, rounding: Rounding, sym: bool, mse: bool, signed: bool = False,
                col_weights: torch.Tensor | None = None):  # fmt: skip
    """Per-row (scale, zero) for `w` [rows, n]: min-max, or the MSE shrink-grid search under `rounding`, its error
    weighted per column by `col_weights` [n] if given. The search scores a chunk of shrinks at once ([S, rows, n]
    tensors, `search_chunk`): a few large operations instead of 80 rounds of small ones (on a GPU, 80 rounds of kernel
    launches per group). The first shrink with the smallest error wins, as in a loop keeping strict improvements."""
    lo, hi = _range(w, signed)  # the same for every shrink: found once
    scale, zero = _params(lo, hi, rounding.bits, sym, 1.0, signed)
    if not mse:
        return scale, zero
    shrinks = _shrinks(lo.dtype, lo.device)
    weights = None if col_weights is None else col_weights.to(w.dtype)
    chunk = search_chunk(w)
    errors, scales, zeros = [], [], []  # per chunk of shrinks: [S, rows] each
    for c0 in range(0, len(shrinks), chunk):
        s, z = _params(lo, hi, rounding.bits, sym, shrinks[c0 : c0 + chunk, None], signed)
        sc, zc = s.unsqueeze(-1), z.unsqueeze(-1)
        err = rounding.search_loss(w, sc, zc, MSE_NORM)
        errors.append(err.sum(-1) if weights is None else err @ weights)
        scales.append(s)
        zeros.append(z)
    pick = torch.nan_to_num(torch.cat(errors), nan=float("inf")).argmin(0, keepdim=True)  # first minimiser, never NaN
    return torch.cat(scales).gather(0, pick)[0], torch.cat(zeros).gather(0, pick)[0]


@lru_cache(maxsize=8)
def _shrinks(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """p = 1, 0.99, …, 0.21 (module docstring), made once per device: a CUDA graph replaying the search may not copy
    from the host (lazy_blocks.BlockGraph)."""
    return torch.tensor([1 - i / MSE_GRID for i in range(int(MSE_MAX_SHRINK * MSE_GRID))], dtype=dtype, device=device)


def search_chunk(w: torch.Tensor) -> int:
    """Shrinks scored at once: up to SEARCH_ELEMENTS weights per [S, rows, n] temporary (more on a GPU)."""
    budget = SEARCH_ELEMENTS << (6 if w.is_cuda else 0)
    return max(1, budget // max(1, w.numel()))
