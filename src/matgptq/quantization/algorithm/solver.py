"""GPTQ and RTN on one weight matrix: pure functions from (W, H, settings) to integer codes, scales and zeros.

GPTQ (Frantar et al. 2022; MatGPTQ paper, Algorithm 2; IST-DASLab/gptq `fasterquant`): with the layer Hessian
H = (2/n) Σ x xᵀ, columns are quantized one at a time in a fixed order and each column's error e_j = (w_j − ŵ_j) / U_jj
is pushed onto the not-yet-quantized columns, W_{:, j:} −= e_j U_{j, j:}, where U is the upper Cholesky factor of
(H + δ·mean(diag H)·I)⁻¹. Updates inside a block of `block_size` columns are applied at once ("lazy batch"); group
parameters are computed from the *current* (fully updated) weights when a group starts, so the result equals the
plain column-by-column algorithm. MatGPTQ differs only in the `Rounding` (multibit.py): how a column's codes are chosen
and which error is propagated. A rounding with `tracks` T > 1 (multibit.PerWidthRounding) keeps T copies of the weights,
one per width, stacked as extra rows ([K, T·N] below): every update is the same matrix product on more rows, and the
column's codes are chosen once from all T rows; group parameters come from the tracks' λ-weighted mean.

act-order (`desc_act`): columns are processed by decreasing diag(H); groups are formed in that order (g_idx[k] =
position of k in the order // g). `static_groups` (with or without act-order): group parameters come from contiguous
column ranges of the original weights before any update (g_idx[k] = k // g), as llm-compressor always does;
otherwise they are refit on the updated weights when a group starts, as the original GPTQ does. A ragged last group (K not a multiple of g) is allowed.
group act-order (`group_order`; GAR, Gafni et al. 2025, GPTQModel's default `act_group_aware`): whole groups are
processed by decreasing max diag(H) within the group, and each group's columns by decreasing diag(H); a ragged last
group stays last. Every group's columns stay together, so the group parameters are refit when a group starts, as
without any order, and the stored layout is the plain one (g_idx[k] = k // g, no permutation): most of act-order's
gain, none of its g_idx. With one group per row (g = −1) it is act-order itself, still with the plain layout.
Dead inputs (diag H = 0) get H_kk = 1 and zero weights. If the damped Hessian is not positive definite, damping is
retried ×10 up to 1.0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...errors import UserError
from .grid import Rounding, find_params
from .kquant_scales import ScaleLattice
from .lazy_blocks import BlockGraph, GroupGrid, run_block


@dataclass
class QuantResult:
    """Codes in original column order; one (scale, zero) per output row and group; g_idx maps columns to groups."""

    codes: torch.Tensor  # uint8 [N, K]
    scales: torch.Tensor  # float16 [N, G]
    zeros: torch.Tensor  # uint8 [N, G]
    g_idx: torch.Tensor  # int32 [K]
    perm: torch.Tensor | None  # int64 [K] processing order (act-order), or None
    damp: float  # relative damping actually used (GPTQ), 0 for RTN


def _to_result(codes, scales, zeros, g_idx, perm, damp) -> QuantResult:
    return QuantResult(
        codes=codes.round().to(torch.uint8),
        scales=scales.to(torch.float16),
        zeros=zeros.round().to(torch.uint8),
        g_idx=g_idx.to(torch.int32),
        perm=perm,
        damp=damp,
    )


def _group_bounds(k: int, group_size: int) -> list[tuple[int, int]]:
    g = k if group_size == -1 else group_size
    return [(a, min(a + g, k)) for a in range(0, k, g)]


def _static_params(
    w: torch.Tensor,
    rounding: Rounding,
    group_size: int,
    sym: bool,
    mse: bool,
    signed: bool = False,
    col_weights: torch.Tensor | None = None,
):
    """Parameters for contiguous column groups of `w` ([N, K] → scales, zeros [N, G])."""
    cw = lambda a, b: None if col_weights is None else col_weights[a:b]  # noqa: E731
    bounds = _group_bounds(w.shape[1], group_size)
    pairs = [find_params(w[:, a:b], rounding, sym, mse, signed, cw(a, b)) for a, b in bounds]
    return torch.stack([p[0] for p in pairs], 1), torch.stack([p[1] for p in pairs], 1)


def _lattice_d(
    w: torch.Tensor,
    rounding: Rounding,
    group_size: int,
    mse: bool,
    lattice: ScaleLattice | None,
    col_weights: torch.Tensor | None = None,
    signed: bool = False,
):
    """Super-scale d per row and group (kquant_scales.py), from the static scales of the weights before GPTQ; None
    without a lattice. Symmetric grids only (the zero stays 2^(b−1) when a scale moves)."""
    if lattice is None:
        return None
    static = _static_params(w, rounding, group_size, True, mse, signed, col_weights)[0]
    return lattice.super_scales(static, group_size)


def rtn_quantize(
    weight: torch.Tensor,
    rounding: Rounding,
    group_size: int,
    sym: bool,
    mse: bool = False,
    signed: bool = False,
    lattice: ScaleLattice | None = None,
) -> QuantResult:
    """Round-to-nearest with the same grid as GPTQ and contiguous groups."""
    w = weight.to(torch.promote_types(weight.dtype, torch.float32))
    scales, zeros = _static_params(w, rounding, group_size, sym, mse, signed)
    if lattice is not None:
        scales = lattice.snap(scales, lattice.super_scales(scales, group_size))
    g_idx = torch.arange(w.shape[1], device=w.device) // (w.shape[1] if group_size == -1 else group_size)
    codes = rounding.codes(w, scales[:, g_idx], zeros[:, g_idx])
    return _to_result(codes, scales, zeros, g_idx, None, 0.0)


def group_aware_order(diag: torch.Tensor, group_size: int) -> torch.Tensor:
    """GAR's processing order (module docstring): groups by decreasing max diag(H), columns inside a group by
    decreasing diag(H), a ragged last group last (sorted inside too). Ties keep the original order."""
    k = diag.numel()
    g = k if group_size == -1 else group_size
    full = k // g
    d = diag[: full * g].view(full, g)
    inside = torch.argsort(d, dim=1, descending=True, stable=True) + g * torch.arange(full, device=diag.device)[:, None]
    groups = torch.argsort(d.amax(dim=1), descending=True, stable=True)
    tail = full * g + torch.argsort(diag[full * g :], descending=True, stable=True)
    return torch.cat([inside[groups].reshape(-1), tail])


def inverse_hessian_factor(h: torch.Tensor, damp: float) -> tuple[torch.Tensor, float]:
    """Upper Cholesky factor U of (H + δ·mean(diag H)·I)⁻¹ (Uᵀ U = H⁻¹), increasing δ ×10 (up to 1) until H is
    positive definite. One factorisation: with J the reversal permutation, J H J = L Lᵀ gives
    H⁻¹ = J L⁻ᵀ L⁻¹ J = Uᵀ U for U = J L⁻¹ J, which is upper triangular with a positive diagonal, hence H⁻¹'s
    Cholesky factor (unique). It replaces Cholesky, inverse, Cholesky: one host sync per try instead of two."""
    mean_diag = torch.diag(h).mean()
    while True:  # the damping added on the diagonal of one copy: no [K, K] sum besides it
        flipped = h.flip(0, 1)
        flipped.diagonal().add_(damp * mean_diag)
        chol, info = torch.linalg.cholesky_ex(flipped)
        del flipped
        if info.item() == 0:
            eye = torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
            upper = torch.linalg.solve_triangular(chol, eye, upper=False, out=eye).flip(0, 1)
            if torch.isfinite(upper).all():
                return upper, damp
        if damp >= 1.0:
            raise UserError("the Hessian is not positive definite even with damping 1.0; check the calibration data")
        damp = min(damp * 10, 1.0)


def _prepared(weight: torch.Tensor, hessian: torch.Tensor):
    """(W, H) in float32 (float64 if given), copies; dead inputs (diag H = 0) get H_kk = 1 and zero weights."""
    dtype = torch.promote_types(weight.dtype, torch.float32)
    w, h = weight.to(dtype).clone(), hessian.to(dtype).clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    return w, h


def processing_order(diag_h: torch.Tensor, group_size: int, act_order: bool, group_order: bool):
    """The column permutation GPTQ processes in: decreasing diag H (act-order), GAR's (group act-order), or None."""
    if group_order:
        return group_aware_order(diag_h, group_size)
    return torch.argsort(diag_h, descending=True, stable=True) if act_order else None


