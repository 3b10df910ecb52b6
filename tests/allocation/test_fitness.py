"""Fitness = the all-at-once KL formula; the prefix cache changes nothing; sensitivities and the DP start."""

from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F

import matgptq
from matgptq.allocation import sensitivity
from matgptq.allocation.budget import BudgetKind, CostModel
from matgptq.allocation.fitness import Fitness
from matgptq.allocation.sensitivity import (
    Sensitivity,
    Wide,
    knapsack_mix,
    measure,
    measure_table,
    probe_level,
    probe_of,
)
from matgptq.evaluation.teacher import Teacher
from matgptq.formats import read_checkpoint
from matgptq.models import calibration_windows, load_tokenizer, read_text, tokenize
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


def test_window_kls_are_each_windows_kl(setup):
    """window_kls: one KL per window from one pass (its chunks never straddle two windows), each the window's mean
    of the brute-force per-token KL; kl is their mean. Same tolerance as above."""
    fitness, reference, windows, parent = setup
    mix = tuple(4 if i % 2 else 3 for i in range(len(fitness.names)))
    chosen = (5, 1, 2, 0, 4)  # more than one batch of 4, out of order
    got = fitness.window_kls(mix, chosen)
    candidate = matgptq.load(parent, bits=dict(zip(fitness.names, mix)))
    with torch.no_grad():
        logp = F.log_softmax(reference(windows[list(chosen)]).logits[:, :-1].double(), -1)
        logq = F.log_softmax(candidate(windows[list(chosen)]).logits[:, :-1].double(), -1)
    want = (logp.exp() * (logp - logq)).sum(-1).mean(-1).tolist()
    assert got == pytest.approx(want, rel=1e-5)
    assert fitness.kl(mix, chosen) == pytest.approx(sum(got) / len(got), rel=1e-12)


