"""The starting mix: per-layer sensitivities and the knapsack under the budget (issue #10 item 5).

Sensitivity s_l(r) = F(top everywhere, layer l at r; W): the KL of the parent at its highest level with only layer l
sliced to r (fitness.py), on fixed calibration windows W. Under the additive model of HIGGS' linearity theorem the
loss of a mix is ≈ const + Σ_l (s_l(r_l) − s_l(top)), so the best mix under the budget is the multiple-choice knapsack
min Σ_l s_l(r_l) s.t. Σ_l cost_l(r_l) ≤ limit (knapsack.py) — exact for the model, an approximation for the network.
Cost: layers × (levels − 1) scorings, each running only from the layer's block on (prefix cache of the top mix).
"""

from __future__ import annotations

from fractions import Fraction

from tqdm.auto import tqdm

from .budget import BudgetKind, CostModel
from .fitness import Fitness, Mix
from .knapsack import solve


def measure(fitness: Fitness, levels: tuple[int, ...], windows: tuple[int, ...], progress: bool = False) -> list[list[float]]:
    """s[l][i] = s_l(levels[i]) for every layer l of `fitness.names`."""
    top = tuple(levels[-1] for _ in fitness.names)
    cache = fitness.prefix_cache(top, windows)
    base = fitness.kl(top, windows, cache)
    bar = tqdm(total=len(top) * (len(levels) - 1), desc="sensitivity", unit="eval", disable=not progress, leave=False)
    table = []
    for layer in range(len(top)):
        row = []
        for r in levels:
            if r == levels[-1]:
                row.append(base)
                continue
            mix = top[:layer] + (r,) + top[layer + 1 :]
            row.append(fitness.kl(mix, windows, cache))
            bar.update(1)
        table.append(row)
    bar.close()
    return table


def knapsack_mix(model: CostModel, sensitivity: list[list[float]], budget: Fraction, kind: BudgetKind) -> Mix:
    """The mix minimising Σ_l s_l(r_l) under the budget (the DP-only result)."""
    solution = solve(model.table(kind), sensitivity, model.limit(budget, kind))
    if solution is None:  # check_budget guarantees the all-lowest mix fits
        raise ValueError("no mix fits the budget")
    return tuple(model.levels[i] for i in solution.choice)
