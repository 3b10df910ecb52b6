"""A search request's defaults: the measured additive table on one window, or the probe table on nine."""

from pathlib import Path

from matgptq.allocation import SearchRequest
from matgptq.allocation.sensitivity import Sensitivity


def request(**options) -> SearchRequest:
    return SearchRequest(parent=Path("p"), budgets=("3.0",), calib=Path("c.txt"), out=Path("o"), **options)


def test_the_default_table_is_full_on_one_window_and_probe_keeps_its_nine():
    assert request().sensitivity is Sensitivity.FULL and request().sensitivity_tokens == 255  # one 256-token window
    assert request(sensitivity=Sensitivity.PROBE).sensitivity_tokens == 2048  # ceil(2048 / 255) = 9 windows
    assert request(sensitivity=Sensitivity.PROBE, sensitivity_tokens=126).sensitivity_tokens == 126


def test_auto_scores_the_tables_in_float32_without_a_time_limit(stories_parent, tmp_path, monkeypatch):
    """Where bfloat16 is native, `--score-dtype auto` scores the candidates in bfloat16, and the one-shot tables in
    float32 unless the run has a time limit (request.ScoreDtype.tables). Oracle: the tables of the same search with
    the precision forced, `--score-dtype float32` and `bfloat16`; the same arithmetic on the same windows, so equal
    bit for bit (JSON keeps a float's repr exactly). The bfloat16 table differing shows the check can fail."""
    import json

    from matgptq.allocation import request as module
    from matgptq.cli import main
    from tests.allocation.test_cli import search

    monkeypatch.setattr(module, "native_bfloat16", lambda device: True)  # auto picks bfloat16 on any CPU
    args = ("--budget", "3.0", "--generations", "0", "--baselines", "noise", "--no-tie")

    def run(name, *extra):
        assert main(search(stories_parent, tmp_path / name, *args, *extra)) == 0
        tables = json.loads((tmp_path / name / ".tables.json").read_text())["tables"]
        return {k: v["table"] for k, v in tables.items()}, json.loads((tmp_path / name / "mix-3.0.json").read_text())

    auto, auto_mix = run("auto")
    limited, limited_mix = run("limited", "--time-limit", "30")
    exact, _ = run("float32", "--score-dtype", "float32")
    low, _ = run("bfloat16", "--score-dtype", "bfloat16")
    assert auto == exact and limited == low and exact["additive"] != low["additive"]
    assert auto_mix["settings"]["score_dtype"] == "bfloat16" and auto_mix["settings"]["table_dtype"] == "float32"
    assert "table_dtype" not in limited_mix["settings"]  # the precision of the candidates, as before
