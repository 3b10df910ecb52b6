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
"""

from __future__ import annotations

import numpy as np

Levels = tuple[int, ...]  # level index per layer


def _fill(child: list[int], total: int, costs: list[list[int]], limit: int, rng: np.random.Generator,
          frozen: set[int]) -> int:  # fmt: skip
    """Raise random layers (not in `frozen`) one level while the budget allows; returns the new total."""
    while True:
        ups = [l for l, i in enumerate(child) if l not in frozen and i + 1 < len(costs[l])
               and total + costs[l][i + 1] - costs[l][i] <= limit]  # fmt: skip
        if not ups:
            return total
        l = ups[int(rng.integers(len(ups)))]
        total += costs[l][child[l] + 1] - costs[l][child[l]]
        child[l] += 1


def mutate(parent: Levels, costs: list[list[int]], limit: int, rng: np.random.Generator, max_flips: int = 3) -> Levels | None:
    """One child of `parent` (which must fit), or None when no layer can go down."""
    total = sum(c[i] for c, i in zip(costs, parent))
    if total > limit:
        raise ValueError("the parent exceeds the budget")
    down = [l for l, i in enumerate(parent) if i > 0]
    if not down:
        return None
    flips = min(int(rng.integers(1, max_flips + 1)), int(rng.integers(1, max_flips + 1)), len(down))
    lowered = {int(l) for l in rng.choice(down, size=flips, replace=False)}
    child = list(parent)
    for l in sorted(lowered):
        total -= costs[l][child[l]] - costs[l][child[l] - 1]
        child[l] -= 1
    _fill(child, total, costs, limit, rng, lowered)
    return tuple(child)


def random_mix(costs: list[list[int]], limit: int, rng: np.random.Generator) -> Levels:
    """A random mix that fits and leaves no single raise possible: all layers lowest, then random raises."""
    child = [0] * len(costs)
    total = sum(c[0] for c in costs)
    if total > limit:
        raise ValueError("even the lowest levels exceed the budget")
    _fill(child, total, costs, limit, rng, set())
    return tuple(child)
