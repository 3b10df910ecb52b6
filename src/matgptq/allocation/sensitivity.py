"""The starting mix: per-layer sensitivities and the knapsack under the budget.

Sensitivity s_l(r) = F(top everywhere, layer l at r; W): the KL of the parent at its highest level with only layer l
sliced to r (fitness.py), on fixed calibration windows W. Under the additive model of HIGGS' linearity theorem the
loss of a mix is ≈ const + Σ_l (s_l(r_l) − s_l(top)), so the best mix under the budget is the multiple-choice knapsack
min Σ_l s_l(r_l) s.t. Σ_l cost_l(r_l) ≤ limit (knapsack.py) — exact for the model, an approximation for the network.

Two ways to fill the table (`Sensitivity`):
- FULL (default) scores every layer at every level: layers × (levels − 1) scorings.
- PROBE scores every layer at one probe level p, the lowest, and takes the other levels from the same
  linearity theorem, which says the loss grows linearly in the layer's relative squared weight error
  t_l(r) = ‖W_l(r) − W_l(top)‖² / ‖W_l(top)‖² (computed here from the parent's own slices, no data):
      s_l(r) = s_l(top) + max(0, s_l(p) − s_l(top)) · t_l(r) / t_l(p).
  Layers × 1 scorings. Why the lowest: the loss grows faster than linearly at large errors, so extrapolating
  *down* from a higher probe underrates the lowest level and pushes the knapsack towards it; extrapolating *up*
  from the lowest level errs on the safe side (it overrates the higher levels' loss, which is small).
Both are one procedure (`measure_table`): the levels are scored one at a time from the lowest, every layer at each,
and a level not scored is extrapolated as above from the highest scored level below it. PROBE stops after the first
level, FULL never, or, given a deadline (`search --time-limit`), before the first level that would end past it, or,
given a highest level to score (`search --sensitivity-top`), after that level. Why stop early on purpose: the wide
levels' losses are small, so one window's measurement of them is mostly that window's noise, while their errors are
small enough for the linearity theorem to hold; their scorings can be spent on more windows for the narrow levels.
Each scoring runs only from the layer's block on (prefix cache of the top mix).

Wide levels (`search --sensitivity-wide LEVEL:TOKENS`, `Wide`): the levels from LEVEL up scored on other windows W',
more of them, the narrow levels on the table's own W. Why: one window was too noisy a measurement at SmolLM2's
middle widths (4, 5) to place the 5-bit mix, and two windows at every level cost the evolution a fifth of its
generations (docs/results/search_ten_minutes_variants.md); two at the middle levels only, with the wider levels
extrapolated, cost as many scorings as one at every level (docs/results/search_ten_minutes.md: the 10-minute
recipe's table; the command's default stays one window, which the longer searches were measured with). The knapsack
compares a layer's widths by their values, so every value must be on one scale: a wide level's value is its
increment over the wide windows' own base added to the narrow windows' base,
      s_l(r) = F(top; W) + F(top, layer l at r; W') − F(top; W'),
not its raw KL on W' (the bases differ between window sets, and that constant would favour the widths scored on the
easier set). The extrapolation above the highest scored level works on the same increments.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction
from typing import NamedTuple

import torch
from tqdm.auto import tqdm

from ..execution import world
from .budget import BudgetKind, CostModel
from .fitness import Fitness, Mix
from .knapsack import solve
from .spread import from_rank0, score_all
from .timing import Deadline, OutOfTime


class Sensitivity(str, Enum):
    PROBE = "probe"
    FULL = "full"


# Scored tokens per measurement when `search --sensitivity-tokens` is not given: FULL scores one 256-token window,
# PROBE nine (2,048 tokens; its one level carries every other). At these sizes FULL makes fewer window scorings for
# the whole table than PROBE (levels 2..8: six levels a layer on one window, PROBE's one on nine). On SmolLM2, in the
# same 10-minute runs (docs/results/search_minutes.md: `full knapsack` on 255 tokens, `knapsack` PROBE on 510), FULL's
# knapsack mix had the lower held-out KL at most budgets (docs/guide/search.md), so FULL is the default.
DEFAULT_TOKENS = {Sensitivity.FULL: 255, Sensitivity.PROBE: 2048}


def probe_level(levels: tuple[int, ...]) -> int:
    return levels[0]


def relative_errors(fitness: Fitness, levels: tuple[int, ...]) -> list[list[float]]:
    """t[l][i] = ‖W_l(levels[i]) − W_l(top)‖² / ‖W_l(top)‖² from the loaded parent's in-memory layers (computed once
    per levels: every slice dequantized, work a time limit prices before the tables, start.shared_tables)."""
    key = ("relative_errors", tuple(levels))
    if key not in fitness.derived:
        fitness.derived[key] = weight_errors(fitness.model.matgptq.layers, fitness.names, levels, fitness.units.members)
    return fitness.derived[key]


def weight_errors(
    layers, names, levels: tuple[int, ...], units: tuple[tuple[int, ...], ...] | None = None
) -> list[list[float]]:
    """`relative_errors` of the layers `names` of a loaded parent's `layers` (model.matgptq.layers); with `units`
    (indices into `names`, units.py), of each unit: its layers' squared errors summed over their squared norms
    summed."""
    errors, norms = [], []
    for name in names:
        top = layers[name].slice(levels[-1]).dequantize(torch.float64)
        norms.append(float(top.square().sum()))
        errors.append([float((layers[name].slice(r).dequantize(torch.float64) - top).square().sum()) for r in levels])
    units = tuple((i,) for i in range(len(names))) if units is None else units
    return [
        [sum(errors[i][k] for i in unit) / (sum(norms[i] for i in unit) or 1.0) for k in range(len(levels))]
        for unit in units
    ]


class Wide(NamedTuple):
    """The levels from `level` up are scored on `windows` (module docstring) instead of the table's own windows."""

    level: int
    windows: tuple[int, ...]