def gptq_quantize(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    rounding: Rounding,
    *,
    group_size: int = -1,
    sym: bool = True,
    act_order: bool = False,
    static_groups: bool = False,
    mse: bool = False,
    damp: float = 0.01,
    block_size: int = 128,
    signed: bool = False,
    lattice: ScaleLattice | None = None,
    mse_weighted: bool = False,
    group_order: bool = False,
) -> QuantResult:
    """GPTQ on `weight` [N, K] with Hessian [K, K]. Computes in float32 (or float64 if given float64).

    `group_order`: group act-order (module docstring); ignored with `act_order`, which orders every column.

    `mse_weighted`: the --mse scale search weights each column's error by H_kk (grid.py).

    `lattice` (symmetric, contiguous groups): every group scale is moved onto d·sc (kquant_scales.py), d per row and
    super-block from the scales of the weights before any update, as soon as the group's scale is found."""
    w, h = _prepared(weight, hessian)
    col_weights = torch.diag(h).clone() if mse_weighted else None  # original column order
    lattice_d = _lattice_d(w, rounding, group_size, mse, lattice, col_weights, signed)
    static = None
    if static_groups:
        static = _static_params(w, rounding, group_size, sym, mse, signed, col_weights)
        if lattice_d is not None:
            static = (lattice.snap(static[0], lattice_d), static[1])
    group_order = group_order and not act_order
    perm = processing_order(torch.diag(h), group_size, act_order, group_order)
    if perm is not None:
        w, h = w[:, perm], h[perm[:, None], perm]
        col_weights = None if col_weights is None else col_weights[perm]
    u, damp = inverse_hessian_factor(h, damp)
    grid = GroupGrid(rounding, sym, mse, signed, col_weights, lattice, lattice_d)
    codes, scales, zeros = _solve(w, u, grid, group_size, block_size, perm, static, group_order)
    return _finish(codes, scales, zeros, static, perm, group_size, group_order, damp)


