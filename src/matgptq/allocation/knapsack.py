"""Multiple-choice knapsack, exactly: one option per item, minimal total value, total cost within a limit.

With an additive model of the loss (HIGGS' linearity theorem: the model's loss grows by the sum of per-layer terms,
each depending on that layer's width only), the best mix under a budget is

    min Σ_l v_l(r_l)   subject to   Σ_l c_l(r_l) ≤ limit,

solved here by dynamic programming over the Pareto frontier of partial solutions: after items 1..l, keep for each
reachable total cost only the assignments that no cheaper one beats in value (costs ascending, values strictly
descending). Adding item l+1 combines the frontier with its options and prunes again; pairs whose cost already leaves
too little for the cheapest options of the remaining items are dropped. Exact for any integer costs — no rounding of
costs to a grid — and the frontier never holds more entries than there are distinct reachable costs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Solution:
    choice: tuple[int, ...]  # option index per item
    cost: int
    value: float


def solve(costs: list[list[int]], values: list[list[float]], limit: int) -> Solution | None:
    """The cheapest-valued choice of one option per item with total cost ≤ limit (None if none fits). Among equal
    values, the lower total cost wins."""
    if len(costs) != len(values) or any(len(c) != len(v) or not c for c, v in zip(costs, values)):
        raise ValueError("costs and values need the same shape, with at least one option per item")
    c_arr = [np.asarray(c, dtype=np.int64) for c in costs]
    v_arr = [np.asarray(v, dtype=np.float64) for v in values]
    if any(not np.isfinite(v).all() for v in v_arr):
        raise ValueError("values must be finite")
    cheapest_rest = np.concatenate([np.cumsum([c.min() for c in c_arr][::-1])[::-1][1:], [0]])
    front_c, front_v = np.zeros(1, np.int64), np.zeros(1, np.float64)
    back: list[tuple[np.ndarray, np.ndarray]] = []
    for item, (c, v) in enumerate(zip(c_arr, v_arr)):
        cand_c = (front_c[:, None] + c[None, :]).ravel()
        cand_v = (front_v[:, None] + v[None, :]).ravel()
        prev = np.repeat(np.arange(front_c.size), c.size)
        option = np.tile(np.arange(c.size), front_c.size)
        ok = cand_c + cheapest_rest[item] <= limit
        cand_c, cand_v, prev, option = cand_c[ok], cand_v[ok], prev[ok], option[ok]
        if cand_c.size == 0:
            return None
        order = np.lexsort((cand_v, cand_c))  # by cost, then value
        cand_c, cand_v, prev, option = cand_c[order], cand_v[order], prev[order], option[order]
        best_before = np.minimum.accumulate(cand_v)
        keep = np.ones(cand_v.size, bool)
        keep[1:] = cand_v[1:] < best_before[:-1]  # strictly better than everything cheaper (or equally cheap)
        front_c, front_v = cand_c[keep], cand_v[keep]
        back.append((prev[keep], option[keep]))
    at = int(front_v.size - 1)  # values strictly descend along the frontier: the last is the best
    cost, value = int(front_c[at]), float(front_v[at])
    choice = []
    for prev, option in reversed(back):
        choice.append(int(option[at]))
        at = int(prev[at])
    return Solution(tuple(reversed(choice)), cost, value)
