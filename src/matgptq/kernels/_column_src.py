"""The Triton source of the GPTQ column step (imported by gptq_column.py on first use, so that importing matgptq never
needs Triton). The arithmetic is documented in gptq_column.py."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _round_half_even(t):
    """torch.round: the nearest integer, ties to even. f = ⌊t⌋ and t − f are exact (|t| < 2^23; above, t is an
    integer and t − f = 0), so the comparisons decide exactly."""
    f = tl.math.floor(t)
    d = t - f
    odd = (f - 2.0 * tl.math.floor(f * 0.5)) == 1.0
    return f + tl.where((d > 0.5) | ((d == 0.5) & odd), 1.0, 0.0)


@triton.jit
def column_step(w, scale, zero, diag, codes, err, N, MAXQ: tl.constexpr, BLOCK: tl.constexpr):
    """codes = clamp(round(w / s) + z, 0, MAXQ), err = (w − s·(codes − z)) / d, each operation rounded on its own
    (launched with enable_fp_fusion=False: no multiply-add contraction)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    x = tl.load(w + offs, mask=m, other=0.0)
    s = tl.load(scale + offs, mask=m, other=1.0)
    z = tl.load(zero + offs, mask=m, other=0.0)
    q = _round_half_even(tl.math.div_rn(x, s)) + z
    q = tl.minimum(tl.maximum(q, 0.0), MAXQ)
    r = x - s * (q - z)
    tl.store(codes + offs, q, mask=m)
    tl.store(err + offs, tl.math.div_rn(r, tl.load(diag)), mask=m)


@triton.jit
def per_width_step(
    w, scale, zero, diag, cells, lam, table, codes, err, N, NCELLS, CSTRIDE, T: tl.constexpr, BLOCK: tl.constexpr
):
    """MatGPTQ's per-width column (multibit.PerWidthRounding._search_all, then residual_tracks and the division): the
    cell search in float64 over the NCELLS columns of `cells` (rows lo, hi, Σλ_rD_r², λ_rD_r; row stride CSTRIDE),
    the first minimiser kept, then each track's error. Operations in torch's order, each rounded on its own (a float64
    division is IEEE-rounded, div.rn.f64, the only one PTX has; float32's needs div_rn)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    s = tl.load(scale + offs, mask=m, other=1.0)
    z = tl.load(zero + offs, mask=m, other=0.0)
    s64, z64 = s.to(tl.float64), z.to(tl.float64)
    uc = tl.load(w + (T - 1) * N + offs, mask=m, other=0.0).to(tl.float64) / s64 + z64
    near = tl.math.ceil(uc - 0.5)
    lam_c = tl.load(lam + T - 1)
    best = tl.zeros((BLOCK,), dtype=tl.float64)
    best_loss = tl.full((BLOCK,), float("inf"), dtype=tl.float64)
    for c in range(NCELLS):
        cand = tl.minimum(tl.maximum(near, tl.load(cells + c)), tl.load(cells + CSTRIDE + c))
        d = uc - cand
        loss = lam_c * (d * d) + tl.load(cells + 2 * CSTRIDE + c)
        dot = tl.zeros((BLOCK,), dtype=tl.float64)
        for t in tl.static_range(T - 1):
            ut = tl.load(w + t * N + offs, mask=m, other=0.0).to(tl.float64) / s64 + z64
            term = tl.load(cells + (3 + t) * CSTRIDE + c) * ut
            if t == 0:
                dot = term
            else:
                dot = dot + term
        if T > 1:
            loss = loss - 2.0 * dot
        better = loss < best_loss  # strictly: ties keep the lower cell, as argmin's first minimiser
        best = tl.where(better, cand, best)
        best_loss = tl.where(better, loss, best_loss)
    q = best.to(tl.float32)
    tl.store(codes + offs, q, mask=m)
    qi = best.to(tl.int32)
    d_j = tl.load(diag)
    for t in tl.static_range(T):
        pos = tl.load(table + qi * T + t, mask=m, other=0).to(tl.float32)
        r = tl.load(w + t * N + offs, mask=m, other=0.0) - s * (pos - z)
        tl.store(err + t * N + offs, tl.math.div_rn(r, d_j), mask=m)
