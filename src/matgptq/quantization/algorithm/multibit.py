"""MatGPTQ's multi-precision code choice (MatGPTQ paper, Algorithm 1) with an exact fast search.

For a weight w with master scale s and zero z, Algorithm 1 picks the master code

    q* = argmin_{q ∈ [0, 2^c−1]}  Σ_{r∈R} λ_r (w − deq_r(q))²,   deq_r(q) = s·(D_r(q) − z),  D_r(q) = S(q, r)·2^(c−r)

by enumerating all 2^c codes (`brute_force_codes`), ties to the lowest q. Writing u = w/s + z (the weight's
position on the master grid), the objective is s²·(Λu² − 2u·A_q + B_q) with Λ = Σλ_r, A_q = Σλ_r D_r(q),
B_q = Σλ_r D_r(q)²: up to terms independent of q it is the line B_q − 2u·A_q. So q*(u) is the lower envelope of 2^c
lines — a step function of u alone, with breakpoints computed once per (c, R, λ). `MatryoshkaRounding.codes` looks u
up among those breakpoints (a table of cells over u) and, only for weights within float noise of a breakpoint,
evaluates the true objective with the same float arithmetic as the brute force on the envelope code and its two
neighbours, so near-ties resolve exactly as the enumeration would: one table lookup (≤ 3 candidates) instead of 2^c.

The error fed back to later columns is the unweighted mean over R of (w − deq_r(q)) (Algorithm 2; λ only steers the
choice of q).

`PerWidthRounding` (this project's default): GPTQ keeps one error-feedback track per width — the r-track
receives only the r-bit slice's own error, exactly as a separate r-bit GPTQ run would — and the shared code minimises
Σ_r λ_r (u_r − D_r(q))² with u_r = w_r/s + z each track's own position. No single u, so no envelope: instead, the
codes where D_r changes for some r < c cut [0, 2^c) into cells on which every lower slice is constant, and inside a
cell only the master term λ_c (u_c − q)² varies, minimised by the code nearest u_c clamped to the cell. The optimum
lies within W = [min_r u_r − h − 1, max_r u_r + h] with h = 2^(c−r₀−1) (r₀ the smallest width): off saturation
q − h + 1 ≤ D_r(q) ≤ q + h, so at W's top code every D_r already reaches its u_r or is saturated, and stepping down to
it from above changes no lower term for the worse and strictly improves the master one; symmetrically below
(D_r(0) = 0, no saturation). So the search scores one candidate per cell meeting W — exact, with ties to the lowest
code like the enumeration.

Devices: the code searches run in numpy on the host. On a GPU, PerWidthRounding scores every cell of every weight at
once in torch (`_search_all`; the window only saves the host work, a cell outside it scoring strictly worse), and the
solver runs that search and the tracks' errors as one fused kernel per column (kernels/gptq_column.per_width_step, the
same float64 operations) and replays its blocks as CUDA graphs (lazy_blocks.BlockGraph; not with the --mse search,
whose codes come from the host); the paper variant's (MatryoshkaRounding) search copies the column (N weights, its
scales and zeros) to the host and the codes and error back, one synchronising round trip per column. On the CPU
nothing is copied.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from ...formats import position_table
from .grid import abs_pow_


def _host(t) -> np.ndarray:
    """A tensor's values as a numpy array (copied to the host when it lives on a GPU), or a scalar as float32."""
    return t.cpu().numpy() if torch.is_tensor(t) else np.float32(t)


def multibit_loss(w, codes, scale, zero, table: torch.Tensor, lambdas: torch.Tensor, norm: float = 2.0):
    """Σ_r λ_r |w − s·(D_r(q) − z)|^norm, elementwise over `codes` (the objective both searches evaluate).

    `table` is D transposed, [2^c, |R|]; w, scale and zero broadcast against `codes`.
    """
    pos = table.to(codes.device).index_select(0, codes.reshape(-1).long()).view(*codes.shape, -1).to(w.dtype)
    diff = w.unsqueeze(-1) - scale.unsqueeze(-1) * (pos - zero.unsqueeze(-1) if torch.is_tensor(zero) else pos - zero)
    err = diff * diff if norm == 2.0 else abs_pow_(diff, norm)
    return (err * lambdas.to(w.device, w.dtype)).sum(-1)


def brute_force_codes(w, scale, zero, master_bits: int, widths: tuple[int, ...], lambdas: tuple[float, ...]):
    """Algorithm 1 as written: try every master code, keep the first minimiser. Reference for tests and benchmarks."""
    table = position_table(master_bits, widths).T.contiguous()
    all_codes = torch.arange(1 << master_bits).expand(*w.shape, -1)
    expand = lambda t: t.unsqueeze(-1) if torch.is_tensor(t) and t.dim() else t  # noqa: E731
    loss = multibit_loss(expand(w), all_codes, expand(scale), expand(zero), table, torch.tensor(lambdas))
    return loss.argmin(dim=-1).to(w.dtype)  # first minimiser = lowest code on ties


