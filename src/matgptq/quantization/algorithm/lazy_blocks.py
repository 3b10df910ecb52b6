"""GPTQ's lazy blocks (solver.py's column loop, IST-DASLab/gptq `fasterquant`): what choosing a group's parameters
needs (GroupGrid), one column's codes and scaled error (quantize_column, one fused kernel on a GPU), one block of
columns in block-local coordinates (run_block), and full blocks replayed as a CUDA graph (BlockGraph)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ...kernels import gptq_column
from .grid import NearestRounding, Rounding, find_params
from .kquant_scales import ScaleLattice
from .multibit import PerWidthRounding

SUB_BLOCK = 32  # columns whose per-column updates stay in cache (benchmarks/bench_gptq.py profiles the choice)


@dataclass
class GroupGrid:
    """What choosing a group's (scale, zero) needs: the grid settings, the column weights of the weighted search and the
    K-quant lattice (with its super-scales), in processing order."""

    rounding: Rounding
    sym: bool
    mse: bool
    signed: bool
    col_weights: torch.Tensor | None
    lattice: ScaleLattice | None
    lattice_d: torch.Tensor | None

    def params(self, current: torch.Tensor, j: int, e: int, gid: int):
        """(scale, zero) of the group of columns j..e from their current weights `current` [e − j, N]."""
        cw = None if self.col_weights is None else self.col_weights[j:e]
        scale, zero = find_params(current.T, self.rounding, self.sym, self.mse, self.signed, cw)
        if self.lattice_d is not None:
            scale = self.lattice.snap(scale, self.lattice_d[:, gid])
        return scale, zero


def quantize_column(rounding: Rounding, col: torch.Tensor, scale, zero, d, codes_j, err_j, tracks: int) -> None:
    """One column: its codes into codes_j, the error it propagates divided by d = U_jj into err_j (per track, stacked,
    for T > 1). On a GPU, nearest and per-width rounding run as one fused kernel each (kernels/gptq_column.py: the same
    roundings)."""
    if tracks > 1 and gptq_column.available(col, scale, zero, codes_j, err_j):
        gptq_column.per_width_step(col, scale, zero, d, *rounding.column_tables(col.device), codes_j, err_j)
    elif tracks > 1:
        cols = col.view(tracks, -1)
        codes_j[:] = q = rounding.codes_tracks(cols, scale, zero)
        torch.div(rounding.residual_tracks(cols, q, scale, zero).view(-1), d, out=err_j)
    elif isinstance(rounding, NearestRounding) and gptq_column.available(col, scale, zero, codes_j, err_j):
        gptq_column.column_step(col, scale, zero, d, rounding.maxq, codes_j, err_j)
    elif isinstance(rounding, NearestRounding):
        rounding.column_into(col, scale, zero, d, codes_j, err_j)
    else:
        codes_j[:] = q = rounding.codes(col, scale, zero)
        torch.div(rounding.residual(col, q, scale, zero), d, out=err_j)


def run_block(rounding: Rounding, wt, u, diag, err, codes, groups: tuple[int, int], group_params, fixed, state):
    """One lazy block, in coordinates local to it: row j of `wt` [≥ B, T·N], `u`, `diag` and `codes` is the block's
    column j, B = len(err). Quantizes columns 0..B−1 into codes[j], their scaled errors into err [B, T·N], and applies
    the updates inside the block to wt[:B]; the rows past B get them from the caller (one matrix product). A group
    starts where (first + j) % g == 0 for groups = (first, g): `group_params(j, current)` then gives its (scale, zero)
    from its current weights (the columns j..j+g with the pending updates added); `fixed(j)` instead gives static
    parameters; `state` is the (scale, zero) in force when the block starts, returned as it is when it ends.

    The block is split into cache-sized sub-blocks: the per-column rank-1 update touches only the rest of the
    sub-block, the rest of the block gets one small matmul per sub-block. Same arithmetic as the plain recursion."""
    (first, g), n_cols, tracks = groups, err.shape[0], getattr(rounding, "tracks", 1)
    n_rows = codes.shape[1]
    scale, zero = state if state is not None else (None, None)
    for s0 in range(0, n_cols, SUB_BLOCK):
        s1 = min(s0 + SUB_BLOCK, n_cols)
        for j in range(s0, s1):
            if fixed is not None:
                scale, zero = fixed(j)
            elif group_params is not None and (first + j) % g == 0:
                e = j + g
                current = torch.cat(
                    [
                        wt[j : min(s1, e)],
                        wt[s1 : min(n_cols, e)] - u[s0:j, s1 : min(n_cols, e)].T @ err[s0:j],
                        wt[n_cols:e] - u[:j, n_cols:e].T @ err[:j],
                    ]
                )
                if tracks > 1:
                    current = rounding.mean_track(current.view(-1, tracks, n_rows).transpose(0, 1))
                scale, zero = group_params(j, current)
            quantize_column(rounding, wt[j], scale, zero, diag[j], codes[j], err[j], tracks)
            if j + 1 < s1:
                wt[j + 1 : s1].addr_(u[j, j + 1 : s1], err[j], alpha=-1)
        if s1 < n_cols:
            wt[s1:n_cols].addmm_(u[s0:s1, s1:n_cols].T, err[s0:s1], alpha=-1)
    return scale, zero


class BlockGraph:
    """A full block's column loop (`run_block`) on fixed buffers, captured once as a CUDA graph and replayed for every
    full block of the layer: on a GPU the loop is some ten small kernels per column, whose launches cost more than their
    work (a 4096² layer's loop is an order of magnitude faster as one graph per block:
    docs/decisions/code-constants.md). The replay runs the same operations on the same values as the
    eager loop, so the codes are the eager ones. Only where every operation is a device operation with no host round
    trip (`capturable`): nearest rounding, or MatGPTQ's per-width rounding without the --mse search (the paper variant's
    code search and the search's codes run on the host), no static groups or K-quant lattice, and groups that never
    cross a block (g divides the block, or one group per row, whose parameters the caller finds first). `capture=False`
    runs the loop on the buffers without a graph (how the CPU tests check the buffers' plumbing). With T tracks the
    weight buffers are [size, T·N], codes and parameters per output row [.., N]."""

    def __init__(self, wt, grid: GroupGrid, g: int, size: int, capture: bool = True):
        n, dev, dtype = wt.shape[1], wt.device, wt.dtype
        rows = n // getattr(grid.rounding, "tracks", 1)
        self.g, self.size, self.whole = g, size, g >= wt.shape[0]
        self.w, self.err = (torch.zeros(size, n, dtype=dtype, device=dev) for _ in range(2))
        self.codes = torch.zeros(size, rows, dtype=dtype, device=dev)
        self.u = torch.eye(size, dtype=dtype, device=dev)
        self.diag = torch.ones(size, dtype=dtype, device=dev)
        groups = 1 if self.whole else size // g
        self.scales = torch.ones(rows, groups, dtype=dtype, device=dev)
        self.zeros = torch.zeros(rows, groups, dtype=dtype, device=dev)
        self.cw = None if grid.col_weights is None else torch.ones(size, dtype=dtype, device=dev)
        self.grid = replace(grid, col_weights=self.cw)
        self.graph, self.col_weights = None, grid.col_weights
        if capture:
            self.graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # a first run allocates the temporaries and fills the caches
                self._body()
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(self.graph):
                self._body()

    @classmethod
    def for_layer(cls, wt, grid: GroupGrid, g: int, size: int, static, use: bool | None) -> "BlockGraph | None":
        """The graph for this layer's loop (`use`: None on a GPU only; True also without a graph on the CPU), or None
        where the class docstring says it does not apply."""
        k = wt.shape[0]
        if not (wt.is_cuda if use is None else use) or not cls.capturable(grid):
            return None
        if static or grid.lattice is not None or k < 2 * size:
            return None
        if g < k and size % g:
            return None
        return cls(wt, grid, g, size, capture=wt.is_cuda)

    @staticmethod
    def capturable(grid: GroupGrid) -> bool:
        """Whether every operation of the column loop under `grid` runs on the device (class docstring)."""
        return isinstance(grid.rounding, NearestRounding) or (
            isinstance(grid.rounding, PerWidthRounding) and not grid.mse
        )

    def _body(self):
        def group_params(j, current):
            scale, zero = self.grid.params(current, j, j + self.g, j // self.g)
            self.scales[:, j // self.g], self.zeros[:, j // self.g] = scale, zero
            return scale, zero

        state = (self.scales[:, 0], self.zeros[:, 0]) if self.whole else None
        run_block(
            self.grid.rounding,
            self.w,
            self.u,
            self.diag,
            self.err,
            self.codes,
            (0, self.g),
            None if self.whole else group_params,
            None,
            state,
        )

    def run(self, wt, u, diag, codes, scales, zeros, b0: int, gids: list[int], state):
        """Columns b0..b0+size of the layer (arguments as in solver.py's `_solve`): codes and group parameters written
        into the layer's, the block's scaled errors returned (valid until the next run)."""
        b1 = b0 + self.size
        self.w.copy_(wt[b0:b1])
        self.u.copy_(u[b0:b1, b0:b1])
        self.diag.copy_(diag[b0:b1])
        if self.cw is not None:
            self.cw.copy_(self.col_weights[b0:b1])
        if self.whole:
            self.scales[:, 0], self.zeros[:, 0] = state
        if self.graph is not None:
            self.graph.replay()
        else:
            self._body()
        codes[b0:b1] = self.codes
        if not self.whole:
            ids = torch.tensor(gids, device=wt.device)
            scales.index_copy_(1, ids, self.scales)
            zeros.index_copy_(1, ids, self.zeros)
        return self.err
