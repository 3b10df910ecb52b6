"""Measured refinement of the search's start: the additive model re-linearised where the mix is, a group at a time.

The knapsack start (sensitivity.py) is optimal for losses s_l(r) measured around the top mix, where every other layer
is nearly exact. At a low budget most layers sit far below the top and their errors compound, so the start is the
optimum of a model that is wrong where it is used. A step measures the model at the current mix M instead, for the
layers of one group G (the layers dealt into `groups` groups by a seeded shuffle, visited in turn):

    d_l(r) = F(M, layer l at r; W) − F(M; W)        l ∈ G,  r ∈ {M_l − 1, M_l + 1} ∩ levels

(fitness.py; each scoring runs from layer l's block on, the prefix cache of M), and solves the knapsack (knapsack.py)

    min Σ_{l∈G} d_l(r_l)   s.t.  Σ_{l∈G} c_l(r_l) ≤ limit − Σ_{l∉G} c_l(M_l),   r_l ∈ {M_l − 1, M_l, M_l + 1}

with d_l(M_l) = 0 and the layers outside G held: the same additive model, linearised at M rather than at the top.
One level per layer and a third of the layers per step keep a step where the measured d_l still add up. The step's
mix M' replaces M only if it also scores lower on check windows C, disjoint from W: the winners of one measurement
window are partly that window's noise, and a step chosen on W is always better on W. The refinement ends when a
whole round of groups is rejected, after `steps` steps, or at the deadline (judged by the mean step's time).
Deterministic in the seed and the scores; under torchrun the scorings are dealt across ranks (spread.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import UserError
from .fitness import Fitness, Mix
from .knapsack import solve
from .spread import from_rank0, score_all
from .timing import Deadline, OutOfTime, past

CHECK_WINDOWS = 7  # at most this many check windows C (1,785 tokens at --seqlen 256): one pool scoring's worth


@dataclass(frozen=True)
class RefineConfig:
    steps: int = 12  # at most this many steps per budget; 0: no refinement
    groups: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 0 or self.groups < 1:
            raise UserError("--refine-steps must be ≥ 0 and --refine-groups ≥ 1")


@dataclass
class Refined:
    mix: Mix
    steps: int = 0  # steps made
    accepted: int = 0  # steps whose mix was kept
    seconds: float = 0.0
    history: list[dict] = field(default_factory=list)  # per step: measured, predicted, checked KL, changed layers

    def record(self) -> dict:
        """What the search state and the mix file keep of it (JSON types)."""
        return {
            "steps": self.steps,
            "accepted": self.accepted,
            "seconds": round(self.seconds, 1),
            "history": self.history,
        }


def groups_of(n_layers: int, config: RefineConfig) -> list[list[int]]:
    """The layer indices dealt into `config.groups` groups by a shuffle seeded with `config.seed`, each sorted."""
    order = np.random.Generator(np.random.PCG64(config.seed)).permutation(n_layers)
    return [sorted(int(i) for i in order[g :: config.groups]) for g in range(min(config.groups, n_layers))]


def check_windows(fitness: Fitness, measure: tuple[int, ...]) -> tuple[int, ...]:
    """C: the first CHECK_WINDOWS windows of the calibration pool outside the measurement windows (may be empty)."""
    return tuple(w for w in range(fitness.windows.shape[0]) if w not in measure)[:CHECK_WINDOWS]


def local_step(
    fitness: Fitness,
    levels: tuple[int, ...],
    costs: list[list[int]],
    limit: int,
    mix: Mix,
    group: list[int],
    windows: tuple[int, ...],
    deadline: Deadline | None = None,
) -> tuple[Mix, float, float]:
    """(M', F(M; W), the predicted F(M'; W)) of one step on `group` (the module docstring); OutOfTime where a scoring
    would end past `deadline`."""
    cache = fitness.prefix_cache(mix, windows)
    base = score_all(fitness, [mix], windows, cache, deadline=deadline)[0]
    options = []  # per layer of the group: [(width, cost)], its current width first
    for l in group:
        i = levels.index(mix[l])
        options.append([(levels[j], costs[l][j]) for j in (i, i - 1, i + 1) if 0 <= j < len(levels)])
    moves = [(k, width) for k, opts in enumerate(options) for width, _ in opts[1:]]
    children = [mix[: group[k]] + (width,) + mix[group[k] + 1 :] for k, width in moves]
    scores = iter(score_all(fitness, children, windows, cache, deadline=deadline))
    values = [[0.0] + [next(scores) - base for _ in opts[1:]] for opts in options]
    held = set(range(len(mix))) - set(group)
    fixed = sum(costs[l][levels.index(mix[l])] for l in held)  # the bits of the layers outside the group
    solution = solve([[c for _, c in opts] for opts in options], values, limit - fixed)
    new = list(mix)
    for l, opts, k in zip(group, options, solution.choice):  # the current mix is feasible: never None
        new[l] = opts[k][0]
    return tuple(new), base, base + solution.value


def step_windows(n_layers: int, config: RefineConfig, windows: tuple[int, ...], checks: tuple[int, ...]) -> int:
    """Window scorings one step makes at most: the mix and two moves per layer of the largest group on `windows`,
    the new mix on `checks`."""
    return (2 * -(-n_layers // config.groups) + 1) * len(windows) + len(checks)


def refine(
    fitness: Fitness,
    levels: tuple[int, ...],
    costs: list[list[int]],
    limit: int,
    start: Mix,
    windows: tuple[int, ...],
    config: RefineConfig,
    deadline: float | None = None,
    per_window: float = 0.0,
    clock: Callable[[], float] | None = None,
) -> Refined:
    """Refine `start` (which must fit `limit`) by measured local steps on `windows` (the module docstring). With a
    `deadline` (on `clock`, default time.perf_counter), no step starts that would end after it, judged by the longer
    of the mean step so far and the last, the first by `per_window` seconds per window scoring (a full float32 pass:
    an overestimate of a cached one); a step whose next scoring would end past it is dropped."""
    clock = clock or time.perf_counter
    out = Refined(tuple(start))
    checks = check_windows(fitness, windows)
    if config.steps == 0 or not checks:
        return out
    groups = groups_of(len(start), config)
    first = per_window * step_windows(len(start), config, windows, checks)  # the first step's price
    if deadline is not None and from_rank0(past(deadline, 0.0, 0, first + per_window * len(checks), now=clock())):
        return out  # not even the first step and the start's check scoring in time
    checked = score_all(fitness, [out.mix], checks)[0]
    stop = None if deadline is None else Deadline(deadline, clock)
    began, rejected, last = clock(), 0, 0.0
    while out.steps < config.steps and rejected < len(groups):
        if deadline is not None and from_rank0(past(deadline, began, out.steps, first, last, clock())):
            break  # every rank stops together
        group, t0 = groups[out.steps % len(groups)], clock()
        try:
            mix, measured, predicted = local_step(fitness, levels, costs, limit, out.mix, group, windows, stop)
            after = score_all(fitness, [mix], checks, deadline=stop)[0] if mix != out.mix else checked
        except OutOfTime:
            break
        last = clock() - t0
        kept = after < checked
        out.history.append(
            {
                "step": out.steps + 1,
                "measured_kl": measured,
                "predicted_kl": predicted,
                "check_kl_before": checked,
                "check_kl_after": after,
                "kept": kept,
                "changed": sum(a != b for a, b in zip(mix, out.mix)),
            }
        )
        out.steps += 1
        if kept:
            out.mix, checked, rejected = mix, after, 0
            out.accepted += 1
        else:
            rejected += 1
    out.seconds = clock() - began
    return out