@lru_cache(maxsize=64)
def envelope(master_bits: int, widths: tuple[int, ...], lambdas: tuple[float, ...]):
    """Codes on the lower envelope of the lines B_q − 2u·A_q (ascending u) and the breakpoints between them.

    Returns (codes int64 [m], breaks float64 [m−1]): q*(u) = codes[i] for breaks[i−1] < u ≤ breaks[i]; at a breakpoint
    the lower code wins, as in the enumeration.
    """
    pos = position_table(master_bits, widths).double()
    lam = torch.tensor(lambdas, dtype=torch.float64).unsqueeze(1)
    a = (lam * pos).sum(0).tolist()  # non-decreasing in q, since every D_r is
    b = (lam * pos * pos).sum(0).tolist()

    def cross(i: int, j: int) -> float:  # u where lines i and j (a[j] > a[i]) are equal
        return (b[j] - b[i]) / (2.0 * (a[j] - a[i]))

    hull: list[int] = []
    for q in range(len(a)):
        if hull and a[q] == a[hull[-1]]:
            if b[q] >= b[hull[-1]]:
                continue  # parallel and not lower: never strictly better
            hull.pop()
        while len(hull) >= 2 and cross(hull[-1], q) <= cross(hull[-2], hull[-1]):
            hull.pop()  # the middle line is never the unique minimiser
        hull.append(q)
    breaks = [cross(hull[t], hull[t + 1]) for t in range(len(hull) - 1)]
    return torch.tensor(hull, dtype=torch.int64), torch.tensor(breaks, dtype=torch.float64)


class MatryoshkaRounding:
    """Rounding for MatGPTQ: master codes jointly good for every width in R (see module docstring).

    Lookup: u is clipped to [−1, 2^c] and cut into cells of width 1/M, M chosen so that no cell holds two breakpoints;
    per cell we store the envelope index at its left edge and the breakpoint inside it (or +inf), so the envelope
    index is `left[cell] + (u > brk[cell])` — two table reads (numpy fancy indexing, cheaper than torch gathers on
    small CPU tensors). Weights within NEAR_TIE of a breakpoint are re-decided by evaluating the objective on the
    neighbouring envelope codes with the same float arithmetic as the enumeration.
    """

    # in units of the master grid step: wider than the float32 objective's noise for most R and λ, not all: with very
    # unequal λ (e.g. 3.7 and 0.1) a large objective can hide a smaller difference, and the enumeration's float32
    # choice is then a tie it cannot resolve, where this search keeps the exact minimiser (tests/quantization/
    # test_multibit.py)
    NEAR_TIE = 4e-4
    MAX_CELLS_PER_STEP = 1 << 12

    def __init__(self, master_bits: int, widths: tuple[int, ...], lambdas: tuple[float, ...]) -> None:
        self.bits = master_bits
        self.widths, self.lambdas = tuple(widths), tuple(lambdas)
        table = position_table(master_bits, self.widths)
        self.table = table.T.contiguous()  # [2^c, |R|]
        self.lambda_t = torch.tensor(self.lambdas)
        self.table_np, self.lambda_np = self.table.numpy(), self.lambda_t.numpy()
        self.mean_pos = table.double().mean(0).numpy()  # (1/|R|) Σ_r D_r(q): for the propagated error
        env_codes, breaks = envelope(master_bits, self.widths, self.lambdas)
        self.env_codes = env_codes.numpy()
        b = breaks.numpy()
        self.padded_breaks = np.concatenate([[-np.inf], b, [np.inf]])  # interval i is (padded[i], padded[i+1]]
        gap = np.diff(b).min() if len(b) > 1 else 1.0
        cells_per_step = 1
        while cells_per_step < self.MAX_CELLS_PER_STEP and 1.0 / cells_per_step >= gap:
            cells_per_step *= 2
        self.cells_per_step, self.lo, self.hi = cells_per_step, -1.0, float(1 << master_bits)
        edges = self.lo + np.arange(int((self.hi - self.lo) * cells_per_step)) / cells_per_step
        self.cell_left = np.searchsorted(b, edges, side="left")  # envelope index at each cell's left edge
        inside = self.padded_breaks[self.cell_left + 1]  # first break ≥ the left edge
        self.cell_break = np.where(inside < edges + 1.0 / cells_per_step, inside, np.inf)
        self.exact_lookup = 1.0 / cells_per_step < gap or len(b) <= 1

    def envelope_index(self, u: np.ndarray) -> np.ndarray:
        if not self.exact_lookup:  # pathological λ with nearly coincident breakpoints
            return np.searchsorted(self.padded_breaks[1:-1], u, side="left")
        uc = np.clip(u, self.lo, self.hi - 1e-9)
        cell = ((uc - self.lo) * self.cells_per_step).astype(np.int64)
        return self.cell_left[cell] + (uc > self.cell_break[cell])

    def codes(self, w, scale, zero):
        w_np, s_np, z_np = (_host(t) for t in (w, scale, zero))
        u = w_np.astype(np.float64) / s_np + z_np
        k = self.envelope_index(u)
        codes = self.env_codes[k]
        near = np.minimum(u - self.padded_breaks[k], self.padded_breaks[k + 1] - u) < self.NEAR_TIE
        if near.any():  # re-decide with the objective's own float32 arithmetic (numpy twin of multibit_loss)
            at = np.nonzero(near)
            kk = np.clip(k[at][:, None] + np.array([-1, 0, 1]), 0, len(self.env_codes) - 1)
            cand = self.env_codes[kk]  # ascending codes per weight
            pick = lambda a: np.broadcast_to(a, u.shape)[at][:, None, None]  # noqa: E731
            pos = self.table_np[cand].astype(w_np.dtype)  # [m, 3, |R|]
            diff = pick(w_np) - pick(s_np) * (pos - pick(z_np))
            loss = ((diff * diff) * self.lambda_np.astype(w_np.dtype)).sum(-1)
            codes = codes.copy()
            codes[at] = cand[np.arange(len(cand)), loss.argmin(-1)]
        return torch.from_numpy(codes.astype(w_np.dtype)).to(w.device)

    def residual(self, w, codes, scale, zero):
        w_np, s_np, z_np = (_host(t) for t in (w, scale, zero))
        mean_pos = self.mean_pos[_host(codes).astype(np.int64)].astype(w_np.dtype)
        return torch.from_numpy(w_np - s_np * (mean_pos - z_np)).to(w.device)

    def search_loss(self, w, scale, zero, norm):
        return multibit_loss(w, self.codes(w, scale, zero), scale, zero, self.table, self.lambda_t, norm)