def test_bfloat16_scoring_is_the_formula_on_an_autocast_body(setup):
    """compute_dtype=bfloat16 runs the body under autocast and the head and KL in float32: the all-at-once formula on
    that body's hidden states (the model's own forward, head applied in float64 here), the same tolerance as above.
    `exact()` is float32 again."""
    fitness, reference, windows, parent = setup
    fast = Fitness(fitness.model, fitness.teacher, windows, fitness.names, batch_size=4, compute_dtype=torch.bfloat16)
    mix = tuple(4 if i % 2 else 2 for i in range(len(fitness.names)))
    chosen = (1, 3, 4)
    got = fast.kl(mix, chosen)
    candidate = matgptq.load(parent, bits=dict(zip(fitness.names, mix)))
    head = candidate.get_output_embeddings().weight.double()
    with torch.no_grad():
        logp = F.log_softmax(reference(windows[list(chosen)]).logits[:, :-1].double(), -1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = candidate.model(windows[list(chosen)]).last_hidden_state
        logq = F.log_softmax((hidden[:, :-1].double() @ head.T), -1)
    want = float((logp.exp() * (logp - logq)).sum(-1).mean())
    assert got == pytest.approx(want, rel=1e-5)
    assert got != fitness.kl(mix, chosen)  # the body really ran in bfloat16
    with fast.exact():
        assert fast.kl(mix, chosen) == fitness.kl(mix, chosen)
    n = len(fitness.names)
    base = tuple(4 for _ in range(n))
    late = tuple(2 if i >= n - 7 else 4 for i in range(n))  # differs from base in the last block only
    cache = fast.prefix_cache(base, chosen)
    assert fast.kl(base, chosen, cache) == fast.kl(base, chosen)  # records every block
    assert fast.kl(late, chosen, cache) == fast.kl(late, chosen)  # replays all but the last: bit-identical in bf16
    assert fast.kl(mix, chosen, cache) == got
    with fast.exact():  # a bfloat16 cache is not replayed into a float32 scoring
        assert fast.kl(late, chosen, cache) == fitness.kl(late, chosen)


def test_prefix_cache_gives_bit_identical_scores(setup):
    fitness = setup[0]
    n = len(fitness.names)
    base = tuple(4 for _ in range(n))
    windows = (1, 2, 4)
    cache = fitness.prefix_cache(base, windows)
    for changed in ([n - 1], [7, 20], [0], []):
        mix = tuple(2 if i in changed else 4 for i in range(n))
        assert fitness.kl(mix, windows, cache) == fitness.kl(mix, windows)
        # filled by the scorings: the outputs of the blocks before the first changed one, at least
        assert len(cache.outputs[0]) >= fitness.first_changed_block(base, mix)
    assert len(cache.outputs[0]) == len(fitness.blocks)  # the unchanged mix ran (and recorded) every block
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
    window_bytes = (fitness.windows.shape[1] - 1) * (fitness.body.hidden_size + 2) * 8  # const, g, mass in float64
    assert window_bytes < blocks_bytes  # stories260K: 5 blocks × 64 wide against 63 rows of 66 float64 terms
    mix = tuple(2 if i % 4 == 3 else 4 for i in range(n))
    for limit, held, outputs in ((window_bytes, 1, False), (blocks_bytes, 2, True)):
        small = Fitness(fitness.model, fitness.teacher, fitness.windows, fitness.names, batch_size=4, cache_limit=limit)
        cache = small.prefix_cache(tuple(4 for _ in range(n)), windows)
        assert (cache.outputs is not None) == outputs
        assert small.kl(mix, windows, cache) == small.kl(mix, windows) == fitness.kl(mix, windows)
        assert small.held_windows == held  # the second window, over the limit, was recomputed at each use


def test_a_head_bias_enters_the_kl(setup):
    """z = W h + b: the bias's part of Σ p z sits in the teacher terms; checked against the all-at-once formula."""
    fitness, reference, windows, parent = setup
    mix = tuple(3 for _ in fitness.names)
    candidate = matgptq.load(parent, bits=dict(zip(fitness.names, mix)))
    head = candidate.get_output_embeddings()
    head.bias = torch.nn.Parameter(torch.linspace(-2, 2, head.out_features))
    biased = Fitness(candidate, fitness.teacher, windows, fitness.names, batch_size=4)
    chosen = (1, 4)
    with torch.no_grad():
        logp = F.log_softmax(reference(windows[list(chosen)]).logits[:, :-1].double(), -1)
        logq = F.log_softmax(candidate(windows[list(chosen)]).logits[:, :-1].double(), -1)
    want = float((logp.exp() * (logp - logq)).sum(-1).mean())
    assert want > fitness.kl(mix, chosen) + 0.01  # the bias is large enough to matter
    # as in test_kl_is_the_all_at_once_formula: float32 logits against float64 log-softmax, ~1e-6 relative per term
    assert biased.kl(mix, chosen) == pytest.approx(want, rel=1e-5)


def _relative_errors(fitness, parent, layer: int, levels) -> dict[int, float]:
    """t(r) = ‖W(r) − W(top)‖² / ‖W(top)‖² of one layer, its slices loaded from the file (an independent path to the
    weights the fitness slices in memory)."""
    name, top = fitness.names[layer], levels[-1]
    weights = {}
    for r in levels:
        model = matgptq.load(parent, bits={name: r} | {x: top for x in fitness.names if x != name})
        weights[r] = model.get_submodule(name).weight.detach().double()
    return {r: float((weights[r] - weights[top]).square().sum() / weights[top].square().sum()) for r in levels}


def test_probe_sensitivity_follows_the_linearity_model(setup):
    """PROBE: measured at the probe level, the other levels scaled by the layer's relative squared weight error."""
    fitness, _, _, parent = setup
    levels = (2, 3, 4, 8)
    windows = (0, 1)
    table = measure(fitness, levels, windows, Sensitivity.PROBE)
    n = len(fitness.names)
    top = tuple(8 for _ in range(n))
    base = fitness.kl(top, windows)
    assert probe_level(levels) == 2
    for layer in (0, 9, n - 1):
        t = _relative_errors(fitness, parent, layer, levels)
        probed = fitness.kl(tuple(2 if i == layer else 8 for i in range(n)), windows)
        slope = max(0.0, probed - base) / t[2]
        # the model's float32 weights vs the float64 dequantization of the probe: t agrees to ~1e-7 relative
        assert table[layer] == pytest.approx([probed] + [base + slope * t[r] for r in levels[1:]], rel=1e-6, abs=1e-9)
    assert all(row[-1] == base for row in table)


def test_a_full_table_stopped_by_its_deadline_extrapolates_from_its_highest_scored_level(setup, monkeypatch):
    """FULL scores level by level from the lowest; a deadline stops it before a level its pace says would end past
    it. The clock here counts scorings (each level costs one per layer), so the deadline admits exactly two levels:
    2 and 3 are scored, 4 comes from 3 by the linearity model; a deadline already past leaves the PROBE table; none
    leaves every level scored. Any of them holds the PROBE table (probe_of)."""
    fitness, _, _, parent = setup
    levels, windows, n = (2, 3, 4, 8), (0, 1), len(fitness.names)
    monkeypatch.setattr(
        sensitivity, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: float(fitness.evaluations))})
    )
    start = fitness.evaluations  # the base scoring comes first, then a level costs n
    stopped = measure_table(fitness, levels, windows, Sensitivity.FULL, deadline=start + 1 + 2 * n)
    assert stopped.measured == (2, 3)
    assert measure_table(fitness, levels, windows, Sensitivity.FULL, deadline=0.0).values == measure(
        fitness, levels, windows, Sensitivity.PROBE
    )
    full = measure_table(fitness, levels, windows, Sensitivity.FULL)
    assert full.measured == (2, 3, 4)
    probe = measure_table(fitness, levels, windows, Sensitivity.PROBE)
    assert probe_of(fitness, levels, full) == probe == probe_of(fitness, levels, stopped)  # the same scorings
    base = fitness.kl(tuple(8 for _ in range(n)), windows)
    for layer in (0, 9, n - 1):
        t = _relative_errors(fitness, parent, layer, levels)
        assert stopped.values[layer][:2] == full.values[layer][:2]  # the scored levels are the same scorings
        slope = max(0.0, full.values[layer][1] - base) / t[3]
        assert stopped.values[layer][2] == pytest.approx(base + slope * t[4], rel=1e-6, abs=1e-9)
        assert stopped.values[layer][3] == full.values[layer][3] == base


