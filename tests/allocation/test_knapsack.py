"""The knapsack DP against brute-force enumeration of every choice on small random instances."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from matgptq.allocation.knapsack import solve


def brute_force(costs, values, limit):
    best = None
    for choice in itertools.product(*(range(len(c)) for c in costs)):
        cost = sum(c[i] for c, i in zip(costs, choice))
        value = sum(v[i] for v, i in zip(values, choice))
        if cost <= limit and (best is None or value < best[1]):
            best = (cost, value)
    return best


instances = st.integers(1, 6).flatmap(
    lambda n: st.tuples(
        st.lists(
            st.lists(st.tuples(st.integers(0, 50), st.floats(0, 10, allow_nan=False)), min_size=1, max_size=4),
            min_size=n,
            max_size=n,
        ),
        st.integers(0, 250),
    )
)


@settings(max_examples=300, deadline=None)
@given(instances)
def test_dp_equals_brute_force(instance):
    items, limit = instance
    costs = [[c for c, _ in item] for item in items]
    values = [[v for _, v in item] for item in items]
    want = brute_force(costs, values, limit)
    got = solve(costs, values, limit)
    if want is None:
        assert got is None
        return
    assert got is not None
    assert got.cost == sum(c[i] for c, i in zip(costs, got.choice)) <= limit
    # the DP sums values in another order than the enumeration: ≤ 6 terms ≤ 10, float64 → 1e-12 covers the rounding
    assert got.value == pytest.approx(sum(v[i] for v, i in zip(values, got.choice)), abs=1e-12)
    assert got.value == pytest.approx(want[1], abs=1e-12)


def test_a_hand_example():
    # two layers, widths (2, 4) costing (2, 4) and (4, 8); limit 9 allows (4-bit, 2-bit) or (2-bit, 4-bit) only
    costs, values = [[2, 4], [4, 8]], [[5.0, 1.0], [3.0, 2.0]]
    assert solve(costs, values, 9).choice == (1, 0)  # 1 + 3 = 4 beats 5 + 2 = 7
    assert solve(costs, values, 12).choice == (1, 1)
    assert solve(costs, values, 5) is None
