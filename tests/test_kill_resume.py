"""Killed anywhere, resumed exactly (#99 item 1), a sample: `matgptq quantize` (GPTQ and a MatGPTQ parent), `search`,
`export` and `slice` SIGKILLed at three seeded instants spread over an uninterrupted run's wall time (one in each
third), then run again in this process (--resume where the command takes it; one torch thread here and in the
children) to the uninterrupted run's output: tensors byte for byte, JSON equal but for durations.
benchmarks/robustness/faults_kill.py is the full count (`--kills 100`); the two share no code (tests import no benchmark)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from matgptq.cli import main
from tests.conftest import STORIES, TINYSTORIES

ENV = {
    **os.environ,
    "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"),
    "OMP_NUM_THREADS": "1",
    "TORCHDYNAMO_DISABLE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONDONTWRITEBYTECODE": "1",  # a .pyc is written with write and rename: the step kills below count those
}
TIMEOUT = 600
# the JSON fields that record durations ("*": any key or index), and the one a resumed search sets (it read the
# tables back): the only differences allowed
ALLOWED = (
    ("report", "*", "seconds"),
    ("history", "*", "seconds"),
    ("state", "seconds"),
    ("state", "history", "*", "seconds"),
    ("state", "refine", "seconds"),
    ("tables", "*", "seconds"),
    *(
        ("summary", k)
        for k in (
            "seconds",
            "teacher_seconds",
            "tables_seconds",
            "search_seconds",
            "report_seconds",
            "refine_seconds",
            "tables_reused",
        )
    ),
)
QUANTIZE = ["--calib", str(TINYSTORIES), "--calib-range", "0.6:1", "--nsamples", "16", "--seqlen", "64", "--quiet"]
COMMANDS = {  # name: (arguments, the output's name, resumable); PARENT: the MatGPTQ run's output
    "quantize-gptq": (["quantize", str(STORIES), *QUANTIZE], "out", True),
    "quantize-matgptq": (["quantize", str(STORIES), "--method", "matgptq", "--bits", "2,3,4", *QUANTIZE], "out", True),
    "search": (
        [
            "search",
            "PARENT",
            "--budget",
            "2.5,3.5",
            "--calib",
            str(TINYSTORIES),
            "--calib-range",
            "0.6:0.7",
            "--generations",
            "3",
            "--offspring",
            "4",
            "--stages",
            "126:2,504:1",
            "--seqlen",
            "64",
            "--sensitivity-tokens",
            "126",
            "--calib-tokens",
            "1008",
            "--quiet",
        ],
        "out",
        True,
    ),
    "export": (["export", "PARENT", "--format", "gguf", "--bits", "3"], "out.gguf", False),
    "slice": (["slice", "PARENT", "--bits", "3"], "out", False),
}


def _args(name: str, out: Path, parent: Path) -> list[str]:
    return [*(str(parent) if a == "PARENT" else a for a in COMMANDS[name][0]), "--out", str(out)]


def _argv(name: str, out: Path, parent: Path) -> list[str]:
    return [sys.executable, "-m", "matgptq", *_args(name, out, parent)]


def _run(argv: list[str], kill_at: float | None = None) -> int:
    """The exit status of `argv` (−9 where it was SIGKILLed, with its process group, after `kill_at` seconds)."""
    proc = subprocess.Popen(argv, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        return proc.wait(timeout=TIMEOUT if kill_at is None else kill_at)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=60)


def _diffs(a, b, path=()) -> list[tuple]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in set(a) | set(b) for d in _diffs(a.get(k, ...), b.get(k, ...), (*path, k))]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diffs(x, y, (*path, i))]
    allowed = any(len(p) == len(path) and all(x in ("*", y) for x, y in zip(p, path)) for p in ALLOWED)
    return [] if a == b or allowed else [path]


def _assert_same(a: Path, b: Path) -> None:
    """Output file or directory `a` is reference `b` (temporary names aside)."""
    if b.is_file():
        assert a.read_bytes() == b.read_bytes(), a
        return
    names = lambda d: sorted(p.name for p in d.iterdir() if ".tmp" not in p.name)  # noqa: E731
    assert names(a) == names(b)
    for name in names(b):
        if name.endswith(".safetensors"):
            ta, tb = load_file(str(a / name)), load_file(str(b / name))
            raw = lambda t: t.contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
            assert sorted(ta) == sorted(tb)
            assert all(ta[k].dtype == tb[k].dtype and raw(ta[k]).equal(raw(tb[k])) for k in ta), name
        elif name.endswith(".json"):
            assert _diffs(json.loads((a / name).read_text()), json.loads((b / name).read_text())) == [], name
        else:
            assert (a / name).read_bytes() == (b / name).read_bytes(), name


def _same(a: Path, b: Path) -> bool:
    try:
        _assert_same(a, b)
    except AssertionError:
        return False
    return True


@pytest.fixture
def one_thread():
    """This process on one thread, as the children (float summation order is part of bit-exactness)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict[str, tuple[Path, float]]:
    """Every command's uninterrupted output and wall time."""
    work = tmp_path_factory.mktemp("kill-references")
    refs = {}
    for name, (_, out_name, _) in COMMANDS.items():
        (work / name).mkdir()
        t0 = time.monotonic()
        assert _run(_argv(name, work / name / out_name, work / "quantize-matgptq" / "out")) == 0, name
        refs[name] = (work / name / out_name, time.monotonic() - t0)
    yield refs
    shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_killed_anywhere_resumes_to_the_uninterrupted_output(references, one_thread, tmp_path, name):
    ref, wall = references[name]
    parent = references["quantize-matgptq"][0]
    resumable, whole = COMMANDS[name][2], name != "search"
    draws, killed = np.random.default_rng(sorted(COMMANDS).index(name)).uniform(size=3), 0
    for k, u in enumerate(draws):
        out = tmp_path / str(k) / ref.name
        out.parent.mkdir()
        rc = _run(_argv(name, out, parent), kill_at=(k + u) / 3 * wall)
        if rc != -signal.SIGKILL:  # it ended before the instant (a faster run than the reference)
            assert rc == 0, f"{name} failed"
            shutil.rmtree(out.parent)
            continue
        killed += 1
        if whole and out.exists():  # an output appears whole or not at all
            _assert_same(out, ref)
        for mix in out.glob("mix-*.json") if not whole else ():  # search: each mix file whole
            assert _diffs(json.loads(mix.read_text()), json.loads((ref / mix.name).read_text())) == []
        if resumable:
            assert any(main(_args(name, out, parent) + ["--resume"]) == 0 for _ in range(3)), f"{name} at {k}"
        elif not out.exists():
            assert main(_args(name, out, parent)) == 0
        _assert_same(out, ref)
        shutil.rmtree(out.parent)
    assert killed, "every run ended before its instant"


