"""The search's saved tables: read back exactly, refused (None: scored afresh) when made otherwise or damaged, and what
`--resume` uses instead of scoring them again."""

import json

import pytest

from matgptq.allocation import runner
from matgptq.allocation.allocators import Allocator, Filled
from matgptq.allocation.saved_tables import read_tables, tables_path, tables_settings, write_tables
from matgptq.cli import main
from tests.allocation.test_cli import search

SETTINGS = tables_settings({"parent": "/p", "levels": [2, 4, 8], "budget": "3.0", "seed": 0},
                           (Allocator.ADDITIVE, Allocator.GRADIENT), (2,))  # fmt: skip
# values JSON must carry exactly: a float64 that is no short decimal, the extremes, a gradient table's None
FILLED = {Allocator.ADDITIVE: Filled([[0.1 + 0.2, 1e-300, 5.0], [2.0**-40, float("inf"), 5.0]], 12.5, (2, 4)),
          Allocator.GRADIENT: Filled({2: [[None, 1 / 3, 7.0], [None, -0.0, 7.0]]}, 3.25)}  # fmt: skip


def test_tables_read_back_exactly(tmp_path):
    write_tables(tmp_path / ".tables.json", SETTINGS, FILLED)
    assert read_tables(tmp_path / ".tables.json", SETTINGS, layers=2) == FILLED


def test_the_budget_is_not_a_setting_of_the_tables():
    other = tables_settings({"parent": "/p", "levels": [2, 4, 8], "budget": "3.5", "seed": 0},
                            (Allocator.GRADIENT, Allocator.ADDITIVE), (2,))  # fmt: skip
    assert other == SETTINGS


@pytest.mark.parametrize("change", ["seed", "floors", "allocators", "layers"])
def test_tables_made_otherwise_are_not_used(tmp_path, change):
    path = tmp_path / ".tables.json"
    write_tables(path, SETTINGS, FILLED)
    settings = {**SETTINGS, **{"seed": {"seed": 1}, "floors": {"floors": [2, 4]},
                               "allocators": {"allocators": ["additive"]}, "layers": {}}[change]}  # fmt: skip
    assert read_tables(path, settings, layers=3 if change == "layers" else 2) is None


@pytest.mark.parametrize("damage", ["not json", "[]", '{"format": "matgptq-search-tables", "version": 1}', "cut"])
def test_a_damaged_tables_file_is_scored_afresh(tmp_path, damage):
    path = tmp_path / ".tables.json"
    write_tables(path, SETTINGS, FILLED)
    text = path.read_text()
    path.write_text(text[: len(text) // 2] if damage == "cut" else damage)
    assert read_tables(path, SETTINGS, layers=2) is None
    assert read_tables(tmp_path / "absent.json", SETTINGS, layers=2) is None


def test_resume_reads_the_tables_back_instead_of_scoring_them(stories_parent, tmp_path, monkeypatch):
    """A search extended with --resume (2 → 3 generations) scores no table and writes the mix a fresh 3-generation run
    writes; adding a budget with another floor width scores them again."""
    args = ["--budget", "3.0", "--baselines", "uniform,error,gradient,noise"]
    assert main(search(stories_parent, tmp_path / "whole", *args, "--generations", "3")) == 0
    out = tmp_path / "resumed"
    assert main(search(stories_parent, out, *args)) == 0  # QUICK's 2 generations
    assert tables_path(out).is_file()
    calls = []
    real = runner.tables
    monkeypatch.setattr(runner, "tables", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert main(search(stories_parent, out, *args, "--generations", "3", "--resume")) == 0
    mix = lambda d, b="3.0": json.loads((d / f"mix-{b}.json").read_text())  # noqa: E731
    assert calls == [] and mix(out)["summary"]["tables_reused"] is True
    assert mix(out)["bits"] == mix(tmp_path / "whole")["bits"]
    assert mix(tmp_path / "whole")["summary"]["tables_reused"] is False
    more = ["--budget", "3.0,6.0", *args[2:], "--generations", "3", "--resume"]  # 6.0's floor is 4, 3.0's 2
    assert main(search(stories_parent, out, *more)) == 0
    assert len(calls) == 1 and mix(out, "6.0")["summary"]["tables_reused"] is False
