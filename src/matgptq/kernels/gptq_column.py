"""One GPTQ column step in one kernel launch (the solver's inner loop on a GPU, quantization/algorithm/lazy_blocks.py): nearest
rounding (`column_step`) and MatGPTQ's per-width rounding (`per_width_step`).

For column j of the ordered weights with nearest rounding, GPTQ computes its codes and the error it feeds forward,

    q = clamp(round(w / s) + z, 0, maxq),   e = (w − s·(q − z)) / U_jj,

which torch runs as some ten small kernels (grid.NearestRounding.codes and .residual, then the division): on a GPU
their launches, not their work, set the solver's speed (each a few µs for a column of a few thousand rows). Here one
Triton kernel does the column. Every operation is IEEE-rounded on its own as torch rounds it (div_rn for both
divisions, a round half to even built from exact floor steps like torch.round, and no multiply-add contraction:
enable_fp_fusion=False), so the codes and errors are torch's bit for bit (tests/kernels/test_gptq_column.py, in Triton's interpreter). Used only on CUDA float32 tensors with contiguous
columns; everything else takes the torch operations. Triton is imported on first use.

MatGPTQ's per-width column (multibit.PerWidthRounding: the cell search over the positions u_t = w_t / s + z of its T
tracks, then each track's error) is some forty small torch kernels, in float64; `per_width_step` runs the same float64
operations in the same order, each rounded on its own, so its codes and errors are torch's bit for bit too.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache

import torch

BLOCK = 1024  # rows per program: a 4096-row column is 4 programs
# both kernels' compile options: no multiply-add contraction, every operation rounded on its own as torch rounds it
OPTIONS = {"enable_fp_fusion": False}


def available(*tensors: torch.Tensor) -> bool:
    """Whether the kernel serves these tensors: CUDA float32, contiguous, and Triton installed."""
    return all(t.is_cuda and t.dtype == torch.float32 and t.is_contiguous() for t in tensors) and _triton()


@lru_cache(maxsize=1)
def _triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def column_step(
    w: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    diag: torch.Tensor,
    maxq: int,
    codes: torch.Tensor,
    err: torch.Tensor,
) -> None:
    """codes[:] = the column's codes, err[:] = its error divided by `diag` (a 0-d tensor, U_jj), in one launch (module
    doc); w, scale, zero, codes and err are [N]."""
    from ._column_src import column_step as kernel

    n = w.numel()
    kernel[(-(-n // BLOCK),)](w, scale, zero, diag, codes, err, n, MAXQ=float(maxq), BLOCK=BLOCK, **OPTIONS)


def per_width_step(
    w: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    diag: torch.Tensor,
    cells: torch.Tensor,
    n_cells: int,
    lam: torch.Tensor,
    table: torch.Tensor,
    codes: torch.Tensor,
    err: torch.Tensor,
) -> None:
    """codes[:] = the column's shared codes [N], err[:] = its T tracks' errors divided by `diag` [T·N], for the track
    weights w [T·N] (track t at t·N), in one launch; `cells` float64 [3 + T − 1, ≥ n_cells] (PerWidthRounding's cell
    table), `lam` float64 [T], `table` int32 [2^c, T] (the positions D_t(q))."""
    from ._column_src import per_width_step as kernel

    n, tracks = codes.numel(), lam.numel()
    kernel[(-(-n // BLOCK),)](
        w,
        scale,
        zero,
        diag,
        cells,
        lam,
        table,
        codes,
        err,
        n,
        n_cells,
        cells.stride(0),
        T=tracks,
        BLOCK=BLOCK,
        **OPTIONS,
    )