class PerWidthRounding(MatryoshkaRounding):
    """Shared codes with one error-feedback track per width (module docstring); `tracks` rows of weights per column.

    The solver stacks the tracks as [tracks, N]: track t holds the weights as updated by width widths[t]'s errors.
    Parameter searches (find_params) see one track-averaged weight through the inherited single-target methods.
    """

    def __init__(self, master_bits: int, widths: tuple[int, ...], lambdas: tuple[float, ...]) -> None:
        super().__init__(master_bits, widths, lambdas)
        if self.widths[-1] != master_bits:
            raise ValueError("the master width must be the widest target width")
        self.tracks = len(self.widths)
        lower = (
            position_table(master_bits, self.widths[:-1]).numpy().astype(np.float64)
            if len(self.widths) > 1
            else np.zeros((0, 1 << master_bits))
        )  # [R−1, 2^c]
        change = np.ones(1 << master_bits, dtype=bool)
        change[1:] = (np.diff(lower, axis=1) != 0).any(0)
        self.cell_lo = np.nonzero(change)[0]
        self.cell_hi = np.append(self.cell_lo[1:] - 1, (1 << master_bits) - 1)
        self.cell_pos = lower[:, self.cell_lo].T  # [cells, R−1]: each lower slice's position in the cell
        self.cell_of = np.cumsum(change) - 1  # code -> its cell
        # per cell: [lo, hi, Σ_{r<c} λ_r D_r², λ_r D_r for r < c], padded with copies of the last cell so that a run of
        # m cells from any start needs no bounds check (an extra candidate is harmless: each is scored exactly)
        lam_lower = np.asarray(self.lambdas[:-1], dtype=np.float64)
        table = np.column_stack(
            [self.cell_lo, self.cell_hi, (self.cell_pos**2 * lam_lower).sum(1), self.cell_pos * lam_lower]
        ).astype(np.float64)
        # stored column-wise ([3 + R−1, cells]): the search gathers one column at a time with 1-D np.take, cheaper
        # than fancy-indexing [N, m] rows of a row-major table
        self.cell_table = np.ascontiguousarray(np.concatenate([table, np.repeat(table[-1:], 1 << master_bits, 0)]).T)
        self.half = float(1 << (master_bits - self.widths[0] - 1)) if len(self.widths) > 1 else 0.0
        self.lam = np.asarray(self.lambdas, dtype=np.float64)

    def mean_track(self, w: torch.Tensor) -> torch.Tensor:
        """λ-weighted mean over the leading track axis: what parameter searches see."""
        # λ from the tables copied once per device (a host copy per group could not be replayed in a CUDA graph)
        lam = self._device_tables(w.device)[1].to(w.dtype).view(-1, *([1] * (w.dim() - 1)))
        return (w * lam).sum(0) / lam.sum()

    def codes_tracks(self, w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
        """Codes [N] for track weights w [tracks, N] with scale, zero [N]: numpy on the host (the window loop), torch on
        a GPU (every cell at once, `_search_all`: the same codes, without copying the column to the host)."""
        if w.is_cuda:
            tables = self._device_tables(w.device)
            u = w.double() / scale.double() + zero.double()
            return self._search_all(u, *tables[:2]).to(w.dtype)
        s, z = _host(scale).astype(np.float64), _host(zero).astype(np.float64)
        u = _host(w).astype(np.float64) / s + z  # [R, N]
        best = self._search(u)
        return torch.from_numpy(best.astype(np.float32)).to(w.device, w.dtype)

    def column_tables(self, device: torch.device):
        """What the fused column kernel reads (kernels/gptq_column.per_width_step): the cell table, its number of
        cells, λ and the position table, on `device`."""
        cells, lam, table = self._device_tables(device)
        return cells, len(self.cell_lo), lam, table

    def _device_tables(self, device: torch.device):
        """(cell table, λ, position table) on `device`, copied once (a copy per column would sync the host)."""
        if getattr(self, "_tables_on", None) != device:
            cells, lam = (torch.from_numpy(t).to(device) for t in (self.cell_table, self.lam))
            self._tables = (cells, lam, self.table.to(device))
            self._tables_on = device
        return self._tables

    def _search_all(self, u: torch.Tensor, cell_table: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        """The search of `_search` with every cell scored at once ([N, cells], no loop and no host round trip: a GPU's
        way). The window W only saves work: a cell outside it scores strictly worse (module docstring), so the first
        minimiser over all cells, ascending, is the window loop's (same float64 operations per candidate, same ties)."""
        cells = len(self.cell_lo)
        lo, hi, sq, lin = (cell_table[0, :cells], cell_table[1, :cells], cell_table[2, :cells], cell_table[3:, :cells])
        uc = u[-1][:, None]
        cand = torch.minimum(torch.maximum(torch.ceil(uc - 0.5), lo), hi)  # [N, cells]
        d = uc - cand
        loss = lam[-1] * (d * d) + sq
        if len(lin):
            dot = lin[0] * u[0][:, None]
            for t in range(1, len(lin)):
                dot += lin[t] * u[t][:, None]
            loss -= 2 * dot
        return cand.gather(1, loss.argmin(1, keepdim=True))[:, 0]

    def _search(self, u: np.ndarray) -> np.ndarray:
        """The cell search of the module docstring on positions u [R, N] (float64), each weight's window W only."""
        top = float((1 << self.bits) - 1)
        k0 = self.cell_of[np.clip(np.ceil(u.min(0) - self.half - 1.0), 0, top).astype(np.int64)]
        k1 = self.cell_of[np.clip(np.floor(u.max(0) + self.half), 0, top).astype(np.int64)]
        uc = u[-1]
        nearest = np.ceil(uc - 0.5)  # nearest master code, ties to the lower (clamped by each cell)
        lo, hi, sq, lin = self.cell_table[0], self.cell_table[1], self.cell_table[2], self.cell_table[3:]
        for j in range(int((k1 - k0).max()) + 1):  # the j-th cell of each weight's window W, ascending
            at = k0 + j
            cand = np.minimum(np.maximum(nearest, lo.take(at)), hi.take(at))
            # Σ_r λ_r (u_r − D_r)² minus the candidate-independent Σ_{r<c} λ_r u_r²
            d = uc - cand
            loss = self.lam[-1] * (d * d) + sq.take(at)
            if len(lin):
                dot = lin[0].take(at) * u[0]
                for t in range(1, len(lin)):
                    dot += lin[t].take(at) * u[t]
                loss -= 2 * dot
            if j == 0:
                best, best_loss = cand, loss
            else:  # strictly lower only: ties keep the lower cell's code, like the enumeration
                better = loss < best_loss
                best, best_loss = np.where(better, cand, best), np.where(better, loss, best_loss)
        return best

    def residual_tracks(self, w: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor):
        """Each track's own slice error w_t − s·(D_t(q) − z): [tracks, N]."""
        table = self.table if codes.device.type == "cpu" else self._device_tables(codes.device)[2]
        pos = table.index_select(0, codes.long()).T.to(w.dtype)  # [R, N]
        return w - scale * (pos - zero)
