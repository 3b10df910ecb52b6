"""EvoPress' level-switch mutation, for layers of different sizes and uneven levels (MatGPTQ paper §3.3).

EvoPress (Sieberling et al., 2024) lowers one layer by a fixed step and raises another of equal size by the same
step, so the bit count never changes. With layers of different sizes and levels such as {2, 3, 4, 6, 8} no such pair
need exist; MatGPTQ's adaptation tracks the bits a lowering frees and looks for raises that fit them, retrying when
none does. Here a child is made as follows:

1. k = min(u₁, u₂) layers, u₁, u₂ uniform on 1..max_flips (EvoPress' draw, biased to 1), chosen at random among
   those above the lowest level, go down one level;
2. then, as long as some other layer can go up one level within the budget, one of those (uniformly) does:
   the freed bits, plus any headroom the parent left, are spent in random single-level raises until none fits.

Every step keeps Σ cost ≤ limit, so a child never exceeds the budget (property-tested), and the lowered layers are
never raised again, so a child always differs from its parent. All randomness comes from one numpy Generator.
Mixes here are level indices (0 = lowest level), costs a table cost[l][i].

Guided draws (`Guide`). Uniform draws spend most children on moves the search's own loss table already calls bad
(lowering a sensitive layer, raising an insensitive one). With a table v[l][i] (the predicted loss of layer l at
level i, the knapsack start's: sensitivity.py) the draws lean on it. Each candidate move gets a rate

    lowering l from i:  ρ_l = max(0, v_l(i − 1) − v_l(i)) / (c_l(i) − c_l(i − 1))    predicted loss per bit freed
    raising l from i:   ρ_l = −max(0, v_l(i) − v_l(i + 1)) / (c_l(i + 1) − c_l(i))  predicted gain per bit, negated

(a step of 0 bits counts as 1), and is drawn with probability ∝ exp(−(ρ_l − min ρ) / (T · median |ρ|)) among the
candidates of that draw: the cheapest lowerings and the most useful raises are the likeliest, the others stay
possible. T (`temperature`) sets how greedy; 0.5 was picked among 0.25, 0.5 and 1 from one-minute trial runs on
SmolLM2-135M (not a recorded benchmark: `benchmarks.search_ten_minutes --uniform-draws` measures guided against
uniform draws). Where every rate is equal (median 0) the draw is uniform.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Levels = tuple[int, ...]  # level index per layer


MAX_EXPONENT = 700.0  # exp(−700) > 0 in float64: every candidate keeps a probability


@dataclass(frozen=True)
class Guide:
    """The loss table the draws lean on, v[l][i], and their temperature T (module docstring)."""

    values: list[list[float]]
    temperature: float = 0.5

    def rate(self, l: int, i: int, j: int, costs: list[list[int]]) -> float:
        """ρ of moving layer l from level i to level j = i ± 1: the predicted loss change per bit, signed so that
        lower is more welcome (a lowering's increase per bit freed, a raise's decrease per bit spent negated)."""
        v, c = self.values[l], costs[l]
        change = max(0.0, v[j] - v[i]) if j < i else -max(0.0, v[i] - v[j])
        return change / max(abs(c[i] - c[j]), 1)

    def probabilities(self, rates: list[float]) -> np.ndarray | None:
        """exp(−(ρ − min ρ) / (T · median |ρ|)), normalised; None (draw uniformly) where the median is 0."""
        r = np.asarray(rates, dtype=np.float64)
        scale = self.temperature * float(np.median(np.abs(r)))
        if not scale > 0:
            return None
        w = np.exp(-np.minimum((r - r.min()) / scale, MAX_EXPONENT))
        return w / w.sum()


def _pick(rng: np.random.Generator, n: int, p: np.ndarray | None) -> int:
    return int(rng.integers(n)) if p is None else int(rng.choice(n, p=p))


def _fill(
    child: list[int],
    total: int,
    costs: list[list[int]],
    limit: int,
    rng: np.random.Generator,
    frozen: set[int],
    guide: Guide | None = None,
) -> int:
    """Raise layers (not in `frozen`) one level while the budget allows, each drawn uniformly or by `guide`;
    returns the new total."""
    while True:
        ups = [
            l
            for l, i in enumerate(child)
            if l not in frozen and i + 1 < len(costs[l]) and total + costs[l][i + 1] - costs[l][i] <= limit
        ]
        if not ups:
            return total
        p = None if guide is None else guide.probabilities([guide.rate(l, child[l], child[l] + 1, costs) for l in ups])
        l = ups[_pick(rng, len(ups), p)]
        total += costs[l][child[l] + 1] - costs[l][child[l]]
        child[l] += 1


def mutate(
    parent: Levels,
    costs: list[list[int]],
    limit: int,
    rng: np.random.Generator,
    max_flips: int = 3,
    guide: Guide | None = None,
) -> Levels | None:
    """One child of `parent` (which must fit), or None when no layer can go down; its moves drawn uniformly, or by
    `guide` (the module docstring)."""
    total = sum(c[i] for c, i in zip(costs, parent))
    if total > limit:
        raise ValueError("the parent exceeds the budget")
    down = [l for l, i in enumerate(parent) if i > 0]
    if not down:
        return None
    flips = min(int(rng.integers(1, max_flips + 1)), int(rng.integers(1, max_flips + 1)), len(down))
    p = None if guide is None else guide.probabilities([guide.rate(l, parent[l], parent[l] - 1, costs) for l in down])
    lowered = {int(l) for l in rng.choice(down, size=flips, replace=False, p=p)}
    child = list(parent)
    for l in sorted(lowered):
        total -= costs[l][child[l]] - costs[l][child[l] - 1]
        child[l] -= 1
    _fill(child, total, costs, limit, rng, lowered, guide)
    return tuple(child)


def random_mix(costs: list[list[int]], limit: int, rng: np.random.Generator) -> Levels:
    """A random mix that fits and leaves no single raise possible: all layers lowest, then random raises."""
    child = [0] * len(costs)
    total = sum(c[0] for c in costs)
    if total > limit:
        raise ValueError("even the lowest levels exceed the budget")
    _fill(child, total, costs, limit, rng, set())
    return tuple(child)
