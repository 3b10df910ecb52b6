"""The written mix's test against the uniform slice (choice.py): the paired statistics computed by hand, and the
choice it makes either way; the search's start chosen on the whole pool, against every candidate scored window by
window. The per-window scores themselves are tested in test_fitness.py (window_kls)."""

import math

from matgptq.allocation.choice import Gap, choose, first_parent, paired_gap, pool_scores

LOW, HIGH, MIXED = (2, 2, 2), (4, 4, 2), (3, 3, 2)


def test_the_gap_is_a_paired_difference():
    """d = (−0.1, −0.3, −0.2): mean −0.2, sample sd 0.1, standard error 0.1/√3."""
    gap = paired_gap([0.9, 0.7, 0.8], [1.0, 1.0, 1.0], "uniform 2")
    assert gap.against == "uniform 2" and gap.windows == 3
    assert math.isclose(gap.mean, -0.2) and math.isclose(gap.se, 0.1 / math.sqrt(3))


def test_the_rule_is_a_one_sided_paired_test():
    """mean + 2·se < 0 (choice.py's derivation of the margin), and no verdict from one window."""
    assert Gap("u", -0.021, 0.01, 8).shown and not Gap("u", -0.019, 0.01, 8).shown
    assert not Gap("u", -1.0, math.inf, 1).shown and not Gap("u", 0.0, 0.0, 8).shown


def test_the_uniform_slice_stays_unless_the_lowest_is_shown_better():
    """A mix lower on every window replaces the slice; one lower on average only through one window does not."""
    uniform = [1.0, 1.0, 1.0, 1.0]
    chosen, gap = choose({"uniform 2": LOW, "raised": HIGH}, {LOW: uniform, HIGH: [0.5, 0.6, 0.4, 0.5]})
    assert (chosen, gap.against, gap.shown) == ("raised", "uniform 2", True)
    # mean 0.95 < 1.0, but d = (−0.6, +0.2, +0.1, +0.1): se ≈ 0.19 > 0.05 / 2
    chosen, gap = choose({"noisy": MIXED, "uniform 2": LOW}, {LOW: uniform, MIXED: [0.4, 1.2, 1.1, 1.1]})
    assert (chosen, gap.shown) == ("uniform 2", False) and math.isclose(gap.mean, -0.05)


def test_without_a_contest_the_lowest_is_written():
    """No uniform mix among the candidates, or the lowest is the slice: nothing to test."""
    assert choose({"a": MIXED, "b": HIGH}, {MIXED: [0.4, 0.5], HIGH: [0.6, 0.6]}) == ("a", None)
    assert choose({"uniform 2": LOW, "b": HIGH}, {LOW: [0.4, 0.5], HIGH: [0.6, 0.6]}) == ("uniform 2", None)
    # ties go to the first candidate
    assert choose({"uniform 2": LOW, "b": HIGH}, {LOW: [0.5, 0.5], HIGH: [0.5, 0.5]}) == ("uniform 2", None)


def test_the_start_is_the_lowest_on_the_whole_pool_and_the_report_reuses_its_scores(stories_fitness):
    """first_parent against the obvious oracle: each candidate scored alone on each window of the pool in float32.
    The start is the lowest mean (ties: the first, the knapsack mix), its scores are the oracle's, and pool_scores
    given them scores only a mix they lack. Tolerance: the oracle's single-window batches and the pool's batches of
    4 windows sum the same float32 products in another order, a relative difference of a few ulps (~1e-7) per
    product over tens of thousands of terms: 1e-5 relative is far above that and far below the candidates' gaps."""
    f = stories_fitness
    n, windows = len(f.names), tuple(range(f.windows.shape[0]))
    mixes = {"knapsack": (4,) * n, "uniform 2": (2,) * n, "wide": (6,) * n}
    with f.exact():
        oracle = {m: [f.kl(m, (w,)) for w in windows] for m in mixes.values()}
    mean = {k: sum(oracle[m]) / len(windows) for k, m in mixes.items()}
    start, label, pooled = first_parent(f, mixes, windows)
    assert label == min(mean, key=mean.get) == "wide" and start == mixes["wide"]
    for m, scores in pooled.items():
        assert all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(scores, oracle[m], strict=True))
    assert first_parent(f, {"knapsack": (3,) * n, "same": (3,) * n}, windows)[1] == "knapsack"
    before = f.evaluations
    more = pool_scores(f, [*mixes.values(), (8,) * n], windows, pooled)
    assert f.evaluations - before == 1 and set(more) == {*mixes.values(), (8,) * n}
