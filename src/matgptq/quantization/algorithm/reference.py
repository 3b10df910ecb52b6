"""GPTQ on one screen: read this first. The fast solver (solver.py, lazy_blocks.py) computes exactly this, and the
tests hold it to this, code for code (tests/quantization/algorithm/test_solver.py).

GPTQ (Frantar et al. 2022; IST-DASLab/gptq `fasterquant`) quantizes a weight W [N, K] given the Hessian of the
layer's inputs, H = (2/n) Σ x xᵀ [K, K]. Columns are rounded one at a time; each column's rounding error, scaled by
the inverse Hessian, is pushed onto the columns not yet rounded, so they absorb it:

    U = upper Cholesky factor of (H + δ·mean(diag H)·I)⁻¹
    for j in order:   q_j = round(w_j);   e_j = (w_j − ŵ_j) / U_jj;   w_c −= e_j · U_jc  for every c > j

`rounding` picks codes and says what error remains (grid.py: NearestRounding for one width; multibit.py: MatGPTQ's
codes whose top bits are good at every width). Groups of g columns share a (scale, zero), found when the group's
first column comes up (or from the original weights: `static_groups`). act-order takes columns by decreasing
diag(H); group act-order (`group_order`) whole groups by decreasing max diag(H). Float64, no batching, no tricks:
slow, and plainly right.
"""

from __future__ import annotations

import math

import torch

from .grid import Rounding, find_params


def group_order(diag: torch.Tensor, g: int) -> torch.Tensor:
    """Whole groups by decreasing max diag(H) (a stable sort), each group's columns by decreasing diag(H), a ragged
    last group last."""
    k = len(diag)
    groups = [list(range(a, min(a + g, k))) for a in range(0, k, g)]
    full, tail = [c for c in groups if len(c) == g], [c for c in groups if len(c) < g]
    full.sort(key=lambda cols: -max(float(diag[c]) for c in cols))
    return torch.tensor([c for cols in full + tail for c in sorted(cols, key=lambda c: -float(diag[c]))])


def reference_gptq(
    w: torch.Tensor,
    h: torch.Tensor,
    rounding: Rounding,
    group_size: int,
    sym: bool,
    act_order: bool,
    static_groups: bool,
    damp: float,
    group_act_order: bool = False,
):
    """(codes, dequantized weight) of W [N, K], both [N, K] in the original column order, float64."""
    w, h = w.double().clone(), h.double().clone()
    k = w.shape[1]
    g = k if group_size == -1 else group_size
    dead = torch.diag(h) == 0  # inputs that never fire: any weight will do; zero it
    h[dead, dead] = 1
    w[:, dead] = 0
    groups = range(math.ceil(k / g)) if static_groups else ()
    statics = {gid: find_params(w[:, gid * g : (gid + 1) * g], rounding, sym, False) for gid in groups}
    order = torch.argsort(torch.diag(h), descending=True, stable=True) if act_order else torch.arange(k)
    if group_act_order and not act_order:
        order = group_order(torch.diag(h), g)
    w, h = w[:, order], h[order][:, order]
    h = h + damp * torch.diag(h).mean() * torch.eye(k, dtype=h.dtype)
    u = torch.linalg.cholesky(torch.linalg.inv(h), upper=True)
    codes, deq = torch.zeros_like(w), torch.zeros_like(w)
    for j in range(k):
        if static_groups:
            scale, zero = statics[int(order[j]) // g]
        elif j % g == 0:
            scale, zero = find_params(w[:, j : j + g], rounding, sym, False)
        codes[:, j] = q = rounding.codes(w[:, j], scale, zero)
        residual = rounding.residual(w[:, j], q, scale, zero)
        deq[:, j] = w[:, j] - residual
        for c in range(j, k):  # the error, pushed onto the columns not yet rounded (and this one: it is done)
            w[:, c] -= residual / u[j, j] * u[j, c]
    inv = torch.argsort(order)
    return codes[:, inv], deq[:, inv]
