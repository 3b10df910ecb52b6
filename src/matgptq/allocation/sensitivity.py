"""The starting mix: per-layer sensitivities and the knapsack under the budget.

Sensitivity s_l(r) = F(top everywhere, layer l at r; W): the KL of the parent at its highest level with only layer l
sliced to r (fitness.py), on fixed calibration windows W. Under the additive model of HIGGS' linearity theorem the
loss of a mix is ≈ const + Σ_l (s_l(r_l) − s_l(top)), so the best mix under the budget is the multiple-choice knapsack
min Σ_l s_l(r_l) s.t. Σ_l cost_l(r_l) ≤ limit (knapsack.py) — exact for the model, an approximation for the network.

Two ways to fill the table (`Sensitivity`):
- FULL scores every layer at every level: layers × (levels − 1) scorings.
- PROBE (default) scores every layer at one probe level p, the lowest, and takes the other levels from the same
  linearity theorem, which says the loss grows linearly in the layer's relative squared weight error
  t_l(r) = ‖W_l(r) − W_l(top)‖² / ‖W_l(top)‖² (computed here from the parent's own slices, no data):
      s_l(r) = s_l(top) + max(0, s_l(p) − s_l(top)) · t_l(r) / t_l(p).
  Layers × 1 scorings. Why the lowest: the loss grows faster than linearly at large errors, so extrapolating
  *down* from a higher probe underrates the lowest level and pushes the knapsack towards it; extrapolating *up*
  from the lowest level errs on the safe side (it overrates the higher levels' loss, which is small).
Each scoring runs only from the layer's block on (prefix cache of the top mix).
"""

from __future__ import annotations

from enum import Enum
from fractions import Fraction

import torch
from tqdm.auto import tqdm

from ..execution import world
from .budget import BudgetKind, CostModel
from .fitness import Fitness, Mix
from .knapsack import solve
from .spread import score_all


class Sensitivity(str, Enum):
    PROBE = "probe"
    FULL = "full"


def probe_level(levels: tuple[int, ...]) -> int:
    return levels[0]


def relative_errors(fitness: Fitness, levels: tuple[int, ...]) -> list[list[float]]:
    """t[l][i] = ‖W_l(levels[i]) − W_l(top)‖² / ‖W_l(top)‖² from the loaded parent's in-memory layers."""
    layers = fitness.model.matgptq.layers
    table = []
    for name in fitness.names:
        top = layers[name].slice(levels[-1]).dequantize(torch.float64)
        norm = float(top.square().sum()) or 1.0
        table.append([float((layers[name].slice(r).dequantize(torch.float64) - top).square().sum()) / norm
                      for r in levels])  # fmt: skip
    return table


def measure(fitness: Fitness, levels: tuple[int, ...], windows: tuple[int, ...], kind: Sensitivity = Sensitivity.FULL,
            progress: bool = False) -> list[list[float]]:  # fmt: skip
    """s[l][i] = s_l(levels[i]) for every layer l of `fitness.names`."""
    top = tuple(levels[-1] for _ in fitness.names)
    scored = levels[:-1] if kind is Sensitivity.FULL else (probe_level(levels),)
    cache = fitness.prefix_cache(top, windows)
    base = fitness.kl(top, windows, cache)
    mixes = [top[:layer] + (r,) + top[layer + 1 :] for layer in range(len(top)) for r in scored]
    rank, size = world()
    bar = tqdm(total=len(range(rank, len(mixes), size)), desc="sensitivity", unit="eval", disable=not progress,
               leave=False)  # fmt: skip
    flat = iter(score_all(fitness, mixes, windows, cache, lambda: bar.update(1)))  # dealt across ranks (spread.py)
    bar.close()
    measured = [{r: next(flat) for r in scored} for _ in range(len(top))]
    if kind is Sensitivity.FULL:
        return [[row.get(r, base) for r in levels] for row in measured]
    p = probe_level(levels)
    errors = relative_errors(fitness, levels)
    table = []
    for row, t in zip(measured, errors):
        slope = max(0.0, row[p] - base) / t[levels.index(p)] if t[levels.index(p)] > 0 else 0.0
        table.append([base + slope * t_r for t_r in t])
    return table


def knapsack_mix(model: CostModel, sensitivity: list[list[float]], budget: Fraction, kind: BudgetKind) -> Mix:
    """The mix minimising Σ_l s_l(r_l) under the budget (the DP-only result)."""
    solution = solve(model.table(kind), sensitivity, model.limit(budget, kind))
    if solution is None:  # check_budget guarantees the all-lowest mix fits
        raise ValueError("no mix fits the budget")
    return tuple(model.levels[i] for i in solution.choice)
