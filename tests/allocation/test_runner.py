"""`matgptq search` as a product: the same mixes as before the search was restructured, a time limit kept on a clock
that slows down mid-run and on the wall clock, old mix files read by every reader, and --help's groups."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

import matgptq
from matgptq.allocation import EvoConfig, ScoreDtype, parse_stages, runner
from matgptq.allocation.allocators import Allocator
from matgptq.allocation.sensitivity import Sensitivity
from matgptq.cli import main
from tests.conftest import STORIES, TINYSTORIES

DATA = Path(__file__).parent / "data"
BEFORE = (Allocator.UNIFORM, Allocator.ERROR, Allocator.GRADIENT)  # the baselines every search ran before
QUICK = dict(calib_range=(0.6, 0.7), seqlen=64, sensitivity_tokens=126, progress=False, score_dtype=ScoreDtype.FLOAT32)


def evo(seed: int, generations: int = 2) -> EvoConfig:
    return EvoConfig(generations=generations, offspring=4, stages=parse_stages("126:2,504:1"), seed=seed)


# the runs data/search_before.json recorded (its cases, by name): budgets, options
CASES = {
    "seed0": ("3.0,2.5", dict(levels=(2, 4, 8), evo=evo(0), baselines=BEFORE)),
    "seed1": ("3.0,2.5", dict(levels=(2, 4, 8), evo=evo(1, 4), baselines=BEFORE)),
    "seed2-probe-noise": (
        "3.0",
        dict(
            levels=(2, 4, 8),
            evo=evo(2),
            baselines=(*BEFORE, Allocator.NOISE),
            sensitivity=Sensitivity.PROBE,
            sensitivity_tokens=2048,
        ),
    ),
    "seed0-tie": ("3.0", dict(levels=(2, 4, 8), evo=evo(0), baselines=BEFORE, tie=True)),
    "seed0-none": ("3.0,2.5", dict(levels=(2, 4, 8), evo=evo(0), baselines=())),
    "seed3-levels5": ("3.5", dict(evo=evo(3), baselines=BEFORE)),
}


@pytest.mark.parametrize("case", CASES)
def test_the_same_options_write_the_mixes_recorded_before_the_restructuring(case, stories_parent, tmp_path):
    """Oracle: data/search_before.json, the mix files the search wrote at 748a49c (before it was restructured) with
    these options on this parent, in float32 (so on any CPU the same arithmetic): the written mix, the knapsack mix,
    the refined start, the evolved mix, which one-shot allocation started and which candidate was written, bit for
    bit. The baselines are given as the default was then."""
    recorded = json.loads((DATA / "search_before.json").read_text())
    budgets, options = CASES[case]
    kw = {**QUICK, **options}
    rows = matgptq.search(stories_parent, budgets, TINYSTORIES, tmp_path / "mixes", **kw)
    for row in rows:
        want = recorded["cases"][case][row["budget"]]
        body = json.loads((tmp_path / "mixes" / f"mix-{row['budget']}.json").read_text())
        assert list(body["bits"]) == recorded["layers"]
        for key in ("bits", "dp_bits", "start_bits", "search_bits"):
            assert [body[key][n] for n in recorded["layers"]] == want[key], (case, row["budget"], key)
        assert (row["start"], row["chosen"], row["generations"]) == (want["start"], want["chosen"], want["generations"])


class SlowingClock:
    """Seconds that pass `factor` times faster than the wall clock's: a machine that slows down when `slow` is
    called (time is then mostly its work, which takes `factor` times longer)."""

    def __init__(self) -> None:
        self.fake, self.last, self.factor = 0.0, time.perf_counter(), 1.0

    def __call__(self) -> float:
        now = time.perf_counter()
        self.fake += (now - self.last) * self.factor
        self.last = now
        return self.fake

    def slow(self, factor: float) -> None:
        self()
        self.factor = factor


LIMIT_SLACK = 1.05  # "the limit plus a few percent": what one piece of work past a deadline may add


def test_a_time_limit_holds_on_a_clock_that_slows_down_tenfold_after_the_tables(stories_parent, tmp_path, monkeypatch):
    """Every price the run measured before the tables is ten times too low after them, as on a machine that
    another job starts to share: the run still ends within the limit plus a few percent of the clock's time
    (one piece of work past a deadline is the most a step may overrun), every budget has its mix file, which loads,
    and the limit, not the generations, ended the searches."""
    clock = SlowingClock()
    shared_tables = runner.shared_tables

    def tables_then_slow(*args, **kw):
        out = shared_tables(*args, **kw)
        clock.slow(10.0)
        return out

    monkeypatch.setattr(runner, "shared_tables", tables_then_slow)
    minutes, budgets = 0.5, ("2.5", "3.0", "3.5", "4.0")
    rows = matgptq.search(
        stories_parent,
        ",".join(budgets),
        TINYSTORIES,
        tmp_path / "mixes",
        **QUICK,
        levels=(2, 3, 4, 6, 8),
        evo=evo(0, 10**6),
        time_limit=minutes,
        clock=clock,
    )
    assert clock.factor == 10.0
    assert clock() <= 60 * minutes * LIMIT_SLACK
    assert clock() >= 60 * minutes / 2  # it used its time: the limit, not the work, ended it
    assert [r["budget"] for r in rows] == list(budgets)
    for r in rows:
        mix = tmp_path / "mixes" / f"mix-{r['budget']}.json"
        assert matgptq.load(stories_parent, bits=mix).matgptq.bits == json.loads(mix.read_text())["bits"]
        assert r["generations"] < 10**6 and any(c.startswith("generations") for c in r["cut"])


def test_a_tiny_time_limit_holds_on_the_wall_clock(stories_parent, tmp_path):
    """Twelve seconds on the wall clock for four budgets, generations without end: the run returns within the limit
    plus a few percent, counted from the call, with a mix file for every budget."""
    minutes = 0.2
    t0 = time.perf_counter()
    rows = matgptq.search(
        stories_parent,
        "2.5,3.0,3.5,4.0",
        TINYSTORIES,
        tmp_path / "mixes",
        **QUICK,
        levels=(2, 3, 4, 6, 8),
        evo=evo(0, 10**6),
        time_limit=minutes,
    )
    assert time.perf_counter() - t0 <= 60 * minutes * LIMIT_SLACK
    assert all((tmp_path / "mixes" / f"mix-{r['budget']}.json").is_file() for r in rows) and len(rows) == 4


def test_a_mix_file_holds_how_it_was_made_and_no_guess(stories_parent, tmp_path):
    """The file names the parent, the budget and its kind, the levels, the seed, the options and the fitness
    reached; no guessed seconds."""
    matgptq.search(stories_parent, "3.0", TINYSTORIES, tmp_path / "m", **QUICK, levels=(2, 4, 8), evo=evo(5))
    body = json.loads((tmp_path / "m" / "mix-3.0.json").read_text())
    settings, summary = body["settings"], body["summary"]
    assert settings["parent"] == str(stories_parent.resolve()) and settings["budget"] == "3"
    assert settings["budget_kind"] == "code" and settings["levels"] == [2, 4, 8] and settings["seed"] == 5
    assert settings["baselines"] == [] and set(summary["baseline_kl"]) == {"knapsack", "probe"}
    assert summary["kl"] > 0 and summary["cut"] == [] and summary["time_limit"] is None
    assert not [k for k in summary if "guess" in k]


def test_old_mix_files_are_read_by_every_reader(stories_parent, tmp_path, capsys):
    """data/mix_before.json is a mix file as the search wrote it at 748a49c (its summary has `report_guess_seconds`,
    a field no longer written): load, eval, export and the bits-config reader take its `bits`, --plot's reader its
    table, and --resume reads its summary row back without the old field."""
    from matgptq.allocation.plot import series
    from matgptq.allocation.resume import finished_row
    from matgptq.formats.mix import read_mix

    old = DATA / "mix_before.json"
    body = json.loads(old.read_text())
    assert "report_guess_seconds" in body["summary"]
    names = list(body["bits"])
    assert read_mix(old, names) == body["bits"]
    assert matgptq.load(stories_parent, bits=old).matgptq.bits == body["bits"]
    assert (
        main(["eval", str(stories_parent), "--bits", str(old), "--text", str(TINYSTORIES), "--text-range", "0:0.002"])
        == 0
    )
    assert (
        main(
            [
                "export",
                str(stories_parent),
                "--format",
                "gptq_v2",
                "--bits-config",
                str(old),
                "--out",
                str(tmp_path / "g"),
            ]
        )
        == 0
    )
    name = names[0]
    exported, reference = matgptq.load(tmp_path / "g"), matgptq.load(stories_parent, bits=body["bits"])
    assert (exported.get_submodule(name).weight.data.float() == reference.get_submodule(name).weight.data.float()).all()
    assert series(body)[1] == [body["bits"][n] for n in names]
    row = finished_row(old, body["settings"], body["summary"]["generations"])
    assert row == {k: v for k, v in body["summary"].items() if k != "report_guess_seconds"}


def test_help_lists_the_users_options_first_and_groups_the_rest(capsys):
    with pytest.raises(SystemExit):
        main(["search", "--help"])
    text = capsys.readouterr().out
    head, _, rest = text.partition("\noptions:\n")[2].partition("\ncalibration and held-out text:\n")
    first = {
        o for line in head.splitlines() if line.startswith("  -") for o in re.findall(r"--[a-z-]+", line.split("  ")[1])
    }
    assert first == {
        "--help",
        "--budget",
        "--calib",
        "--out",
        "--time-limit",
        "--levels",
        "--budget-kind",
        "--tie",
        "--no-tie",
        "--text",
        "--plot",
        "--resume",
        "--overwrite",
        "--quiet",
        "--device",
    }
    for group in ("start: the one-shot tables and baselines:", "refinement and evolution:"):
        assert f"\n{group}\n" in rest
    for option in ("--baselines", "--seed", "--generations", "--sensitivity-wide", "--calib-range", "--kl-to"):
        assert option in rest


def test_the_pool_teacher_built_in_parts_holds_the_same_hidden_states(tmp_path):
    """Under a time limit the pool's teacher is built a part at a time (pool.JoinedTeacher); oracle: the teacher
    built whole on the same windows. Batches aligned with the whole one's, so the same arithmetic: equal bit for
    bit, for any span of windows."""
    import torch

    from matgptq.allocation.pool import JoinedTeacher
    from matgptq.evaluation.teacher import Teacher
    from matgptq.models import calibration_windows, load_tokenizer, read_text, tokenize

    windows = calibration_windows(tokenize(load_tokenizer(STORIES), read_text(TINYSTORIES, (0.6, 0.7))), 10, 32, 0)
    model = matgptq.load(STORIES)
    whole = Teacher(model, windows, batch_size=2)
    joined = JoinedTeacher([Teacher(model, windows[a:b], batch_size=2) for a, b in ((0, 2), (2, 6), (6, 10))])
    assert joined.windows_shape == whole.windows_shape
    for a, b in ((0, 10), (1, 3), (5, 7), (9, 10)):
        assert torch.equal(joined.hidden(a, b), whole.hidden(a, b)), (a, b)
    h = whole.hidden(0, 1)
    assert torch.equal(joined.logprobs(h), whole.logprobs(h))
    joined.close()
    whole.close()
