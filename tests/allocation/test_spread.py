"""`torchrun --nproc-per-node 2 -m matgptq search` on CPU (gloo): the same mixes as one process.

Why exactly equal, not within a tolerance: both processes draw the same children and windows from the same seed,
each candidate is scored by the same single-threaded arithmetic as in the reference run (OMP_NUM_THREADS=1 there,
torch.set_num_threads(1) here), and the all-reduce that shares the scores adds exact zeros (search/spread.py). So
every score, hence every selection, the history and the final mix are bit-identical.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from matgptq.cli import main
from tests.allocation.test_cli import search

ARGS = ["--budget", "3.0,2.5", "--generations", "4", "--offspring", "5", "--stages", "126:3,504:1"]


def torchrun_search(*args: str, nproc: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "-m",
        "matgptq",
        *args,
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def mix(out: Path, budget: str) -> dict:
    body = json.loads((out / f"mix-{budget}.json").read_text())
    for timing in (
        "seconds",
        "teacher_seconds",
        "tables_seconds",
        "search_seconds",
        "refine_seconds",
        "report_seconds",
    ):
        body["summary"].pop(timing)
    for h in body["history"]:
        h.pop("seconds")
    return body


def test_two_gloo_processes_find_the_single_process_mixes(stories_parent, tmp_path):
    torch.set_num_threads(1)  # the same threads as each torchrun process
    assert main(search(stories_parent, tmp_path / "one", *ARGS)) == 0
    run = torchrun_search(*search(stories_parent, tmp_path / "two", *ARGS))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("wrote ") == 1  # rank 0 reports and writes, the other rank only scores
    for budget in ("3.0", "2.5"):
        one, two = mix(tmp_path / "one", budget), mix(tmp_path / "two", budget)
        assert one["history"] == two["history"]  # every generation's KL, evaluation and token counts, parent
        assert one == two


def test_a_single_process_search_resumes_under_torchrun(stories_parent, tmp_path):
    """Rank 0 reads the state and hands it to the other rank: 2 generations in one process, then 2 more in two."""
    torch.set_num_threads(1)
    whole = [*ARGS[:2], "--generations", "4", *ARGS[4:]]
    assert main(search(stories_parent, tmp_path / "whole", *whole)) == 0
    half = [*ARGS[:2], "--generations", "2", *ARGS[4:]]
    assert main(search(stories_parent, tmp_path / "split", *half)) == 0
    run = torchrun_search(*search(stories_parent, tmp_path / "split", *whole, "--resume"))
    assert run.returncode == 0, run.stderr[-3000:]
    for budget in ("3.0", "2.5"):
        a, b = mix(tmp_path / "whole", budget), mix(tmp_path / "split", budget)
        assert a["bits"] == b["bits"] and a["history"] == b["history"]
