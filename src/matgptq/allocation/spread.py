"""Fitness evaluations dealt across torch.distributed ranks: `torchrun --nproc-per-node N -m matgptq search ...`
(over one node or several; NCCL with CUDA, gloo without).

Every rank runs the same search: the same seed gives every rank the same random draws, so the same children and
windows. Only the scorings are split: candidate i of a batch (a stage's pool, the sensitivity table's layers) is
scored on rank i mod N, and one all-reduce of a float64 array (a row of per-window scores per candidate) — zero
except at a rank's own rows — gives every rank every score. Adding exact zeros changes no value, and each candidate
is scored by the same arithmetic as in a single process, so with the same threads per process the search takes the
same path and ends with the same mix (tests/allocation/test_spread.py). What every rank still does in full: the
teacher pass, the teacher terms of the windows it scores and the held-out report, so the speed-up is below N where
those dominate; each rank fills its own prefix cache from its own scorings (fitness.py), which changes no score.
Rank 0 alone writes the search state and the mix files; a resumed run reads the state on rank 0 and hands it to the
others.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from ..execution import world
from .fitness import Fitness, Mix, PrefixCache
from .timing import Deadline, OutOfTime


def score_all(
    fitness: Fitness,
    mixes: Sequence[Mix],
    windows: tuple[int, ...],
    cache: PrefixCache | None = None,
    on_scored: Callable[[], None] | None = None,
    deadline: Deadline | None = None,
) -> list[float]:
    """F(mix; windows) for every mix, each computed on one rank and known to all; `on_scored` after each local one;
    `deadline` as `score_windows`'."""
    return [statistics.fmean(row) for row in score_windows(fitness, mixes, windows, cache, on_scored, deadline)]


def score_windows(
    fitness: Fitness,
    mixes: Sequence[Mix],
    windows: tuple[int, ...],
    cache: PrefixCache | None = None,
    on_scored: Callable[[], None] | None = None,
    deadline: Deadline | None = None,
    first: float = 0.0,
) -> list[list[float]]:
    """F(mix; {w}) for every mix and each window w (Fitness.window_kls), dealt across ranks as `score_all`. With a
    `deadline`, OutOfTime where the next scoring would end past it (priced at the last one's seconds, the first at
    `first`; under torchrun rank 0's clock decides, once before the ranks' scorings)."""
    rank, size = world()
    if size == 1:
        scores, last = [], first
        for m in mixes:
            if deadline is not None:
                if deadline.passes(last):
                    raise OutOfTime
                t0 = deadline.clock()
            scores.append(fitness.window_kls(m, windows, cache))
            if deadline is not None:
                last = deadline.clock() - t0
            if on_scored:
                on_scored()
        return scores
    if deadline is not None and from_rank0(deadline.passes(first)):
        raise OutOfTime
    box = torch.zeros(len(mixes), len(windows), dtype=torch.float64, device=fitness.device)
    mine = range(rank, len(mixes), size)
    for i in mine:
        box[i] = torch.tensor(fitness.window_kls(mixes[i], windows, cache), dtype=torch.float64)
        if on_scored:
            on_scored()
    dist.all_reduce(box)
    fitness.count_elsewhere(len(mixes) - len(mine), windows)
    return box.tolist()


def from_rank0(value):
    """`value` as rank 0 has it (a no-op in a single process)."""
    if world()[1] == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def is_writer() -> bool:
    """Whether this process writes the search's files (rank 0)."""
    return world()[0] == 0