def test_a_full_table_given_its_highest_level_scores_up_to_it_and_extrapolates_above(setup):
    """`highest` (search --sensitivity-top): the levels up to it are the full table's scorings, each wider level comes
    from it by the linearity model (the probe formula with p = `highest`), computed here from the layer's own
    weights; `highest` the lowest level gives the PROBE table."""
    fitness, _, _, parent = setup
    levels, windows, n = (2, 3, 4, 6, 8), (0, 1), len(fitness.names)
    capped = measure_table(fitness, levels, windows, Sensitivity.FULL, highest=3)
    full = measure_table(fitness, levels, windows, Sensitivity.FULL)
    assert capped.measured == (2, 3) and full.measured == (2, 3, 4, 6)
    base = fitness.kl(tuple(8 for _ in range(n)), windows)
    for layer in (0, 9, n - 1):
        t = _relative_errors(fitness, parent, layer, levels)
        assert capped.values[layer][:2] == full.values[layer][:2]  # the same scorings
        slope = max(0.0, full.values[layer][1] - base) / t[3]
        # t from the model's float32 weights vs the float64 dequantization: ~1e-7 relative (as the PROBE test)
        assert capped.values[layer][2:4] == pytest.approx(
            [base + slope * t[4], base + slope * t[6]], rel=1e-6, abs=1e-9
        )
        assert capped.values[layer][4] == base
    lowest = measure_table(fitness, levels, windows, Sensitivity.FULL, highest=2)
    assert lowest.values == measure(fitness, levels, windows, Sensitivity.PROBE) and lowest.measured == (2,)