def test_resume_of_a_finished_run_says_so(references, tmp_path, capsys):
    """`quantize --resume` where the checkpoint was written: "already complete", exit 0, nothing written; a resume
    state a kill left between the checkpoint's rename and its own removal is removed. Made with other options: it
    exists, exit 2 as before. `search --resume` of finished budgets keeps them."""
    out = tmp_path / "done"
    shutil.copytree(references["quantize-gptq"][0], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    args = ["quantize", str(STORIES), "--out", str(out), *QUANTIZE, "--resume"]
    (tmp_path / ".done.resume").mkdir()
    assert main(args) == 0 and "is already complete; nothing to do" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and not (tmp_path / ".done.resume").exists()
    assert main([*args, "--bits", "3"]) == 2 and "already exists" in capsys.readouterr().err
    searched = tmp_path / "searched"
    shutil.copytree(references["search"][0], searched)
    assert main(_args("search", searched, references["quantize-matgptq"][0]) + ["--resume"]) == 0
    assert "kept (finished by the run before)" in capsys.readouterr().out


# Kills inside writes and renames, where instants seldom land: strace delivers SIGKILL on entering the n-th call of a
# system call. For write, link and renameat2 only the calls naming the step's path are counted (`-P`), so n = 1 and no
# other write (a probe of the temporary directory, a semaphore) can shift it; strace's -P sees only rename's first path
# (a temporary name with a PID), so a rename's n is read from a trace of the same command uninterrupted: the main
# thread's renames are the commands' own (no .pyc is written: ENV). benchmarks/robustness/faults_kill.py --at steps
# kills at every kind of step; here the step that puts each output in place (and, for quantize, a resume-state
# write), the windows an atomic output exists to close.
_TRACED = re.compile(r"^(\d+)\s+(\w+)\((.*)$")


def _strace_works() -> bool:
    try:
        return subprocess.run(["strace", "-f", "-qq", "-o", os.devnull, "true"], timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _calls(trace: Path, work: Path) -> list[tuple[str, str]]:
    """(call, its text, `work` written WORK) of the main thread's traced calls, in order."""
    lines = [m for m in map(_TRACED.match, trace.read_text().splitlines()) if m]
    main_pid = min(int(m[1]) for m in lines)
    return [(m[2], m[3].replace(str(work), "WORK")) for m in lines if int(m[1]) == main_pid]


def _nth_rename(argv: list[str], trace: Path, work: Path, target: str) -> int:
    """Which of the main thread's renames, counted from 1, moves a file to WORK/target in a run of `argv`."""
    assert (
        subprocess.run(["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=rename", "--", *argv], env=ENV).returncode
        == 0
    )
    renames = [text for call, text in _calls(trace, work) if call == "rename"]
    return next(n for n, text in enumerate(renames, 1) if f', "WORK/{target}")' in text)


STEP_TARGETS = {  # command: the steps to kill at, as (call, the path it names, under the run's directory)
    "quantize-gptq": [("write", ".out.resume/.state.json.tmp"), ("rename", "out")],
    "search": [("rename", "out/mix-2.5.json")],
    "export": [("link", "out.gguf")],
    "slice-overwrite": [("renameat2", "out")],
}


@pytest.mark.skipif(not _strace_works(), reason="strace is not installed or may not trace here")
@pytest.mark.parametrize("name", list(STEP_TARGETS))
def test_killed_inside_a_write_or_rename_resumes_to_the_uninterrupted_output(references, one_thread, tmp_path, name):
    """Killed on entering the step aimed at (the killed run's trace ends in it), the output is absent, the old one
    (--overwrite) or the new one whole, and running again (--resume where it resumes) gives the uninterrupted output
    and leaves nothing beside it."""
    base = name.removesuffix("-overwrite")
    ref, parent = references[base][0], references["quantize-matgptq"][0]
    extra = ["--overwrite"] if name != base else []
    for k, (call, target) in enumerate(STEP_TARGETS[name]):
        work = tmp_path / str(k)
        work.mkdir()
        out = work / ref.name
        if call == "rename":
            (work / "traced").mkdir()
            uninterrupted = _argv(base, work / "traced" / ref.name, parent) + extra
            if extra:
                shutil.copytree(parent, work / "traced" / ref.name)
            only, nth = [], _nth_rename(uninterrupted, work / "traced" / "t", work / "traced", target)
            shutil.rmtree(work / "traced")
        else:
            only, nth = ["-P", str(work / target)], 1
        if extra:
            shutil.copytree(parent, out)
        kill = ["strace", "-f", "-qq", "-y", "-o", str(work / "t"), *only, "-e", f"trace={call}"]
        kill += ["-e", f"inject={call}:signal=KILL:when={nth}", "--"]
        assert _run(kill + _argv(base, out, parent) + extra) in (-signal.SIGKILL, 128 + signal.SIGKILL)
        last, text = _calls(work / "t", work)[-1]
        assert last == call and f"WORK/{target}" in text, (last, text)
        assert text.endswith(("= ?", "<unfinished ...>")), text  # entered, not returned
        if out.exists() and base != "search":  # in place: whole, the new output or (--overwrite) the old one
            assert _same(out, ref) or (extra and _same(out, parent)), "a partial output"
        if COMMANDS[base][2]:
            assert any(main(_args(base, out, parent) + ["--resume"]) == 0 for _ in range(3)), f"{name} at {call}"
        elif extra or not out.exists():
            assert main(_args(base, out, parent) + extra) == 0
        _assert_same(out, ref)
        assert sorted(p.name for p in work.iterdir()) == sorted([ref.name, "t"]), "litter beside the output"
