"""What `search --resume` keeps from the run before: the budgets it finished (not searched again) and the one-shot
tables (read back exactly, only the ones it lacks scored; made otherwise or damaged: scored afresh)."""

import json
from pathlib import Path

import pytest

from matgptq.allocation import allocators, runner
from matgptq.allocation.allocators import Allocator, Filled, lacking
from matgptq.allocation.evopress import EvoConfig
from matgptq.allocation.resume import SEARCH_ONLY, finished_row, read_tables, tables_path, tables_settings, write_tables
from matgptq.cli import main
from tests.allocation.test_cli import search

SETTINGS = tables_settings(
    {"parent": "/p", "levels": [2, 4, 8], "budget": "3.0", "seed": 0, "baselines": ["uniform", "gradient"]}
)
# values JSON must carry exactly: a float64 that is no short decimal, the extremes, a gradient table's None
FILLED = {
    Allocator.ADDITIVE: Filled([[0.1 + 0.2, 1e-300, 5.0], [2.0**-40, float("inf"), 5.0]], 12.5, (2, 4)),
    Allocator.GRADIENT: Filled({2: [[None, 1 / 3, 7.0], [None, -0.0, 7.0]]}, 3.25),
}


def test_tables_read_back_exactly(tmp_path):
    write_tables(tmp_path / ".tables.json", SETTINGS, FILLED)
    assert read_tables(tmp_path / ".tables.json", SETTINGS, layers=2) == FILLED


def test_the_budget_and_the_baselines_are_not_settings_of_the_tables():
    """Each table is kept under its allocator's name (the gradient's per floor): another budget or baseline list
    reads the same file."""
    other = tables_settings({"parent": "/p", "levels": [2, 4, 8], "budget": "3.5", "seed": 0, "baselines": ["noise"]})
    assert other == SETTINGS


def test_the_evolutions_own_settings_are_not_settings_of_the_tables():
    """Generation sizes, mutations and the refinement change no table (the tables are scored before them, from the
    parent and the calibration windows): a resume with others reads the same file. Every evolution setting but the
    seed, which NOISE draws from, is among them."""
    evo = {
        "offspring": 4,
        "stages": [[252, 2], [504, 1]],
        "max_flips": 2,
        "temperature": 0.0,
        "refine_steps": 3,
        "refine_groups": 2,
    }
    assert (
        tables_settings(
            {
                "parent": "/p",
                "levels": [2, 4, 8],
                "budget": "3.0",
                "seed": 0,
                **evo,
                "baselines": ["uniform", "gradient"],
            }
        )
        == SETTINGS
    )
    assert set(EvoConfig().settings()) - {"seed"} <= set(SEARCH_ONLY)


@pytest.mark.parametrize("change", ["seed", "levels", "layers"])
def test_tables_made_otherwise_are_not_used(tmp_path, change):
    path = tmp_path / ".tables.json"
    write_tables(path, SETTINGS, FILLED)
    settings = {**SETTINGS, **{"seed": {"seed": 1}, "levels": {"levels": [3, 4, 8]}, "layers": {}}[change]}
    assert read_tables(path, settings, layers=3 if change == "layers" else 2) is None


def test_only_the_tables_the_run_before_lacks_are_scored():
    """`lacking`: an allocator with no table, a GRADIENT floor its table lacks; UNIFORM has no table."""
    have = {Allocator.ADDITIVE: FILLED[Allocator.ADDITIVE], Allocator.GRADIENT: FILLED[Allocator.GRADIENT]}
    assert lacking((Allocator.ADDITIVE, Allocator.UNIFORM, Allocator.GRADIENT), (2,), have) == ((), ())
    assert lacking((Allocator.ADDITIVE, Allocator.GRADIENT), (2, 4), have) == ((Allocator.GRADIENT,), (4,))
    assert lacking((Allocator.ADDITIVE, Allocator.NOISE), (2, 4), have) == ((Allocator.NOISE,), (4,))
    assert lacking((Allocator.ADDITIVE, Allocator.ERROR), (), {}) == ((Allocator.ADDITIVE, Allocator.ERROR), ())


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
    writes; searched again with other generation sizes (its state deleted, as the refusal advises), none either. A
    budget added with another floor width and another baseline scores only what the run before lacks: the gradient
    table of that floor and the new baseline's; its one-shot mixes are those of a fresh run."""
    args = ["--budget", "3.0", "--baselines", "uniform,error,gradient", "--no-tie"]  # untied: noise joins below
    assert main(search(stories_parent, tmp_path / "whole", *args, "--generations", "3")) == 0
    out = tmp_path / "resumed"
    assert main(search(stories_parent, out, *args)) == 0  # QUICK's 2 generations
    assert tables_path(out).is_file()
    scored = []
    for name in ("measure_table", "noise_table", "error_table", "first_order_table"):  # what `tables` scores with
        monkeypatch.setattr(allocators, name, _counted(scored, name, getattr(allocators, name)))
    assert main(search(stories_parent, out, *args, "--generations", "3", "--resume")) == 0
    mix = lambda d, b="3.0": json.loads((d / f"mix-{b}.json").read_text())  # noqa: E731
    assert scored == [] and mix(out)["summary"]["tables_reused"] is True
    assert mix(out)["bits"] == mix(tmp_path / "whole")["bits"]
    assert mix(tmp_path / "whole")["summary"]["tables_reused"] is False
    (out / ".state-3.0.json").unlink()  # as the refusal of a state made with other settings advises
    assert main(search(stories_parent, out, *args, "--offspring", "6", "--resume")) == 0  # other generation sizes
    assert scored == [] and mix(out)["summary"]["tables_reused"] is True
    more = ["--budget", "6.0", "--baselines", "uniform,error,gradient,noise", "--no-tie"]  # 6.0's floor is 4, 3.0's 2
    assert main(search(stories_parent, out, *more, "--resume")) == 0
    assert sorted(scored) == ["first_order_table 4", "noise_table"]
    assert mix(out, "6.0")["summary"]["tables_reused"] is False
    monkeypatch.undo()
    assert main(search(stories_parent, tmp_path / "fresh", *more)) == 0
    assert mix(out, "6.0")["baseline_bits"] == mix(tmp_path / "fresh", "6.0")["baseline_bits"]


