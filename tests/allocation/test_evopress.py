"""EvoPress on stories260K: resuming gives the uninterrupted result; the search, with uniform draws and guided by
its start's table, beats its knapsack start and random search given the same number of fitness evaluations."""

import time
from fractions import Fraction

import numpy as np
import pytest

import matgptq
from matgptq.allocation import evopress, timing
from matgptq.allocation.budget import BudgetKind, CostModel
from matgptq.allocation.evopress import EvoConfig, Stage, evolve, generation_windows, parse_stages
from matgptq.allocation.fitness import Fitness
from matgptq.allocation.mutation import random_mix
from matgptq.allocation.sensitivity import knapsack_mix, measure
from matgptq.errors import UserError
from matgptq.evaluation.teacher import Teacher
from matgptq.formats import read_checkpoint
from matgptq.models import calibration_windows, load_tokenizer, read_text, tokenize
from tests.conftest import STORIES, TINYSTORIES

LEVELS = (2, 3, 4, 6, 8)
BUDGET = Fraction(3)
# stage 1 scores 4 of the 16 calibration windows of 64 tokens, stage 2 all of them: the parent then competes on the
# same tokens every generation, so its KL on them can only fall (elitism), and random noise in the last stage is no
# excuse for losing to the start
CONFIG = EvoConfig(generations=30, offspring=12, stages=(Stage(252, 4), Stage(1008, 1)), seed=3)
SETTINGS = {"test": "stories"}


@pytest.fixture(scope="module")
def problem(stories_parent):
    windows = calibration_windows(tokenize(load_tokenizer(STORIES), read_text(TINYSTORIES, (0.6, 0.8))), 16, 64, 1)
    teacher = Teacher(matgptq.load(STORIES), windows)
    ckpt = read_checkpoint(stories_parent)
    model = CostModel.from_checkpoint(ckpt, LEVELS)

    def fitness():  # a fresh model, as a new process would have
        return Fitness(matgptq.load(stories_parent, bits=8), teacher, windows, model.names)

    f = fitness()
    table = measure(f, LEVELS, (0, 1, 2, 3))
    start = knapsack_mix(model, table, BUDGET, BudgetKind.CODE)
    yield model, fitness, start, windows, table
    teacher.close()


def run(problem, path, **kw):
    model, fitness, start, _, _ = problem
    costs, limit = model.table(BudgetKind.CODE), model.limit(BUDGET, BudgetKind.CODE)
    return evolve(fitness(), LEVELS, costs, limit, start, kw.pop("config", CONFIG), path, SETTINGS, **kw)


SHORT = EvoConfig(generations=8, offspring=8, stages=(Stage(126, 3), Stage(504, 1)), seed=5)


@pytest.mark.parametrize("guided", [False, True])
def test_resume_after_a_stop_ends_with_the_uninterrupted_result(problem, tmp_path, guided):
    record = {"steps": 2, "accepted": 1, "seconds": 0.5, "history": [{"step": 1, "kept": True}]}  # how start was made
    table = problem[4] if guided else None
    whole = run(problem, tmp_path / "a.json", config=SHORT, table=table)
    stopped = run(problem, tmp_path / "b.json", config=SHORT, stop_after=3, refined=record, table=table)
    assert stopped.generation == 3
    resumed = run(problem, tmp_path / "b.json", config=SHORT, resume=True, table=table)
    assert resumed.refine == record and whole.refine == {}  # the state keeps it across the stop
    assert resumed.generation == whole.generation == SHORT.generations
    assert resumed.parent == whole.parent
    assert [h["kl"] for h in resumed.history] == [h["kl"] for h in whole.history]
    assert resumed.evaluations == whole.evaluations
    # the prefix cache changes no score, so neither the path nor the result
    uncached = run(
        problem, tmp_path / "c.json", config=EvoConfig(**{**SHORT.__dict__, "prefix_cache": False}), table=table
    )
    assert uncached.parent == whole.parent
    with pytest.raises(UserError, match="other settings"):
        evolve(
            problem[1](),
            LEVELS,
            problem[0].table(BudgetKind.CODE),
            0,
            problem[2],
            CONFIG,
            tmp_path / "b.json",
            {"test": "other"},
            resume=True,
        )