def test_wide_levels_are_the_wide_windows_table_moved_onto_the_narrow_base(setup):
    """`wide` (search --sensitivity-wide): the oracle is two tables measured apart, one on the narrow windows W and
    one on the wide windows W', combined by hand. Below the wide level the values are W's scorings. From it up they
    are W''s values plus F(top; W) − F(top; W'), the extrapolated level above `highest` too: the slope is taken on
    the increment over each table's own base, which the move leaves alone. The scorings are the same computations (the
    other tests' `==`); only the float64 sum of three KLs of order 1e-2 can round differently, a few ulps (≈1e-17),
    hence abs=1e-15."""
    fitness, _, _, _ = setup
    levels, narrow, wide, n = (2, 3, 4, 6, 8), (0,), (1, 2), len(fitness.names)
    hybrid = measure_table(fitness, levels, narrow, Sensitivity.FULL, highest=4, wide=Wide(4, wide))
    low = measure_table(fitness, levels, narrow, Sensitivity.FULL)
    high = measure_table(fitness, levels, wide, Sensitivity.FULL, highest=4)
    top = tuple(8 for _ in range(n))
    shift = fitness.kl(top, narrow) - fitness.kl(top, wide)
    assert shift != 0.0  # else the test could not tell a moved value from a raw one
    assert hybrid.measured == (2, 3, 4)
    for layer in range(n):
        assert hybrid.values[layer][:2] == low.values[layer][:2]
        assert hybrid.values[layer][2:] == pytest.approx([v + shift for v in high.values[layer][2:]], rel=0, abs=1e-15)


def test_a_deadline_prices_the_next_level_by_its_windows(setup, monkeypatch):
    """With wide levels on three windows, the next level costs three times the last one per layer: the clock here
    counts scored windows, level 2 takes n (one window, n layers), so level 3 on three windows needs 3n more. A
    deadline one short of that stops after level 2, where pricing by the last level's time (n) would go on; one
    that leaves 3n plus the wide base's 3 windows admits level 3 and stops before level 4 (3n more again)."""
    fitness, _, _, _ = setup
    levels, n, rows = (2, 3, 4, 8), len(fitness.names), fitness.windows.shape[1] - 1
    monkeypatch.setattr(
        sensitivity, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: fitness.tokens / rows)})
    )
    wide = Wide(3, (1, 2, 3))
    start = fitness.tokens / rows  # the narrow base (1 window), then level 2 (n windows)
    short = measure_table(fitness, levels, (0,), Sensitivity.FULL, deadline=start + 1 + 4 * n - 1, wide=wide)
    assert short.measured == (2,)
    start = fitness.tokens / rows
    enough = measure_table(fitness, levels, (0,), Sensitivity.FULL, deadline=start + 1 + 4 * n + 3, wide=wide)
    assert enough.measured == (2, 3)


@pytest.mark.parametrize(
    "attr,value,post",
    [
        ("final_logit_softcapping", 3.0, lambda z: 3.0 * torch.tanh(z / 3.0)),  # Gemma 2/3: not affine, scored directly
        ("logits_scaling", 4.0, lambda z: z / 4.0),  # Granite: affine, folded into the teacher terms
    ],
)
def test_post_processed_logits_enter_the_kl(setup, attr, value, post):
    """A model whose forward post-processes its logits (evaluation/teacher.py Head) is scored on the processed ones:
    the Llama fixture given the setting (its own forward ignores it) against the formula applied by hand."""
    fitness, _, windows, parent = setup
    mix, chosen = tuple(3 for _ in fitness.names), (1, 4)
    candidate, reference = matgptq.load(parent, bits=dict(zip(fitness.names, mix))), matgptq.load(STORIES)
    with torch.no_grad():
        logp = F.log_softmax(post(reference(windows[list(chosen)]).logits[:, :-1].double()), -1)
        logq = F.log_softmax(post(candidate(windows[list(chosen)]).logits[:, :-1].double()), -1)
    want = float((logp.exp() * (logp - logq)).sum(-1).mean())
    for model in (candidate, reference):
        setattr(model.config, attr, value)
    with Teacher(reference, windows, batch_size=4) as teacher:
        got = Fitness(candidate, teacher, windows, fitness.names, batch_size=4).kl(mix, chosen)
    # as in test_kl_is_the_all_at_once_formula: float32 logits against float64 log-softmax, ~1e-6 relative per term
    assert got == pytest.approx(want, rel=1e-5)