@dataclass(frozen=True)
class Table:
    """s[l][i] = s_l(levels[i]) for every layer l, and the levels that were scored (the others extrapolated)."""

    values: list[list[float]]
    measured: tuple[int, ...]


def measure(
    fitness: Fitness,
    levels: tuple[int, ...],
    windows: tuple[int, ...],
    kind: Sensitivity = Sensitivity.FULL,
    progress: bool = False,
) -> list[list[float]]:
    """s[l][i] = s_l(levels[i]) for every unit l of `fitness.units` (`measure_table`'s values, never stopped)."""
    return measure_table(fitness, levels, windows, kind, progress).values


def measure_table(
    fitness: Fitness,
    levels: tuple[int, ...],
    windows: tuple[int, ...],
    kind: Sensitivity = Sensitivity.FULL,
    progress: bool = False,
    deadline: float | None = None,
    highest: int | None = None,
    wide: Wide | None = None,
    cutoff: Deadline | None = None,
) -> Table:
    """The table, scored one level at a time from the lowest (every layer at that level, then the next level up).
    With a `deadline` (on `cutoff`'s clock, else time.perf_counter), FULL stops before a level whose scoring would
    end past it, at the pace per window of the level before; with `highest`, after that level; the lowest level is
    always begun. With a `cutoff` (timing.Deadline) a level is also stopped mid-way, before a scoring that would end
    past the cutoff or, above the lowest level, past `deadline`: that level is dropped, and the lowest one dropped
    raises OutOfTime. A level not scored comes from the highest scored one below it by the linearity theorem (the
    module docstring's probe formula, p that level): PROBE is the table stopped after its first level, FULL the table
    never stopped. With `wide`, its levels are scored on its windows, each stored as an increment over their base
    (module docstring)."""
    clock = time.perf_counter if cutoff is None else cutoff.clock
    top, windows = fitness.uniform(levels[-1]), tuple(windows)
    wanted = levels[:-1] if kind is Sensitivity.FULL else (probe_level(levels),)
    if highest is not None:
        wanted = wanted[:1] + tuple(r for r in wanted[1:] if r <= highest)
    on = {r: wide.windows if wide is not None and r >= wide.level else windows for r in wanted}
    cache = fitness.prefix_cache(top, windows)
    base = fitness.kl(top, windows, cache)
    shift = 0.0  # F(top; W) − F(top; the windows in use)
    rank, size = world()
    per_level = len(range(rank, len(top), size))
    bar = tqdm(total=per_level * len(wanted), desc="sensitivity", unit="eval", disable=not progress, leave=False)
    measured: dict[int, list[float]] = {}
    for i, r in enumerate(wanted):
        if on[r] != cache.windows:  # the first wide level: its windows' cache replaces the narrow one
            cache = fitness.prefix_cache(top, on[r])
            shift = base - fitness.kl(top, on[r], cache)
        t0 = clock()
        mixes = [top[:layer] + (r,) + top[layer + 1 :] for layer in range(len(top))]
        try:  # dealt across ranks
            scores = score_all(fitness, mixes, on[r], cache, lambda: bar.update(1), _stop(cutoff, deadline, i))
        except OutOfTime:
            bar.close()
            if i == 0:
                raise
            break
        measured[r] = scores if on[r] == windows else [s + shift for s in scores]
        pace = (clock() - t0) / len(on[r])
        if deadline is not None and r != wanted[-1] and from_rank0(clock() + pace * len(on[wanted[i + 1]]) > deadline):
            break
    bar.close()
    return Table(_fill(fitness, levels, base, measured), tuple(measured))