@pytest.mark.parametrize("guided", [False, True])
def test_search_beats_its_start_and_random_search(problem, tmp_path, guided):
    model, fitness, start, windows, table = problem
    state = run(problem, tmp_path / "s.json", table=table if guided else None)
    f = fitness()
    everything = tuple(range(windows.shape[0]))
    searched, dp = f.kl(state.parent, everything), f.kl(start, everything)
    assert model.fits(state.parent, BUDGET, BudgetKind.CODE)
    assert searched < dp
    # random search: as many random budget-filling mixes as the search scored, each on all 16 windows (more tokens
    # per evaluation than most of the search's), keep the best
    rng = np.random.default_rng(0)
    costs, limit = model.table(BudgetKind.CODE), model.limit(BUDGET, BudgetKind.CODE)
    best = min(
        f.kl(tuple(LEVELS[i] for i in random_mix(costs, limit, rng)), everything) for _ in range(state.evaluations)
    )
    assert searched < best


def test_stage_and_config_validation():
    assert parse_stages("2048:16,16384:4,131072:1") == (Stage(2048, 16), Stage(16384, 4), Stage(131072, 1))
    for bad in ("2048", "a:b", "2048:4,1024:1", "1024:4,2048:2", "1024:20,2048:1"):
        with pytest.raises(UserError):
            EvoConfig(offspring=16, stages=parse_stages(bad))
    for bad in (-0.1, float("inf"), float("nan")):
        with pytest.raises(UserError, match="temperature"):
            EvoConfig(temperature=bad)


def test_a_deadline_stops_before_a_generation_that_would_end_after_it(problem, tmp_path, monkeypatch):
    """No generation starts past the deadline; one far away changes nothing (the same mix, bit for bit). The next
    generation is guessed to take the mean of those so far: on a clock where time is work (one second per scoring,
    so each generation takes as long as its scorings on any machine, under any load), room for 2.5 generations'
    scorings runs exactly two."""
    passed = run(problem, tmp_path / "a.json", config=SHORT, deadline=time.perf_counter() - 1)
    assert passed.generation == 0 and passed.parent == passed.start
    far = run(problem, tmp_path / "b.json", config=SHORT, deadline=time.perf_counter() + 3600)
    free = run(problem, tmp_path / "c.json", config=SHORT)
    assert far.generation == free.generation == SHORT.generations and far.parent == free.parent
    per = [h["evaluations"] for h in free.history]
    per = [b - a for a, b in zip([0, *per], per)]
    assert len(set(per)) == 1  # every generation scores as many candidates (the clock below needs it)

    model, fitness, start, _, _ = problem
    f = fitness()
    clock = type("WorkClock", (), {"perf_counter": staticmethod(lambda: float(f.evaluations))})
    monkeypatch.setattr(evopress, "time", clock)
    monkeypatch.setattr(timing, "time", clock)  # timing.past judges the deadline
    costs, limit = model.table(BudgetKind.CODE), model.limit(BUDGET, BudgetKind.CODE)
    short = evolve(f, LEVELS, costs, limit, start, SHORT, tmp_path / "e.json", SETTINGS, deadline=2.5 * per[0])
    assert short.generation == 2


def test_the_first_generation_is_priced_by_its_window_scorings(problem, tmp_path, monkeypatch):
    """`generation_windows` is the count the scorings make: the oracle is the tokens a generation of the free run
    scored (Fitness counts them), over the tokens a window scores. With `per_window`, the first generation is priced
    at that many scorings: on a clock that counts scored windows (one second each), a deadline half a window short of
    it runs none, half a window past it runs exactly one (the next is priced at the first's time and ends past it)."""
    model, fitness, start, windows, _ = problem
    rows = windows.shape[1] - 1
    free = run(problem, tmp_path / "free.json", config=SHORT)
    tokens = [h["tokens"] for h in free.history]
    per = {(b - a) // rows for a, b in zip([0, *tokens], tokens)}
    assert per == {generation_windows(SHORT, windows.shape[0], windows.shape[1])}
    f = fitness()
    clock = type("WindowClock", (), {"perf_counter": staticmethod(lambda: f.tokens / rows)})
    monkeypatch.setattr(evopress, "time", clock)
    monkeypatch.setattr(timing, "time", clock)
    costs, limit = model.table(BudgetKind.CODE), model.limit(BUDGET, BudgetKind.CODE)
    n = per.pop()
    for room, generations in ((n - 0.5, 0), (n + 0.5, 1)):
        out = evolve(
            f,
            LEVELS,
            costs,
            limit,
            start,
            SHORT,
            tmp_path / f"{room}.json",
            SETTINGS,
            deadline=f.tokens / rows + room,
            per_window=1.0,
        )
        assert out.generation == generations, room
