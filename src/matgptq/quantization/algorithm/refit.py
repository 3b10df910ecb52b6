"""Per-width scale refit: the codes of a parent stay shared, each slice width gets its own least-squares scales.

A MatGPTQ parent chooses its codes q for every width at once (multibit.py), all on the master scale s. Once the codes
are fixed, the r-bit slice's positions p = S(q, r)·2^(c−r) − z (slicing.py) are fixed too, and the scale that
minimises that slice's layer-output error on the calibration inputs is a linear least-squares problem. For one output
row w with the groups' position vectors p_g (p restricted to the columns of group g, zero elsewhere):

    min_s  (w − Σ_g s_g p_g)ᵀ H (w − Σ_g s_g p_g)    ⇒    M s = b,   M_gh = p_gᵀ H p_h,   b_g = p_gᵀ H w

with H the layer Hessian damped as GPTQ damps it (H + δ·mean(diag H)·I, solver.py), w the original weights. The
groups of a row are solved jointly (H couples them); the master scale is one feasible point, so the refit error is
never larger (up to float16 rounding of the result). A group whose positions are all zero keeps its master scale.

Cost per width: one pass of H against the positions, about N·K²/2 multiply-adds for an [N, K] layer with groups (M is
symmetric, so only the blocks h ≥ g are formed) and N·K² per channel, in row chunks. The pipeline refits the target
widths below the master (pipeline.with_width_scales) and, with `--refit-scales`, the master width itself
(`refit_master`: the same problem with p = q − z, the stored codes; any method that has a Hessian).
"""

from __future__ import annotations

import torch

from ...formats.slicing import positions

# bytes of one row chunk's [rows, K] products: big enough for efficient GEMMs, small enough to bound the memory
# (benchmarks/bench_multibit.py times the refit)
CHUNK_BYTES = 1 << 26


def refit_scales(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    g_idx: torch.Tensor,
    master_bits: int,
    widths: tuple[int, ...],
    damp: float,
) -> dict[int, torch.Tensor]:
    """Per width r in `widths`: float16 scales [N, G] minimising ‖(W − s_r·(P_r − z))X‖² for the r-bit slice of
    the master `codes` (all widths in one pass of H)."""
    h, dead = damped_hessian(hessian, damp, torch.float32)
    w = weight.float().masked_fill(dead, 0)  # as the solver: dead inputs carry no signal
    n_rows, k = w.shape
    n_widths, n_groups = len(widths), scales.shape[1]
    g_idx = g_idx.long()
    zero = zeros.float()[:, g_idx]
    p = torch.stack([positions(codes, master_bits, r).float() - zero for r in widths]).view(-1, k)  # [R·N, K]
    b = torch.zeros(p.shape[0], n_groups, device=p.device)
    b.index_add_(1, g_idx, p * (w @ h).repeat(n_widths, 1))  # b_g = Σ_{j∈g} p_j (Hw)_j
    # group-major padded layout: group g's columns in slots g·width..(g+1)·width, padding pointing at a zero column,
    # so a sum over a group is a reshape-and-sum (index_add_ over columns costs more than the products themselves)
    width = int(torch.bincount(g_idx, minlength=n_groups).max())
    slot = torch.full((n_groups, width), k, dtype=torch.long, device=p.device)
    for g in range(n_groups):
        cols = torch.nonzero(g_idx == g).flatten()
        slot[g, : len(cols)] = cols
    slot = slot.flatten()
    if not torch.equal(slot, torch.arange(k, device=p.device)):  # else already group-major: no copies of H
        p = torch.nn.functional.pad(p, (0, 1))[:, slot]  # [R·N, G·width]
        h = torch.nn.functional.pad(h, (0, 1, 0, 1))
        h = h[slot]
        h = h[:, slot]
    m = torch.empty(p.shape[0], n_groups, n_groups, device=p.device)
    chunk = max(1, CHUNK_BYTES // (4 * p.shape[1] * 2))
    for g in range(n_groups):  # M is symmetric: row g from the groups h ≥ g only, mirrored
        mine, later = slice(g * width, (g + 1) * width), slice(g * width, None)
        h_block = h[mine, later]  # [width, width·(G − g)]
        for r0 in range(0, p.shape[0], chunk):
            r1 = min(r0 + chunk, p.shape[0])
            v = p[r0:r1, mine] @ h_block  # p_gᵀ H restricted to the later groups' columns
            v.mul_(p[r0:r1, later])  # M_gh = Σ_{j∈h} (p_gᵀ H)_j p_j: summed per group below
            row = v.view(r1 - r0, n_groups - g, width).sum(-1)
            m[r0:r1, g, g:], m[r0:r1, g:, g] = row, row
    m, b = m.double(), b.double()
    master = scales.float().repeat(n_widths, 1)
    empty = torch.diagonal(m, dim1=1, dim2=2) <= 0  # a group with no non-zero position: keep its master scale
    eye = torch.eye(n_groups, dtype=torch.float64, device=p.device)
    m = torch.where(empty.unsqueeze(-1) | empty.unsqueeze(-2), eye * empty.unsqueeze(-1), m)
    b = torch.where(empty, master.double(), b)
    s = torch.linalg.solve(m, b.unsqueeze(-1)).squeeze(-1).to(torch.float16).float()
    keep = ~torch.isfinite(s) | (s == 0) | (torch.sign(s) != torch.sign(master))
    fit = torch.where(keep, master, s).to(torch.float16).view(n_widths, n_rows, n_groups)
    return {r: fit[i] for i, r in enumerate(widths)}


def damped_hessian(hessian: torch.Tensor, damp: float, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """(H with dead inputs set to 1, + δ·mean(diag H)·I, in `dtype`; the dead-input mask), as the solver damps it."""
    h = hessian.to(dtype).clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    h.diagonal().add_(damp * torch.diag(h).mean())
    return h, dead


def row_error_change(
    weight: torch.Tensor, h: torch.Tensor, dead: torch.Tensor, old: torch.Tensor, new: torch.Tensor
) -> torch.Tensor:
    """Per output row, e(new) − e(old) with e(ŵ) = (w − ŵ)ᵀ H_damped (w − ŵ), the objective `refit_scales` minimises
    (`damped_hessian`'s pair). With r = w − old and d = new − old, e(new) = (r − d)ᵀH(r − d) = e(old) + dᵀH(d − 2r):
    one float64 product with H instead of one per error (half the guard's cost, and no cancellation of two large
    errors)."""
    r = weight.double().masked_fill(dead, 0) - old.double()
    d = new.double() - old.double()
    return ((d @ h) * (d - 2 * r)).sum(-1)


def refit_master(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    g_idx: torch.Tensor,
    bits: int,
    damp: float,
    snap=None,
) -> torch.Tensor:
    """float16 scales [N, G] for the stored `codes` themselves: the least-squares fit above with p = q − z, moved by
    `snap` (a K-quant lattice, or None), kept per row only where the row's error is then smaller than with `scales`.
    So the layer's calibration error never grows, float16 rounding and lattice snapping included."""
    fit = refit_scales(weight, hessian, codes, scales, zeros, g_idx, bits, (bits,), damp)[bits]
    if snap is not None:
        fit = snap(fit)
    g, z, q = g_idx.long(), zeros.float(), codes.float()
    h, dead = damped_hessian(hessian, damp)
    change = row_error_change(weight, h, dead, scales.float()[:, g] * (q - z[:, g]), fit.float()[:, g] * (q - z[:, g]))
    return torch.where((change < 0).unsqueeze(-1), fit, scales.to(torch.float16))
