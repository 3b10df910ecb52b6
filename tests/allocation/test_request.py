"""A search request's defaults: the measured additive table on one window, or the probe table on nine."""

from pathlib import Path

import pytest

from matgptq.allocation import SearchRequest
from matgptq.allocation.sensitivity import Sensitivity


def request(**options) -> SearchRequest:
    return SearchRequest.of(Path("p"), ("3.0",), Path("c.txt"), Path("o"), **options)


def test_the_default_table_is_full_on_one_window_and_probe_keeps_its_nine():
    assert request().start.sensitivity is Sensitivity.FULL and request().start.tokens == 255  # one 256-token window
    assert request(sensitivity=Sensitivity.PROBE).start.tokens == 2048  # ceil(2048 / 255) = 9 windows
    assert request(sensitivity=Sensitivity.PROBE, sensitivity_tokens=126).start.tokens == 126
    assert request().start.baselines == ()  # no baseline unless asked for


def test_the_flat_options_of_the_api_land_in_their_groups():
    """SearchRequest.of sorts the Python API's flat names into the groups, as the command fills them."""
    from matgptq.allocation.allocators import Allocator
    from matgptq.allocation.request import HeldOut, PoolConfig, StartConfig, TimeLimit

    clock = lambda: 0.0  # noqa: E731
    req = request(
        calib_range=(0.1, 0.2),
        seqlen=64,
        calib_tokens=100,
        batch_size=2,
        sensitivity_top=4,
        sensitivity_wide=(3, 9),
        baselines=(Allocator.ERROR,),
        text="t.txt",
        text_range=(0.0, 0.5),
        text_tokens=7,
        time_limit=2.0,
        time_spent=3.0,
        clock=clock,
        tie=True,
    )
    assert req.pool == PoolConfig((0.1, 0.2), 64, 100, 2) and req.tie
    assert req.start == StartConfig(Sensitivity.FULL, 255, 4, (3, 9), (Allocator.ERROR,))
    assert req.held_out == HeldOut(Path("t.txt"), (0.0, 0.5), 7) and req.time_limit == TimeLimit(2.0, 3.0, clock)
    assert request().held_out is None and request().time_limit is None
    with pytest.raises(TypeError):
        request(sensitivty=Sensitivity.PROBE)


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
