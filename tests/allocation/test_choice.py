"""The written mix's test against the uniform slice (choice.py): the window-by-window gap against a brute-force
per-window KL, and the choice it makes either way."""

import math
import statistics

import pytest
import torch
import torch.nn.functional as F

import matgptq
from matgptq.allocation.choice import Gap, choose, paired_gap
from tests.conftest import STORIES


def per_window_kl(parent, names, mix, windows) -> list[float]:
    """Mean KL per predicted token of each window: the reference's and the mix's float64 log-softmax, the mix's model
    built from the file (not through the fitness)."""
    reference = matgptq.load(STORIES)
    candidate = matgptq.load(parent, bits=dict(zip(names, mix)))
    with torch.no_grad():
        logp = F.log_softmax(reference(windows).logits[:, :-1].double(), -1)
        logq = F.log_softmax(candidate(windows).logits[:, :-1].double(), -1)
    return (logp.exp() * (logp - logq)).sum(-1).mean(-1).tolist()


def test_the_gap_is_the_paired_difference_of_each_window(stories_fitness, stories_parent):
    fitness = stories_fitness
    n = len(fitness.names)
    a = tuple(4 if i % 2 else 3 for i in range(n))
    b = tuple(3 for _ in range(n))
    windows = (0, 1, 2, 3, 4, 5)
    gap = paired_gap(fitness, a, b, windows, "uniform 3")
    ka, kb = (per_window_kl(stories_parent, fitness.names, m, fitness.windows[list(windows)]) for m in (a, b))
    d = [x - y for x, y in zip(ka, kb)]
    # each window's float32 score vs float64 log-softmax of float32 logits: ~1e-6 relative (test_fitness), on KLs
    # of ~0.1-1, so ≲ 1e-6 absolute per d_w; the mean and the standard error move by as much
    assert gap.mean == pytest.approx(statistics.fmean(d), abs=1e-5)
    assert gap.se == pytest.approx(statistics.stdev(d) / math.sqrt(len(d)), abs=1e-5)
    assert gap.windows == 6 and gap.against == "uniform 3"


def test_the_uniform_slice_stays_unless_the_lowest_is_shown_better(stories_fitness):
    """Two real gaps: every layer of the slice raised to 8 bits but one is better on every window (shown); one layer
    of the top slice lowered to 2 bits is worse (not shown). The scores given to `choose` call the second mix the
    lowest, as a pool that happens to favour it would: the slice is written all the same."""
    fitness = stories_fitness
    n, windows = len(fitness.names), tuple(range(6))
    low, high = tuple(2 for _ in range(n)), tuple(8 if i else 2 for i in range(n))
    chosen, gap = choose(fitness, {"uniform 2": low, "raised": high}, {low: 1.0, high: 0.1}, windows)
    assert (chosen, gap.against, gap.shown) == ("raised", "uniform 2", True) and gap.mean < 0
    top, lowered = tuple(8 for _ in range(n)), tuple(2 if i == 0 else 8 for i in range(n))
    chosen, gap = choose(fitness, {"lowered": lowered, "uniform 8": top}, {top: 0.2, lowered: 0.1}, windows)
    assert (chosen, gap.shown) == ("uniform 8", False) and gap.mean > 0
    assert choose(fitness, {"uniform 8": top}, {top: 0.2}, windows) == ("uniform 8", None)
    assert choose(fitness, {"lowered": lowered}, {lowered: 0.1}, windows) == ("lowered", None)  # no uniform mix


def test_the_rule_is_a_one_sided_paired_test():
    """mean + MARGIN·se < 0 (MARGIN = 2, choice.py's derivation), and no verdict from one window."""
    assert Gap("u", -0.021, 0.01, 8).shown and not Gap("u", -0.019, 0.01, 8).shown
    assert not Gap("u", -1.0, math.inf, 1).shown and not Gap("u", 0.0, 0.0, 8).shown
