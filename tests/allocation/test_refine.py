"""The measured refinement (allocation/refine.py) against brute force on stories260K's parent (R = {2,3,4,6,8})."""

import itertools

import pytest

from matgptq.allocation import BudgetKind, CostModel
from matgptq.allocation.refine import RefineConfig, check_windows, groups_of, local_step, refine
from matgptq.formats import read_checkpoint

LEVELS = (2, 3, 4, 6, 8)


@pytest.fixture(scope="module")
def setup(stories_parent, stories_fitness):
    cost = CostModel.from_checkpoint(read_checkpoint(stories_parent), LEVELS)
    return stories_fitness, cost.table(BudgetKind.CODE), cost


def _mid_mix(cost):
    """Every layer at 3 or 4 bits, alternating: each layer can go a level up and a level down."""
    return tuple(3 if i % 2 else 4 for i in range(len(cost.names)))


def test_groups_deal_every_layer_once():
    groups = groups_of(10, RefineConfig(groups=3, seed=5))
    assert sorted(i for g in groups for i in g) == list(range(10)) and [len(g) for g in groups] == [4, 3, 3]
    assert groups == groups_of(10, RefineConfig(groups=3, seed=5)) != groups_of(10, RefineConfig(groups=3, seed=6))


def test_a_step_is_the_best_combination_of_measured_single_moves(setup):
    """Oracle: every layer of a 4-layer group scored alone a level up and down at the mix (no prefix cache), then
    every combination of the group's moves (3^4) enumerated: the cheapest-valued one within the budget is the step's
    mix, and its summed value the step's prediction. Same scorings with and without the cache are bit-identical
    (fitness.py), so the comparison is exact up to the order of one float64 sum."""
    fitness, costs, cost = setup
    mix = _mid_mix(cost)
    group = [0, 3, 5, 8]
    windows = (0, 1)
    limit = cost.cost(mix, BudgetKind.CODE) + (costs[3][3] - costs[3][2]) // 2  # room for a raise only with a lowering
    base = fitness.kl(mix, windows)
    single = {}
    for l in group:
        i = LEVELS.index(mix[l])
        for j in (i - 1, i + 1):
            single[l, LEVELS[j]] = fitness.kl(mix[:l] + (LEVELS[j],) + mix[l + 1 :], windows) - base
    best = None
    for deltas in itertools.product((-1, 0, 1), repeat=len(group)):
        cand = list(mix)
        for l, d in zip(group, deltas):
            cand[l] = LEVELS[LEVELS.index(mix[l]) + d]
        if cost.cost(tuple(cand), BudgetKind.CODE) > limit:
            continue
        value = sum(single[l, cand[l]] for l in group if cand[l] != mix[l])
        if best is None or value < best[0] - 1e-15:
            best = (value, tuple(cand))
    got, measured, predicted = local_step(fitness, LEVELS, costs, limit, mix, group, windows)
    assert measured == base
    assert got == best[1] and predicted == pytest.approx(base + best[0], abs=1e-12)
    assert all(got[l] == mix[l] for l in range(len(mix)) if l not in group)


def test_refine_keeps_a_step_only_when_the_check_windows_agree(setup):
    """From the 3/4-bit mix at its own cost: every kept step lowers the check windows' KL (re-scored here), the
    result fits the budget, the history records each step, and the same call gives the same result."""
    fitness, costs, cost = setup
    start = _mid_mix(cost)
    limit = cost.cost(start, BudgetKind.CODE)
    config = RefineConfig(steps=4, groups=2, seed=1)
    out = refine(fitness, LEVELS, costs, limit, start, (0,), config)
    checks = check_windows(fitness, (0,))
    assert checks == (1, 2, 3, 4, 5)
    assert cost.cost(out.mix, BudgetKind.CODE) <= limit
    assert out.steps == len(out.history) and out.accepted == sum(h["kept"] for h in out.history)
    assert fitness.kl(out.mix, checks) <= fitness.kl(start, checks)
    for h in out.history:
        assert h["kept"] == (h["check_kl_after"] < h["check_kl_before"])
    if out.accepted:
        assert out.mix != start and fitness.kl(out.mix, checks) < fitness.kl(start, checks)
    again = refine(fitness, LEVELS, costs, limit, start, (0,), config)
    assert again.mix == out.mix and again.history == out.history


def test_no_steps_a_passed_deadline_or_no_check_window_leave_the_start(setup):
    fitness, costs, cost = setup
    start = _mid_mix(cost)
    limit = cost.cost(start, BudgetKind.CODE)
    assert refine(fitness, LEVELS, costs, limit, start, (0,), RefineConfig(steps=0)).mix == start
    assert refine(fitness, LEVELS, costs, limit, start, (0,), RefineConfig(), deadline=0.0).steps == 0
    everything = tuple(range(fitness.windows.shape[0]))
    assert refine(fitness, LEVELS, costs, limit, start, everything, RefineConfig()).steps == 0
