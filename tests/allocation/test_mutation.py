"""The level-switch mutation and the knapsack start never exceed the budget, over random layer sizes, uneven level
sets, all three bit counts (GGUF: any size table that rises with the width) and any budget the levels allow."""

import itertools
from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from matgptq.allocation.budget import BudgetKind, CostModel, LayerSize
from matgptq.allocation.knapsack import solve
from matgptq.allocation.mutation import mutate, random_mix


@st.composite
def problems(draw):
    shapes = draw(st.lists(st.tuples(st.integers(1, 64), st.integers(1, 64), st.integers(1, 4), st.booleans()),
                           min_size=1, max_size=8))  # fmt: skip
    levels = tuple(sorted(draw(st.lists(st.integers(2, 8), min_size=1, max_size=5, unique=True))))
    kind = draw(st.sampled_from(list(BudgetKind)))
    # GGUF sizes: any non-decreasing bits per level (block types tie, e.g. 6 and 8 bits both Q8_0 on 576-wide rows)
    steps = [draw(st.lists(st.integers(0, 9 * n * k), min_size=len(levels), max_size=len(levels))) for n, k, _, _ in shapes]
    gguf = [tuple(zip(levels, itertools.accumulate(s))) for s in steps]
    model = CostModel(tuple(LayerSize(f"l{i}", n, k, g, a, u) for i, ((n, k, g, a), u) in enumerate(zip(shapes, gguf))),
                      levels)  # fmt: skip
    lo = Fraction(model.cost(tuple(levels[0] for _ in shapes), kind), model.total_weights)
    hi = Fraction(model.cost(tuple(levels[-1] for _ in shapes), kind), model.total_weights)
    budget = lo + (hi - lo) * Fraction(draw(st.integers(0, 1000)), 1000)
    values = [[draw(st.floats(0, 1)) for _ in levels] for _ in shapes]
    return model, kind, budget, values, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=150, deadline=None)
@given(problems())
def test_nothing_the_search_makes_exceeds_the_budget(problem):
    model, kind, budget, values, seed = problem
    model.check_budget(budget, kind)  # in range by construction
    costs, limit = model.table(kind), model.limit(budget, kind)
    rng = np.random.default_rng(seed)
    start = solve(costs, values, limit)
    assert start is not None and sum(c[i] for c, i in zip(costs, start.choice)) <= limit
    parent = start.choice
    for _ in range(20):
        child = mutate(parent, costs, limit, rng)
        if child is None:
            assert all(i == 0 for i in parent)
            break
        assert sum(c[i] for c, i in zip(costs, child)) <= limit
        assert child != parent and all(0 <= i < len(model.levels) for i in child)
        parent = child
    mix = random_mix(costs, limit, rng)
    total = sum(c[i] for c, i in zip(costs, mix))
    assert total <= limit
    # maximal: no single one-level raise would still fit
    assert all(i + 1 == len(c) or total + c[i + 1] - c[i] > limit for c, i in zip(costs, mix))


def test_a_lowering_frees_bits_that_smaller_layers_use():
    """One 4096-weight layer down 8→6 frees 8192 bits; the two 1024-weight layers spend all of them in single-level
    raises (2→3 and 3→4 cost 1024 bits each, 4→6 and 6→8 2048), in whichever random order."""
    model = CostModel((LayerSize("big", 64, 64, 1), LayerSize("a", 32, 32, 1), LayerSize("b", 32, 32, 1)), (2, 3, 4, 6, 8))
    costs = model.table(BudgetKind.CODE)
    parent = (4, 0, 0)  # 8, 2, 2 bits
    limit = model.cost((8, 2, 2), BudgetKind.CODE)
    rng = np.random.default_rng(0)
    children = {mutate(parent, costs, limit, rng, max_flips=1) for _ in range(50)}
    assert len(children) > 1 and all(c[0] == 3 for c in children)  # big: 8 → 6
    assert {model.cost(tuple(model.levels[i] for i in c), BudgetKind.CODE) for c in children} == {limit}
