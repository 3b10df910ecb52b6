"""The level-switch mutation and the knapsack start never exceed the budget, over random layer sizes, uneven level
sets, all three bit counts (GGUF: any size table that rises with the width) and any budget the levels allow."""

import itertools
from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from matgptq.allocation.budget import BudgetKind, CostModel, LayerSize
from matgptq.allocation.knapsack import solve
from matgptq.allocation.mutation import Guide, mutate, random_mix


@st.composite
def problems(draw):
    shapes = draw(
        st.lists(
            st.tuples(st.integers(1, 64), st.integers(1, 64), st.integers(1, 4), st.booleans()), min_size=1, max_size=8
        )
    )
    levels = tuple(sorted(draw(st.lists(st.integers(2, 8), min_size=1, max_size=5, unique=True))))
    kind = draw(st.sampled_from(list(BudgetKind)))
    # GGUF sizes: any non-decreasing bits per level (block types tie, e.g. 6 and 8 bits both Q8_0 on 576-wide rows)
    steps = [
        draw(st.lists(st.integers(0, 9 * n * k), min_size=len(levels), max_size=len(levels))) for n, k, _, _ in shapes
    ]
    gguf = [tuple(zip(levels, itertools.accumulate(s))) for s in steps]
    model = CostModel(
        tuple(LayerSize(f"l{i}", n, k, g, a, u) for i, ((n, k, g, a), u) in enumerate(zip(shapes, gguf))), levels
    )
    lo = Fraction(model.cost(tuple(levels[0] for _ in shapes), kind), model.total_weights)
    hi = Fraction(model.cost(tuple(levels[-1] for _ in shapes), kind), model.total_weights)
    budget = lo + (hi - lo) * Fraction(draw(st.integers(0, 1000)), 1000)
    values = [[draw(st.floats(0, 1)) for _ in levels] for _ in shapes]
    temperature = draw(st.sampled_from([None, 1e-6, 0.5, 3.0]))  # None: uniform draws
    return model, kind, budget, values, draw(st.integers(0, 2**32 - 1)), temperature


@settings(max_examples=150, deadline=None)
@given(problems())
def test_nothing_the_search_makes_exceeds_the_budget(problem):
    model, kind, budget, values, seed, temperature = problem
    guide = None if temperature is None else Guide(values, temperature)
    model.check_budget(budget, kind)  # in range by construction
    costs, limit = model.table(kind), model.limit(budget, kind)
    rng = np.random.default_rng(seed)
    start = solve(costs, values, limit)
    assert start is not None and sum(c[i] for c, i in zip(costs, start.choice)) <= limit
    parent = start.choice
    for _ in range(20):
        child = mutate(parent, costs, limit, rng, guide=guide)
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
    model = CostModel(
        (LayerSize("big", 64, 64, 1), LayerSize("a", 32, 32, 1), LayerSize("b", 32, 32, 1)), (2, 3, 4, 6, 8)
    )
    costs = model.table(BudgetKind.CODE)
    parent = (4, 0, 0)  # 8, 2, 2 bits
    limit = model.cost((8, 2, 2), BudgetKind.CODE)
    rng = np.random.default_rng(0)
    children = {mutate(parent, costs, limit, rng, max_flips=1) for _ in range(50)}
    assert len(children) > 1 and all(c[0] == 3 for c in children)  # big: 8 → 6
    assert {model.cost(tuple(model.levels[i] for i in c), BudgetKind.CODE) for c in children} == {limit}


def frequencies_match(counts: list[int], probabilities: list[float]) -> bool:
    """Each count within 4.5 binomial standard deviations of n·p (all of them together: a false alarm well below
    1e-4 for four categories)."""
    n = sum(counts)
    return all(abs(c - n * p) <= 4.5 * (n * p * (1 - p)) ** 0.5 for c, p in zip(counts, probabilities))


def test_guided_lowerings_are_drawn_by_their_loss_per_bit():
    """Four equal layers at level 1 of (2, 3, 4): lowering them to level 0 costs 0, 1, 1 and 2 units of predicted loss
    per bit freed (the table, over 1024-bit steps). With T = 1 the median rate is 1 unit, so the lowered layer is
    drawn with probabilities ∝ e^0, e^-1, e^-1, e^-2 (the docstring's formula with these numbers)."""
    model = CostModel(tuple(LayerSize(f"l{i}", 32, 32, 1) for i in range(4)), (2, 3, 4))
    costs = model.table(BudgetKind.CODE)
    unit = 1e-4
    values = [[1.0 + 1024 * unit * k, 1.0, 0.9] for k in (0, 1, 1, 2)]
    parent, limit = (1, 1, 1, 1), sum(c[1] for c in costs)
    rng = np.random.default_rng(0)
    counts = [0, 0, 0, 0]
    for _ in range(4000):
        child = mutate(parent, costs, limit, rng, max_flips=1, guide=Guide(values, 1.0))
        counts[[l for l in range(4) if child[l] < parent[l]][0]] += 1
    w = [np.exp(-k) for k in (0, 1, 1, 2)]
    assert frequencies_match(counts, [x / sum(w) for x in w])


def test_guided_raises_are_drawn_by_their_gain_per_bit():
    """Only the donor (layer 0, level 1) can go down; what it frees pays exactly one single-level raise of one of the
    four others (all at level 0, equal sizes). Raising them gains 3, 2, 2 and 1 units per bit: rates −3, −2, −2, −1,
    median |ρ| 2 units, so with T = 0.5 the scale is 1 unit and the raised layer is drawn ∝ e^0, e^-1, e^-1, e^-2."""
    model = CostModel(tuple(LayerSize(f"l{i}", 32, 32, 1) for i in range(5)), (2, 3, 4))
    costs = model.table(BudgetKind.CODE)
    unit = 1e-4
    values = [[2.0, 1.0, 0.5]] + [[1.0 + 1024 * unit * g, 1.0, 0.9] for g in (3, 2, 2, 1)]
    parent = (1, 0, 0, 0, 0)
    limit = sum(c[i] for c, i in zip(costs, parent))
    rng = np.random.default_rng(1)
    counts = [0, 0, 0, 0]
    for _ in range(4000):
        child = mutate(parent, costs, limit, rng, max_flips=1, guide=Guide(values, 0.5))
        assert child[0] == 0 and sum(child[1:]) == 1
        counts[child.index(1, 1) - 1] += 1
    w = [np.exp(-k) for k in (0, 1, 1, 2)]
    assert frequencies_match(counts, [x / sum(w) for x in w])


def test_a_flat_table_draws_uniformly():
    """Equal rates (a median of 0) leave the draws uniform: the same children as no guide, from the same seed."""
    model = CostModel(tuple(LayerSize(f"l{i}", 32, 32, 1) for i in range(6)), (2, 3, 4, 6))
    costs = model.table(BudgetKind.CODE)
    flat = [[1.0] * 4 for _ in range(6)]
    parent = (2, 1, 3, 0, 2, 1)
    limit = sum(c[i] for c, i in zip(costs, parent))
    a, b = np.random.default_rng(7), np.random.default_rng(7)
    assert [mutate(parent, costs, limit, a, guide=Guide(flat)) for _ in range(30)] == [
        mutate(parent, costs, limit, b) for _ in range(30)
    ]
