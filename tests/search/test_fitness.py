"""Fitness = the all-at-once KL formula; the prefix cache changes nothing; sensitivities and the DP start."""

from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F

import matgptq
from matgptq.evaluation.teacher import Teacher
from matgptq.formats import read_checkpoint
from matgptq.models import calibration_windows, load_tokenizer, read_text, tokenize
from matgptq.search.budget import BudgetKind, CostModel
from matgptq.search.fitness import Fitness
from matgptq.search.sensitivity import Sensitivity, knapsack_mix, measure, probe_level
from tests.conftest import STORIES, TINYSTORIES


@pytest.fixture(scope="module")
def setup(stories_parent):
    torch.manual_seed(0)
    windows = calibration_windows(tokenize(load_tokenizer(STORIES), read_text(TINYSTORIES, (0.6, 0.7))), 6, 64, 0)
    reference = matgptq.load(STORIES)
    teacher = Teacher(reference, windows, batch_size=4)
    model = matgptq.load(stories_parent, bits=8)
    names = tuple(read_checkpoint(stories_parent).layers)
    yield Fitness(model, teacher, windows, names, batch_size=4), reference, windows, stories_parent
    teacher.close()


def test_kl_is_the_all_at_once_formula(setup):
    fitness, reference, windows, parent = setup
    mix = tuple(3 if i % 3 else 2 for i in range(len(fitness.names)))
    chosen = (0, 2, 3, 5)
    got = fitness.kl(mix, chosen)
    candidate = matgptq.load(parent, bits=dict(zip(fitness.names, mix)))  # built from the file, not set_bits
    with torch.no_grad():
        logp = F.log_softmax(reference(windows[list(chosen)]).logits[:, :-1].double(), -1)
        logq = F.log_softmax(candidate(windows[list(chosen)]).logits[:, :-1].double(), -1)
    want = float((logp.exp() * (logp - logq)).sum(-1).mean())
    # float32 log-softmax vs float64 of the same float32 logits: relative error ~1e-6 per term, averaged
    assert got == pytest.approx(want, rel=1e-5)
    assert fitness.tokens >= 4 * 63


def test_prefix_cache_gives_bit_identical_scores(setup):
    fitness = setup[0]
    n = len(fitness.names)
    base = tuple(4 for _ in range(n))
    windows = (1, 2, 4)
    cache = fitness.prefix_cache(base, windows)
    for changed in ([n - 1], [7, 20], [0], []):
        mix = tuple(2 if i in changed else 4 for i in range(n))
        assert fitness.kl(mix, windows, cache) == fitness.kl(mix, windows)
    assert fitness.first_changed_block(base, tuple(2 if i == 20 else 4 for i in range(n))) == 20 // 7


def test_sensitivity_and_knapsack_start(setup):
    fitness, _, _, parent = setup
    levels = (2, 4, 8)
    table = measure(fitness, levels, (0, 1))
    n = len(fitness.names)
    # each entry is a real scoring of "top everywhere, one layer lowered"
    assert table[5][0] == fitness.kl(tuple(2 if i == 5 else 8 for i in range(n)), (0, 1))
    assert all(row[2] == table[0][2] for row in table)  # the top level: the same mix for every layer
    model = CostModel.from_checkpoint(read_checkpoint(parent), levels)
    mix = knapsack_mix(model, table, Fraction(3), BudgetKind.CODE)
    assert model.fits(mix, Fraction(3), BudgetKind.CODE)
    assert set(mix) <= set(levels) and len(set(mix)) > 1


def test_each_cache_part_is_kept_only_within_the_limit(setup):
    fitness = setup[0]
    n, windows = len(fitness.names), (0, 3)
    blocks_bytes = len(fitness.blocks) * len(windows) * fitness.windows.shape[1] * fitness.body.hidden_size * 4
    teacher_bytes = len(windows) * (fitness.windows.shape[1] - 1) * (fitness.head.out_features + 4) * 4
    assert blocks_bytes < teacher_bytes  # stories260K: 5 blocks × 64 wide against a 512-token vocabulary
    small = Fitness(fitness.model, fitness.teacher, fitness.windows, fitness.names, batch_size=4,
                    cache_limit=blocks_bytes)  # fmt: skip
    cache = small.prefix_cache(tuple(4 for _ in range(n)), windows)
    assert cache.outputs is not None and cache.teacher is None
    mix = tuple(2 if i % 4 == 3 else 4 for i in range(n))
    assert small.kl(mix, windows, cache) == small.kl(mix, windows) == fitness.kl(mix, windows)


def test_probe_sensitivity_follows_the_linearity_model(setup):
    """PROBE: measured at the probe level, the other levels scaled by the layer's relative squared weight error,
    the errors taken here from slices loaded from the file (an independent path to the same weights)."""
    fitness, _, _, parent = setup
    levels = (2, 3, 4, 8)
    windows = (0, 1)
    table = measure(fitness, levels, windows, Sensitivity.PROBE)
    n = len(fitness.names)
    top = tuple(8 for _ in range(n))
    base = fitness.kl(top, windows)
    assert probe_level(levels) == 2
    for layer in (0, 9, n - 1):
        name = fitness.names[layer]
        weights = {}
        for r in levels:
            model = matgptq.load(parent, bits={name: r} | {x: 8 for x in fitness.names if x != name})
            weights[r] = model.get_submodule(name).weight.detach().double()
        t = {r: float((weights[r] - weights[8]).square().sum() / weights[8].square().sum()) for r in levels}
        probed = fitness.kl(tuple(2 if i == layer else 8 for i in range(n)), windows)
        slope = max(0.0, probed - base) / t[2]
        # the model's float32 weights vs the float64 dequantization of the probe: t agrees to ~1e-7 relative
        assert table[layer] == pytest.approx([base + slope * t[r] for r in levels], rel=1e-6, abs=1e-9)
    assert all(row[-1] == base for row in table)
