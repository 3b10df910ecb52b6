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
MSE search (`mse=True`, on the shrink grid of IST-DASLab/gptq, p = 1, 0.99, …, 0.21): score ranges p·[xmin, xmax] by
E(p) = Σ_j d_j·|ŵ_j − w_j|^2.4 in two passes, coarse to fine: every 4th grid point (p = 1, 0.96, …, 0.24), then, per
row, the grid points within 2 steps of its two best coarse points (the first minimiser, then the next), and keep the
grid point of smallest E among those (the largest p on ties). 30 scored points instead of IST-DASLab's 80; on SmolLM2's
weights the chosen E is close to scoring all 80, in well under half the time (docs/results/mse_search.md). d_j = 1
(GPTQ's search), or, given column weights (`--mse-weighted`), d_j = H_jj: the input's mean square, the importance
llama.cpp's imatrix quantizers weight their block-scale search by (llama.cpp ggml-quants.c, quantize_row_q4_0_impl;
there also scaled by √(σ² + w_j²)).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import torch

MSE_GRID = 100
MSE_MAX_SHRINK = 0.8
MSE_NORM = 2.4
# [S, rows, n] elements per search chunk on the CPU (4 MB of float32: the chunk's ~9 elementwise passes stay in cache;
# larger chunks were slower, same result bits:
# docs/decisions/code-constants.md); 64 times as many on a GPU
SEARCH_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class MseSearch:
    """The grid points the MSE search scores (module docstring): every `coarse`-th, then, per row, those within
    `refine` steps of its best `keep` coarse points."""

    coarse: int = 4
    keep: int = 2
    refine: int = 2


MSE_SEARCH = MseSearch()
FULL_GRID = MseSearch(coarse=1, keep=1, refine=0)  # all 80 points scored, the first minimiser kept (IST-DASLab's)


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

    def column_into(self, w, scale, zero, d, codes, err) -> None:
        """codes[:] = codes(w), err[:] = residual(w, codes) / d: the very operations of the two methods and the
        division, written into the solver's buffers with one temporary instead of four and no copy (the CPU
        solver's column loop is bound by per-operation overhead: docs/decisions/code-constants.md)."""
        q = torch.div(w, scale, out=codes).round_().add_(zero).clamp_(0, self.maxq)
        torch.sub(w, torch.sub(q, zero).mul_(scale), out=err).div_(d)

    def search_loss(self, w, scale, zero, norm):
        """|w − s·(q − z)|^norm in place on one buffer: q − z = clamp(round(w/s) + z, 0, maxq) − z is
        clamp(round(w/s), −z, maxq − z) exactly (small integers in float), and |a − b| = |b − a| exactly, so these
        are the bits of codes() followed by the subtraction, with two passes and one temporary fewer. `zero` may be a
        number (a symmetric grid's): a clamp to numbers is much faster than to broadcast tensors on a CPU."""
        q = torch.div(w, scale).round_().clamp_(min=-zero, max=self.maxq - zero)
        return abs_pow_(q.mul_(scale).sub_(w), norm)


def abs_pow_(x: torch.Tensor, p: float) -> torch.Tensor:
    """|x|^p in place. On a CPU as exp(p·ln|x|) (0 ↦ exp(−inf) = 0): torch's pow with a non-integer exponent costs more
    than the three passes there. The two agree to (1.5·|p·ln|x|| + 1) float32 ulp relative
    (tests/quantization/algorithm/test_grid.py derives it), ~2e-6 for the weight errors the search scores, below the differences
    between most grid points it compares; near-ties may flip (a changed choice then changes every later Hessian), and
    the model's perplexity and KL stayed inside the calibration seeds' spread
    (docs/decisions/code-constants.md). On a GPU, where one pass of memory is the cost, pow itself."""
    if x.is_cuda:
        return x.abs_().pow_(p)
    return x.abs_().log_().mul_(p).exp_()


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


def find_params(
    w: torch.Tensor,
    rounding: Rounding,
    sym: bool,
    mse: bool,
    signed: bool = False,
    col_weights: torch.Tensor | None = None,
    search: MseSearch = MSE_SEARCH,
):
    """Per-row (scale, zero) for `w` [rows, n]: min-max, or the coarse-to-fine MSE search under `rounding` (module
    docstring; `search`: which grid points it scores), its error weighted per column by `col_weights` [n] if given.
    No host synchronisation: a CUDA graph may replay it (lazy_blocks.BlockGraph)."""
    lo, hi = _range(w, signed)  # the same for every shrink: found once
    if not mse:
        return _params(lo, hi, rounding.bits, sym, 1.0, signed)
    w = w.contiguous()  # the solver passes a transposed view: its rows scored from contiguous memory are faster
    grid = _shrinks(lo.dtype, lo.device)
    weights = None if col_weights is None else col_weights.to(w.dtype)
    coarse = _errors(w, rounding, lo, hi, sym, signed, weights, grid[:: search.coarse, None])  # [C, rows]
    best = []
    for _ in range(search.keep):
        i = coarse.argmin(0, keepdim=True)  # the first minimiser
        best.append(i * search.coarse)
        coarse.scatter_(0, i, float("inf"))
    near = torch.cat(best).unsqueeze(0) + _steps(search.refine, lo.device).view(-1, 1, 1)  # [2·refine + 1, keep, rows]
    idx = near.flatten(0, 1).clamp_(0, len(grid) - 1).sort(0).values  # ascending index: descending p
    fine = _errors(w, rounding, lo, hi, sym, signed, weights, grid[idx])
    p = grid[idx.gather(0, fine.argmin(0, keepdim=True))[0]]  # argmin: the first, so the largest p on ties
    return _params(lo, hi, rounding.bits, sym, p, signed)


def _errors(w, rounding: Rounding, lo, hi, sym: bool, signed: bool, weights, shrink: torch.Tensor) -> torch.Tensor:
    """E(p) (module docstring) for shrinks `shrink` [S, 1 or rows]: [S, rows], NaN read as +inf. Scored a chunk of
    shrinks at once ([S', rows, n] temporaries, `search_chunk`): a few large operations instead of S rounds of small
    ones (on a GPU, rounds of kernel launches per group)."""
    chunk, out = search_chunk(w), []
    half = float(1 << (rounding.bits - 1))
    for c0 in range(0, shrink.shape[0], chunk):
        s, z = _params(lo, hi, rounding.bits, sym, shrink[c0 : c0 + chunk], signed)
        err = rounding.search_loss(w, s.unsqueeze(-1), half if sym or signed else z.unsqueeze(-1), MSE_NORM)
        out.append(err.sum(-1) if weights is None else err @ weights)
    return torch.nan_to_num(torch.cat(out), nan=float("inf"))


@lru_cache(maxsize=8)
def _steps(refine: int, device: torch.device) -> torch.Tensor:
    """−refine, …, refine grid steps, made once per device (see _shrinks)."""
    return torch.arange(-refine, refine + 1, device=device)


@lru_cache(maxsize=8)
def _shrinks(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """p = 1, 0.99, …, 0.21 (module docstring), made once per device: a CUDA graph replaying the search may not copy
    from the host (lazy_blocks.BlockGraph)."""
    return torch.tensor([1 - i / MSE_GRID for i in range(int(MSE_MAX_SHRINK * MSE_GRID))], dtype=dtype, device=device)


def search_chunk(w: torch.Tensor) -> int:
    """Shrinks scored at once: up to SEARCH_ELEMENTS weights per [S, rows, n] temporary (more on a GPU)."""
    budget = SEARCH_ELEMENTS << (6 if w.is_cuda else 0)
    return max(1, budget // max(1, w.numel()))
