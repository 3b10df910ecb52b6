"""GRADIENT (gradient.py) against independent oracles: its gradient against central finite differences of the
fitness itself, its floor knapsack against the plain knapsack with the lower widths priced out, and its floors and
mixes against the budget."""

from fractions import Fraction

import pytest
import torch

import matgptq
from matgptq.allocation.allocators import Allocator, allocate, raise_floors, tables, uniform_mix
from matgptq.allocation.budget import BudgetKind, CostModel
from matgptq.allocation.gradient import first_order_table, floor_mix
from matgptq.allocation.sensitivity import knapsack_mix
from matgptq.formats import read_checkpoint

LEVELS = (2, 3, 4, 8)
WINDOWS = (0, 1, 2)


@pytest.fixture(scope="module")
def setup(stories_fitness, stories_parent):
    return stories_fitness, CostModel.from_checkpoint(read_checkpoint(stories_parent), LEVELS)


def test_the_first_order_step_is_the_fitness_central_difference(setup):
    """v_l(4) − v_l(3) = ⟨∂F/∂W_l, D⟩ at the uniform 3-bit slice against (F(W + εD) − F(W − εD)) / 2ε along
    D = W_l(4) − W_l(3), computed by the fitness alone (a replaced weight). Tolerance: the central difference errs by
    ε²·F'''/6 plus the float32 rounding of F over ε. Measured on this model, the truncation is under 1e-3 of the
    derivative at ε = 0.1, so under 1e-4 at ε = 0.03, and F's rounding noise is ~1e-7 (1.6e-3 of the smallest
    derivative at ε = 0.003), so ~2e-4 at ε = 0.03: 2e-3 covers both with room."""
    fitness, _ = setup
    mix = tuple(3 for _ in fitness.names)
    table = first_order_table(fitness, LEVELS, WINDOWS, 3)
    # the same rows through the same formula, their float64 sums taken in another order (the pass adds each window's
    # chunks as it goes): equal to a few float64 roundings, ~1e-16 relative (seen 1 ulp apart on an AMX host)
    assert table[0][1] == pytest.approx(fitness.kl(mix, WINDOWS), rel=1e-12)
    assert all(p.grad is None for p in fitness.model.parameters())  # no weight gradient is made or kept
    layers, eps = fitness.model.matgptq.layers, 0.03
    for layer in (0, 17, len(mix) - 1):
        at3 = layers[fitness.names[layer]].slice(3).dequantize(torch.float32)
        d = layers[fitness.names[layer]].slice(4).dequantize(torch.float32) - at3
        up = fitness.kl(mix, WINDOWS, None, (layer, at3 + eps * d))
        down = fitness.kl(mix, WINDOWS, None, (layer, at3 - eps * d))
        assert table[layer][2] - table[layer][1] == _central_difference(up, down, eps)


def _central_difference(up: float, down: float, eps: float):
    """(up − down) / 2ε with the tolerance of the docstring above: 2e-3 relative, plus F's float32 rounding, which
    depends on the host's kernels (seen: a few ulp of F on an AMD host without AVX512, 3.2e-3 of the smallest
    derivative): 4 float32 epsilons of F in each of up and down, over 2ε."""
    rounding = 4 * torch.finfo(torch.float32).eps * max(abs(up), abs(down)) / eps
    return pytest.approx((up - down) / (2 * eps), rel=2e-3, abs=rounding)


def test_the_table_predicts_from_the_floor_up_only(setup):
    fitness, _ = setup
    table = first_order_table(fitness, LEVELS, WINDOWS, 3)
    base = fitness.kl(tuple(3 for _ in fitness.names), WINDOWS)
    assert all(row[0] is None and row[1] == pytest.approx(base, abs=1e-12) for row in table)
    # raising a layer shrinks its error, so on the whole it lowers F to first order
    assert sum(row[2] for row in table) < len(table) * base and sum(row[3] for row in table) < len(table) * base


def test_the_floor_knapsack_is_the_knapsack_with_the_lower_widths_priced_out(setup):
    fitness, cost = setup
    table = first_order_table(fitness, LEVELS, WINDOWS, 2)
    priced = [[1e6 if v is None else v for v in row] for row in table]
    for budget in (Fraction(5, 2), Fraction(11, 4), Fraction(7, 2)):
        mix = floor_mix(cost, table, budget, BudgetKind.CODE, 2)
        assert mix == knapsack_mix(cost, priced, budget, BudgetKind.CODE)
        assert cost.fits(mix, budget, BudgetKind.CODE) and min(mix) >= 2


def test_floors_are_the_uniform_widths_with_room_to_raise(setup):
    fitness, cost = setup
    budgets = [Fraction(5, 2), Fraction(3), Fraction(13, 4), Fraction(8)]
    # code bits: every layer costs its width per weight, so an integer budget leaves no room
    assert raise_floors(cost, budgets, BudgetKind.CODE) == (2, 3)
    filled = tables(fitness, LEVELS, WINDOWS, (Allocator.GRADIENT,), floors=(2, 3))
    assert set(filled[Allocator.GRADIENT][0]) == {2, 3}
    for budget in budgets:
        mix = allocate(cost, filled[Allocator.GRADIENT][0], budget, BudgetKind.CODE)
        uniform = uniform_mix(cost, budget, BudgetKind.CODE)
        assert cost.fits(mix, budget, BudgetKind.CODE) and min(mix) >= uniform[0]
        assert (mix == uniform) == (budget.denominator == 1)


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_every_batch_and_a_soft_capped_head_enter_the_step(stories_parent, softcap):
    """Six windows in batches of 4 (two batches folded into one row), and Gemma 2's soft cap on the logits (a head
    that is not affine, whose loss is taken from both distributions): the first-order step against the central
    difference as above, same ε and tolerance. Measured on layers 0, 9 and the last, with and without the cap: the
    relative difference is under 6.5e-4 at ε = 0.1 (so the truncation, ∝ ε², is under 6e-5 at ε = 0.03) and under
    1.1e-4 at ε = 0.03; 2e-3 covers it with room."""
    from matgptq.allocation.fitness import Fitness
    from matgptq.evaluation.teacher import Teacher
    from matgptq.models import calibration_windows, load_tokenizer, read_text, tokenize
    from tests.conftest import STORIES, TINYSTORIES

    windows = calibration_windows(tokenize(load_tokenizer(STORIES), read_text(TINYSTORIES, (0.6, 0.7))), 6, 64, 0)
    candidate, reference = matgptq.load(stories_parent, bits=8), matgptq.load(STORIES)
    for model in (candidate, reference):
        model.config.final_logit_softcapping = softcap
    names = tuple(read_checkpoint(stories_parent).layers)
    with Teacher(reference, windows, batch_size=4) as teacher:
        fitness = Fitness(candidate, teacher, windows, names, batch_size=4)
        assert (fitness.head.softcap is None) == (softcap is None)
        every = tuple(range(6))
        table = first_order_table(fitness, LEVELS, every, 3)
        mix, layers, eps, layer = tuple(3 for _ in names), candidate.matgptq.layers, 0.03, 9
        assert table[layer][1] == pytest.approx(fitness.kl(mix, every), rel=1e-12)
        at3 = layers[names[layer]].slice(3).dequantize(torch.float32)
        d = layers[names[layer]].slice(4).dequantize(torch.float32) - at3
        up = fitness.kl(mix, every, None, (layer, at3 + eps * d))
        down = fitness.kl(mix, every, None, (layer, at3 - eps * d))
        assert table[layer][2] - table[layer][1] == _central_difference(up, down, eps)
