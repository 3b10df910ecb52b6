"""Which mix a budget writes: the lowest calibration KL among its candidates, unless that is only noise.

The candidates (the evolved mix and every one-shot allocation) are scored on the whole calibration pool, and the
lowest wins, with one exception. The budget's uniform slice (the widest uniform mix among the candidates) is what a
user gets without a search; a mix that scores lower on a few thousand calibration tokens may only fit them (the
sensitivity windows are part of the pool, so an allocation made from them is favoured there). So the lowest
candidate replaces the uniform slice only when it is shown better window by window: with d_w = F(lowest; w) −
F(uniform; w) on each of the pool's n windows, scored alone,

    mean(d) + MARGIN · sd(d) / √n < 0,

a one-sided paired test. MARGIN = 2 is at least the one-sided 95% quantile of Student's t for n ≥ 7 windows
(t₆ = 1.94; the search's default pool is 65 windows, the 10-minute recipe's 8), so a mix that is not better on
average passes it in at most about 5% of pools. With fewer than 2 windows there is no spread, and the uniform slice
stays.
"""

from __future__ import annotations

import math
import statistics
from typing import NamedTuple

from .fitness import Fitness, Mix
from .spread import score_all

MARGIN = 2.0


class Gap(NamedTuple):
    """The lowest candidate against the uniform slice, window by window: mean and standard error of d_w."""

    against: str
    mean: float
    se: float
    windows: int

    @property
    def shown(self) -> bool:
        return self.windows > 1 and self.mean + MARGIN * self.se < 0


def paired_gap(fitness: Fitness, lowest: Mix, uniform: Mix, windows: tuple[int, ...], against: str) -> Gap:
    """`Gap` of `lowest` against `uniform` on `windows`, each window scored alone in float32 for both mixes."""
    d = []
    with fitness.exact():
        for w in windows:
            a, b = score_all(fitness, (lowest, uniform), (w,))
            d.append(a - b)
    se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else math.inf
    return Gap(against, statistics.fmean(d), se, len(d))


def choose(fitness: Fitness, candidates: dict[str, Mix], kl_of: dict[Mix, float],
           windows: tuple[int, ...]) -> tuple[str, Gap | None]:  # fmt: skip
    """The label of the written mix among `candidates` (scored in `kl_of`; ties go to the first), and the paired test
    that decided against the uniform slice (None where the lowest is the uniform slice or there is none)."""
    lowest = min(candidates, key=lambda k: kl_of[candidates[k]])
    uniform = [k for k, m in candidates.items() if len(set(m)) == 1]
    if not uniform:
        return lowest, None
    slice_ = max(uniform, key=lambda k: candidates[k][0])  # every candidate fits: the widest is the budget's slice
    if candidates[lowest] == candidates[slice_]:
        return lowest, None
    gap = paired_gap(fitness, candidates[lowest], candidates[slice_], windows, slice_)
    return (lowest if gap.shown else slice_), gap
