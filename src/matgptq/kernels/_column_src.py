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