def _stop(cutoff: Deadline | None, deadline: float | None, level: int) -> Deadline | None:
    """Where the scorings of the `level`-th level stop: the cutoff, and above the lowest level the deadline too."""
    if cutoff is None or level == 0 or deadline is None:
        return cutoff
    return Deadline(min(cutoff.at, deadline), cutoff.clock)


def probe_of(fitness: Fitness, levels: tuple[int, ...], table: Table) -> Table:
    """The PROBE table that a table scored at the lowest level already holds: that level as scored, every other level
    extrapolated from it (no scoring; the same values `measure_table(..., PROBE)` gives on the same windows)."""
    p = probe_level(levels)
    if p not in table.measured:
        raise ValueError(f"the table did not score width {p}")
    base = table.values[0][-1]
    return Table(_fill(fitness, levels, base, {p: [row[0] for row in table.values]}), (p,))


def _fill(
    fitness: Fitness, levels: tuple[int, ...], base: float, measured: dict[int, list[float]]
) -> list[list[float]]:
    """Every layer's row: the scored levels as scored, the top as `base`, each other level extrapolated from the
    highest scored level p below it: s(r) = s(top) + max(0, s(p) − s(top)) · t(r) / t(p)."""
    if len(measured) == len(levels) - 1:  # every level scored: nothing to extrapolate
        units = range(len(measured[levels[0]]))
        return [[measured[r][unit] if r in measured else base for r in levels] for unit in units]
    return extrapolate(levels, base, measured, relative_errors(fitness, levels))


def extrapolate(
    levels: tuple[int, ...], base: float, measured: dict[int, list[float]], errors: list[list[float]]
) -> list[list[float]]:
    """`_fill` given the layers' relative weight errors (`relative_errors`)."""
    table = []
    for layer, t in enumerate(errors):
        row = []
        for i, r in enumerate(levels):
            if r in measured or r == levels[-1]:
                row.append(measured[r][layer] if r in measured else base)
                continue
            p = max(q for q in measured if q < r)
            t_p = t[levels.index(p)]
            slope = max(0.0, measured[p][layer] - base) / t_p if t_p > 0 else 0.0
            row.append(base + slope * t[i])
        table.append(row)
    return table


def knapsack_mix(model: CostModel, sensitivity: list[list[float]], budget: Fraction, kind: BudgetKind) -> Mix:
    """The mix minimising Σ_l s_l(r_l) under the budget (the DP-only result)."""
    solution = solve(model.table(kind), sensitivity, model.limit(budget, kind))
    if solution is None:  # check_budget guarantees the all-lowest mix fits
        raise ValueError("no mix fits the budget")
    return tuple(model.levels[i] for i in solution.choice)