def _counted(calls: list, name: str, real):
    """`real`, appending its name (and the floor width, for the gradient's) to `calls` at each call."""

    def call(*a, **k):
        calls.append(f"{name} {a[3]}" if name == "first_order_table" else name)
        return real(*a, **k)

    return call


def test_a_finished_budget_is_kept_only_with_the_same_settings_and_generations(tmp_path):
    path = tmp_path / "mix-3.0.json"
    settings = {"budget": "3.0", "seed": 0}
    path.write_text(json.dumps({"summary": {"budget": "3.0", "generations": 4}, "settings": settings}))
    assert finished_row(path, settings, 4) == {"budget": "3.0", "generations": 4}
    assert finished_row(path, settings, 3) is not None  # asked for fewer: the state would not move either
    assert finished_row(path, settings, 5) is None  # extended: searched on from its state
    assert finished_row(path, {**settings, "seed": 1}, 4) is None
    assert finished_row(tmp_path / "absent.json", settings, 4) is None
    for damaged in ("{", "[]", '{"summary": 3, "settings": {}}', '{"settings": {"budget": "3.0", "seed": 0}}'):
        path.write_text(damaged)
        assert finished_row(path, settings, 4) is None, damaged


def test_resume_keeps_finished_budgets_and_searches_the_rest(stories_parent, tmp_path, monkeypatch, capsys):
    """A budget added on --resume is searched; the finished one is neither searched nor rewritten; when every budget
    is finished, nothing is loaded at all."""
    out = tmp_path / "mixes"
    assert main(search(stories_parent, out, "--budget", "3.0")) == 0
    before = (out / "mix-3.0.json").read_bytes(), (out / "mix-3.0.json").stat().st_mtime_ns
    capsys.readouterr()
    assert main(search(stories_parent, out, "--budget", "3.0,2.5", "--resume")) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out / 'mix-2.5.json'}" in printed
    assert f"kept (finished by the run before) {out / 'mix-3.0.json'}" in printed
    assert ((out / "mix-3.0.json").read_bytes(), (out / "mix-3.0.json").stat().st_mtime_ns) == before
    assert (out / "mix-2.5.json").is_file()
    monkeypatch.setattr(runner, "load", lambda *a, **k: pytest.fail("a finished search loaded a model"))
    assert main(search(stories_parent, out, "--budget", "2.5,3.0", "--resume")) == 0
    assert "wrote" not in capsys.readouterr().out


def test_a_resume_with_another_teacher_is_refused(stories_parent, tmp_path, capsys):
    """--kl-to names the teacher every score is taken against: a state made against another model directory is not
    continued; the same one, under a symlink too, is (the default teacher, the parent's own model, is named by the
    parent's metadata)."""
    import shutil

    from tests.conftest import STORIES
    from tests.test_cli import run_error

    out = tmp_path / "mixes"
    assert main(search(stories_parent, out, "--budget", "3.0", "--generations", "1", "--kl-to", str(STORIES))) == 0
    other = shutil.copytree(STORIES, tmp_path / "other-teacher")
    assert "reference" in run_error(
        search(stories_parent, out, "--budget", "3.0", "--resume", "--kl-to", str(other)), capsys
    )
    link = tmp_path / "link"
    link.symlink_to(Path(STORIES).resolve(), target_is_directory=True)
    assert (
        main(search(stories_parent, out, "--budget", "3.0", "--generations", "2", "--resume", "--kl-to", str(link)))
        == 0
    )
