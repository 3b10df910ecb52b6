"""File-system steps of a run, from strace: which to kill at, and where a killed run died (faults_kill.py --at
steps)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# Kills inside writes and renames: a write or a rename lasts milliseconds of a run of seconds, so instants drawn over
# the run seldom land in one. strace delivers SIGKILL on entering the N-th call of a system call instead (its
# injection counts calls per call and per thread: the main thread's, which does every write here), so each
# file-system step of the uninterrupted run can be hit in turn: the step is entered and not done.
STEP_CALLS = (
    "write",
    "pwrite64",
    "writev",
    "ftruncate",
    "fsync",
    "fdatasync",
    "rename",
    "renameat",
    "renameat2",
    "link",
    "linkat",
    "unlink",
    "unlinkat",
    "rmdir",
    "mkdir",
    "mkdirat",
)
_TRACED = re.compile(r"^(\d+)\s+(\w+)\((.*)$")


@dataclass(frozen=True)
class Step:
    call: str  # the system call
    nth: int  # which of the main thread's calls of it (strace's `when=`)
    kind: str  # the call and the paths it names under the trial directory, temporary names and numbers generalised


def strace(trace: Path, calls) -> list[str]:
    return ["strace", "-f", "-qq", "-y", "-o", str(trace), "-e", "trace=" + ",".join(calls), "-e", "signal=none"]


def _kind(call: str, args: str, work: Path) -> str | None:
    """`call` with the paths under `work` it names (strace -y writes a descriptor's path in <>), as a pattern: the
    random part of a temporary name, a pid, a host and every number generalised; None if it names none."""
    paths = [
        q[len(str(work)) + 1 :]
        for q in re.findall(r'["<](/[^">]*)[">]', args)
        if q.startswith(f"{work}/") and q[len(str(work)) + 1 :] not in ("run.log", "run.trace")
    ]  # the harness's
    general = [
        re.sub(r"\d+", "#", re.sub(r"\.(tmp|old)-[^/]*", r".\1-*", re.sub(r"/\.tmp\w{6,}", "/.tmp*", "/" + q)))[1:]
        for q in paths
    ]
    return f"{call} {' '.join(general)}" if general else None


def _main_calls(trace: Path) -> list[re.Match]:
    """The main thread's calls in an strace log (its lowest thread id; a resumed call's second line is not a call)."""
    lines = [m for m in map(_TRACED.match, trace.read_text().splitlines()) if m]
    main = min((int(m[1]) for m in lines), default=None)
    return [m for m in lines if int(m[1]) == main]


def file_steps(trace: Path, work: Path) -> list[Step]:
    """The main thread's file-system steps under `work`, in order, from an strace log of STEP_CALLS."""
    counts: dict[str, int] = {}
    steps = []
    for m in _main_calls(trace):
        counts[m[2]] = counts.get(m[2], 0) + 1
        if kind := _kind(m[2], m[3], work):
            steps.append(Step(m[2], counts[m[2]], kind))
    return steps


def landed_step(trace: Path, step: Step, work: Path) -> str | None:
    """The kind of the step a run killed by injection at `step` was in: its main thread's last call, unfinished."""
    last = [m for m in _main_calls(trace) if m[2] == step.call]
    entered = len(last) == step.nth and last[-1][3].endswith(("= ?", "<unfinished ...>"))  # and not returned
    return _kind(last[-1][2], last[-1][3], work) if entered else None


def chosen(steps: list[Step], most: int) -> list[Step]:
    """The first, the middle and the last step of each kind, in run order; at most `most` of them (0: all), evenly
    spread."""
    kinds: dict[str, list[Step]] = {}
    for s in steps:
        kinds.setdefault(s.kind, []).append(s)
    picked = sorted({k[i] for k in kinds.values() for i in (0, len(k) // 2, -1)}, key=steps.index)
    if most and len(picked) > most:
        picked = [picked[round(i * (len(picked) - 1) / (most - 1))] for i in range(most)] if most > 1 else picked[:1]
    return picked