def _solve(
    w, u, grid: GroupGrid, group_size: int, block_size: int, perm, static, group_order: bool, graphs: bool | None = None
):
    """The lazy-batch column loop (IST-DASLab/gptq `fasterquant`) on the ordered W [N, K] with the inverse-Hessian
    factor U: codes [K, N] in processing order, and the group scales and zeros [N, G] found on the way. `graphs`:
    replay full blocks as a CUDA graph (lazy_blocks.BlockGraph; None: on a GPU, where it applies)."""
    (n_rows, k), dtype = w.shape, w.dtype
    g = k if group_size == -1 else group_size
    order = perm if perm is not None else torch.arange(k, device=w.device)
    # Work on Wᵀ ([K, N]) so each column is a contiguous row (one row per track for T > 1, _column).
    tracks = getattr(grid.rounding, "tracks", 1)
    wt = w.T.repeat(1, tracks).contiguous()  # [K, T·N]: track t in columns t·N..(t+1)·N
    codes = torch.empty(k, n_rows, dtype=dtype, device=w.device)
    scales = torch.zeros(n_rows, math.ceil(k / g), dtype=dtype, device=w.device)
    zeros = torch.zeros_like(scales)
    diag = torch.diagonal(u)
    group_of = (order // g).tolist()  # original group of the column processed at each position
    gid = (lambda j: group_of[j]) if group_order else (lambda j: j // g)  # act-order: groups in processing order
    static_s, static_z = (static[0].T.contiguous(), static[1].T.contiguous()) if static else (None, None)
    graph = BlockGraph.for_layer(wt, grid, g, block_size, static, graphs)
    state = None
    if graph is not None and graph.whole:  # one group: its parameters before any update (what the loop finds at j = 0)
        first = wt[:k] if tracks == 1 else grid.rounding.mean_track(wt[:k].view(k, tracks, n_rows).transpose(0, 1))
        state = grid.params(first, 0, k, 0)
        scales[:, 0], zeros[:, 0] = state
    for b0 in range(0, k, block_size):
        b1 = min(b0 + block_size, k)
        if graph is not None and b1 - b0 == block_size:
            err = graph.run(wt, u, diag, codes, scales, zeros, b0, [gid(j) for j in range(b0, b1, g)], state)
        else:

            def group_params(j: int, current: torch.Tensor, b0=b0):  # j, `current` local to the block
                scale, zero = grid.params(current, b0 + j, b0 + j + g, gid(b0 + j))
                scales[:, gid(b0 + j)], zeros[:, gid(b0 + j)] = scale, zero
                return scale, zero

            fixed = (lambda j, b0=b0: (static_s[group_of[b0 + j]], static_z[group_of[b0 + j]])) if static else None
            err = torch.empty(b1 - b0, tracks * n_rows, dtype=dtype, device=w.device)
            state = run_block(
                grid.rounding, wt[b0:], u[b0:, b0:], diag[b0:], err, codes[b0:], (b0, g), group_params, fixed, state
            )
        if b1 < k:
            wt[b1:].addmm_(u[b0:b1, b1:].T, err, alpha=-1)
    return codes, scales, zeros


def _finish(codes, scales, zeros, static, perm, group_size: int, group_order: bool, damp: float) -> QuantResult:
    """The result in original column order: g_idx (act-order: groups in processing order; static groups and GAR:
    contiguous), the static parameters where fixed up front, the permutation kept only where g_idx needs it (act-order
    without static groups: the order was the solver's alone otherwise)."""
    k = codes.shape[0]
    g = k if group_size == -1 else group_size
    order = perm if perm is not None else torch.arange(k, device=codes.device)
    g_idx = torch.empty(k, dtype=torch.int64, device=codes.device)
    g_idx[order] = order // g if static or group_order else torch.arange(k, device=codes.device) // g
    if static:
        scales, zeros = static
    codes = codes.T
    if perm is not None:
        codes = codes[:, torch.argsort(perm)]
    return _to_result(codes.contiguous(), scales, zeros, g_idx, None if group_order or static else perm, damp)
