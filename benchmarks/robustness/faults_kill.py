"""Killed anywhere, resumed exactly (#99 item 1): `matgptq quantize` (GPTQ, and a MatGPTQ parent), `search`, `export`
and `slice` killed with SIGKILL at random instants, then run again, against an uninterrupted run.

    python -m benchmarks.robustness.faults_kill --kills 100   # writes docs/results/faults_kill.json and prints a summary

Protocol. Every command runs once uninterrupted: its output is the reference, its wall time T (process start to exit,
imports included). Then, per command, until `--kills` runs were killed: a fresh output path, the command started in
its own process group and SIGKILLed at an instant drawn uniformly from [0, T] (numpy PCG64, `--seed`): wherever it
is then (importing, computing, inside a write or a rename, exiting). A run that ended before its instant is counted
(`ended_before_kill`) and drawn again. Right after the kill the output must be absent or whole: each final file
present equals the reference's (a checkpoint directory all of it or none). Then quantize and search are run again
with --resume until one exits 0 (at most RESUMES runs, none killed); export and slice, which have no --resume, are
run again as they were where the kill left no output. The final output is compared with the reference: every
safetensors tensor byte for byte (dtype, shape, bytes), every JSON equal but for the TIMING fields (and, counted
apart, the RESUME_RECORDS: what a resumed run says it reused), every other file byte for byte. Litter: whatever
is left beside the output (fsutil.atomic_output's hidden `.NAME.tmp-*`, a `.OUT.resume` or `.OUT.blocks-*`) or
inside it under a temporary name, right after the kill and after the final run. The children run one at a time,
one torch thread each (child_env), on stories260K and TinyStories from ../shared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks._harness import RESULTS, ROOT, child_env, machine, write_atomic
from benchmarks.robustness._outputs import RESUME_RECORDS, TIMING, compare, compare_file
from benchmarks.robustness._steps import STEP_CALLS, Step, chosen, file_steps, landed_step, strace

SHARED = ROOT.parent / "shared"
MODEL = SHARED / "models" / "stories260K"
TEXT = SHARED / "data" / "tinystories" / "tinystories_val_head.txt"
OUT = RESULTS / "faults_kill.json"
TIMEOUT = 600  # seconds any one child may take
RESUMES = 3  # runs with --resume after a kill before a trial counts as failed

QUANTIZE = ["--calib", TEXT, "--calib-range", "0.6:1", "--nsamples", "32", "--seqlen", "64", "--quiet"]
SEARCH = [
    "--budget",
    "2.5,3.5",
    "--calib",
    TEXT,
    "--calib-range",
    "0.6:0.7",
    "--generations",
    "4",
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
]


@dataclass(frozen=True)
class Command:
    name: str
    args: list  # `matgptq` arguments; None stands for the output path, "PARENT" for the MatGPTQ reference
    resumable: bool  # takes --resume
    whole: bool  # the output appears all at once (else file by file: search's mix files)
    suffix: str = ""  # of the output path
    prefilled: bool = False  # the output exists before the run (a copy of the parent): an --overwrite

    def argv(self, out: Path, parent: Path) -> list[str]:
        subst = {None: out, "PARENT": parent}
        return [sys.executable, "-m", "matgptq", *(str(subst.get(a, a)) for a in self.args)]


COMMANDS = (
    Command("quantize-gptq", ["quantize", MODEL, "--out", None, *QUANTIZE], True, True),
    Command(
        "quantize-matgptq",
        ["quantize", MODEL, "--out", None, "--method", "matgptq", "--bits", "2,3,4", *QUANTIZE],
        True,
        True,
    ),
    Command("search", ["search", "PARENT", "--out", None, *SEARCH], True, False),
    Command(
        "export-gguf", ["export", "PARENT", "--format", "gguf", "--bits", "3", "--out", None], False, True, ".gguf"
    ),
    Command("slice", ["slice", "PARENT", "--bits", "3", "--out", None], False, True),
)
# with --overwrite: the old output is moved aside and the new one renamed into place, two renames a kill can split
OVERWRITE = Command(
    "slice-overwrite", ["slice", "PARENT", "--bits", "3", "--out", None, "--overwrite"], False, True, prefilled=True
)


def run_child(argv: list[str], log: Path, kill: float | Step | None = None) -> tuple[int, float]:
    """(exit status, wall seconds) of `argv`, output to `log`; SIGKILLed when `kill` is given: after that many
    seconds (its process group), or on entering that file-system step (strace's syscall injection; the run's trace
    of the step's call is then `log` with the suffix .trace); status then −9, or its own where it ended first."""
    t0 = time.monotonic()
    if isinstance(kill, Step):
        argv = strace(log.with_suffix(".trace"), (kill.call,)) + [
            "-e",
            f"inject={kill.call}:signal=KILL:when={kill.nth}",
            "--",
            *argv,
        ]
    with open(log, "ab") as f:
        proc = subprocess.Popen(
            argv,
            env=child_env(1, PYTHONDONTWRITEBYTECODE="1"),
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=kill if isinstance(kill, float) else TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    rc = proc.returncode
    return (-signal.SIGKILL if rc == 128 + signal.SIGKILL and isinstance(kill, Step) else rc), time.monotonic() - t0


def litter(out: Path) -> list[str]:
    """What lies beside `out` (its trial directory holds nothing else) or inside it under a temporary name: after a
    kill, a quantization's `.OUT.resume` is its state, after a finished run litter too."""
    beside = [p.name for p in out.parent.iterdir() if p.name != out.name and p.suffix not in (".log", ".trace")]
    inside = [f"{out.name}/{p.name}" for p in out.iterdir() if ".tmp" in p.name] if out.is_dir() else []
    return sorted(beside + inside)


def after_kill(cmd: Command, out: Path, ref: Path) -> tuple[str, list[str]]:
    """Where the kill caught the run: `write` (a temporary file or directory is left: inside a write), `output` (the
    output, or some of search's mix files, in place), `state` (a resume state only), `none`; and how what it put in
    place differs from the reference."""
    if cmd.whole:
        placed = [out] if out.exists() else []
        diffs = compare(out, ref)[0] if placed else []
    else:
        placed = sorted(out.glob("[!.]*")) if out.is_dir() else []
        diffs = [
            d
            for p in placed
            for d in (compare_file(p, ref / p.name)[0] if (ref / p.name).is_file() else [f"{p.name}: extra"])
        ]
    left = [p.name for p in out.parent.rglob("*") if p.name not in ("run.log", "run.trace")]
    where = (
        "write"
        if any(".tmp" in n for n in left)
        else "output"
        if placed
        else "state"
        if any(n.startswith(".") for n in left)
        else "none"
    )
    return where, diffs


def trial(cmd: Command, work: Path, ref: Path, parent: Path, kill: float | Step) -> dict:
    """One kill and what follows it (the protocol in the module docstring); the trial's directory is removed."""
    work.mkdir(parents=True)
    out, log = work / f"out{cmd.suffix}", work / "run.log"
    if cmd.prefilled:  # the old output: the parent (a kill must leave it or the new output, whole)
        shutil.copytree(parent, out)
    rc, _ = run_child(cmd.argv(out, parent), log, kill)
    row = {"killed": rc == -signal.SIGKILL, "rc": rc}
    if isinstance(kill, Step):
        row["step"], row["landed_step"] = kill.kind, landed_step(log.with_suffix(".trace"), kill, work)
    if not row["killed"]:
        shutil.rmtree(work)
        return row
    row["landed"], row["partial"] = after_kill(cmd, out, ref)
    if cmd.prefilled and row["partial"] and out.is_dir() and not compare(out, parent)[0]:
        row["partial"], row["old_kept"] = [], True
    row["litter_after_kill"] = [n for n in litter(out) if not n.endswith(".resume")]
    runs = []
    if cmd.resumable:
        while not runs or (runs[-1] != 0 and len(runs) < RESUMES):
            runs.append(run_child(cmd.argv(out, parent) + ["--resume"], log)[0])
    elif not out.exists() or cmd.prefilled:  # what a user does: run it again where no output was left; --overwrite
        runs.append(run_child(cmd.argv(out, parent), log)[0])  # again anyway
    text = log.read_text(errors="replace")
    row.update(runs=runs, ok=not runs or runs[-1] == 0, already_complete=text.count("already complete; nothing to do"))
    if not row["ok"]:
        row["error"] = next((ln for ln in reversed(text.splitlines()) if "rror" in ln), text[-300:])
    row["diffs"], row["records"] = compare(out, ref)
    row["litter_left"] = litter(out)
    shutil.rmtree(work)
    return row


def references(work: Path) -> dict[str, tuple[Path, float]]:
    """Each command's uninterrupted output and wall time (the MatGPTQ quantization's output is the parent the others
    read)."""
    refs: dict[str, tuple[Path, float]] = {}
    for cmd in COMMANDS:
        out = work / "ref" / f"{cmd.name}{cmd.suffix}"
        out.parent.mkdir(parents=True, exist_ok=True)
        log = work / "ref" / f"{cmd.name}.log"
        rc, wall = run_child(cmd.argv(out, work / "ref" / "quantize-matgptq"), log)
        if rc != 0:
            raise SystemExit(f"{cmd.name} failed uninterrupted: {log.read_text()[-500:]}")
        refs[cmd.name] = (out, wall)
    return refs


def tally(cmd: Command, wall: float, rows: list[dict], instants: list[float]) -> dict:
    """One command's counts (the fields are named in `--help`'s docstring)."""
    killed = [r for r in rows if r["killed"]]
    exact = [r for r in killed if r["ok"] and not r["diffs"]]
    landed = {k: sum(r["landed"] == k for r in killed) for k in ("none", "state", "write", "output")}
    return {
        "command": " ".join(["python", *(_shown(a) for a in cmd.argv(Path(f"$OUT{cmd.suffix}"), Path("$PARENT"))[1:])]),
        "resumed_with": "--resume" if cmd.resumable else "the same command (where the kill left no output)",
        "uninterrupted_wall_s": round(wall, 2),
        "killed": len(killed),
        "ended_before_kill": len(rows) - len(killed),
        "ended_before_kill_failed": sum(not r["killed"] and r["rc"] != 0 for r in rows),
        "kill_instants_s": [round(t, 3) for t, r in zip(instants, rows) if r["killed"]],
        "landed": landed,
        "exact": len(exact),
        "exact_but_resume_record": sum(bool(r["records"]) for r in exact),
        "mismatches": sum(bool(r["diffs"]) for r in killed if r["ok"]),
        "failed": sum(not r["ok"] for r in killed),
        "partial_after_kill": sum(bool(r["partial"]) for r in killed),
        "reruns": sum(len(r["runs"]) for r in killed),
        "said_already_complete": sum(r["already_complete"] for r in killed),
        "litter_after_kill": sum(bool(r["litter_after_kill"]) for r in killed),
        "litter_left": sum(bool(r["litter_left"]) for r in killed),
        "examples": _examples(killed),
    }


def _shown(arg: str) -> str:
    """An argument as the record shows it: ../shared paths relative to the checkout."""
    return arg.replace(str(SHARED), "../shared")


def _examples(killed: list[dict]) -> dict:
    """The first few of each kind of finding, for the record."""
    pick = lambda key: [r[key] for r in killed if r.get(key)][:3]  # noqa: E731
    return {
        k: v
        for k, v in {
            "diffs": pick("diffs"),
            "resume_records": pick("records"),
            "partial": pick("partial"),
            "errors": pick("error"),
            "litter_after_kill": pick("litter_after_kill"),
            "litter_left": pick("litter_left"),
        }.items()
        if v
    }


def run(kills: int, seed: int, names: list[str]) -> dict:
    rng = np.random.Generator(np.random.PCG64(seed))
    t0 = time.monotonic()
    result = {
        "protocol": __doc__.split("Protocol. ", 1)[1].strip(),
        "kills_per_command": kills,
        "seed": seed,
        "timing_fields": [".".join(map(str, p)) for p in TIMING],
        "resume_records": [".".join(map(str, p)) for p in RESUME_RECORDS],
        "machine": machine(),
        "commands": {},
    }
    with tempfile.TemporaryDirectory(prefix="faults_kill-") as tmp:
        work = Path(tmp)
        refs = references(work)
        for cmd in (c for c in COMMANDS if c.name in names):
            ref, wall = refs[cmd.name]
            rows, instants = [], []
            while sum(r["killed"] for r in rows) < kills and len(rows) < 3 * kills:
                instants.append(float(rng.uniform(0, wall)))
                rows.append(
                    trial(
                        cmd, work / "trials" / f"{cmd.name}-{len(rows)}", ref, refs["quantize-matgptq"][0], instants[-1]
                    )
                )
            result["commands"][cmd.name] = tally(cmd, wall, rows, instants)
            print(_line(cmd.name, result["commands"][cmd.name]), flush=True)
    result["wall_s"] = round(time.monotonic() - t0, 1)
    return result


def traced_steps(cmd: Command, work: Path, parent: Path) -> list[Step]:
    """`cmd`'s file-system steps, from one uninterrupted run under strace in a directory laid out as a trial's."""
    work.mkdir(parents=True)
    log = work / "run.log"
    if cmd.prefilled:
        shutil.copytree(parent, work / f"out{cmd.suffix}")
    argv = strace(log.with_suffix(".trace"), STEP_CALLS) + ["--", *cmd.argv(work / f"out{cmd.suffix}", parent)]
    if run_child(argv, log)[0] != 0:
        raise SystemExit(f"{cmd.name} failed under strace: {log.read_text()[-500:]}")
    steps = file_steps(log.with_suffix(".trace"), work)
    shutil.rmtree(work)
    return steps


def run_steps(most: int, names: list[str]) -> dict:
    """Kills at file-system steps (STEP_CALLS) of each command, as `run` kills at instants."""
    t0 = time.monotonic()
    result = {
        "protocol": "as faults_kill.json's, but each kill is delivered by strace on entering one file-system "
        "step of the uninterrupted run (the first and the last of each kind of step)",
        "machine": machine(),
        "timing_fields": [".".join(map(str, p)) for p in TIMING],
        "commands": {},
    }
    with tempfile.TemporaryDirectory(prefix="faults_steps-") as tmp:
        work = Path(tmp)
        refs = references(work)
        for cmd in (c for c in (*COMMANDS, OVERWRITE) if c.name in names):
            ref, wall = refs[cmd.name.removesuffix("-overwrite")]
            steps = traced_steps(cmd, work / "traced" / cmd.name, refs["quantize-matgptq"][0])
            picks = chosen(steps, most)
            rows = [
                trial(cmd, work / "trials" / f"{cmd.name}-{i}", ref, refs["quantize-matgptq"][0], step)
                for i, step in enumerate(picks)
            ]
            c = tally(cmd, wall, rows, [0.0] * len(rows))
            del c["kill_instants_s"]
            c.update(
                old_kept=sum(bool(r.get("old_kept")) for r in rows),
                steps=len(steps),
                kinds=len({s.kind for s in steps}),
                chosen=len(picks),
                on_target=sum(r["landed_step"] == r["step"] for r in rows),
                kinds_hit=sorted({r["landed_step"] for r in rows if r["killed"] and r["landed_step"]}),
                off_target=[[r["step"], r["landed_step"]] for r in rows if r["landed_step"] != r["step"]][:5],
            )
            result["commands"][cmd.name] = c
            print(_line(cmd.name, c) + f"  steps {c['chosen']}/{c['steps']} on target {c['on_target']}", flush=True)
    result["wall_s"] = round(time.monotonic() - t0, 1)
    return result


def _line(name: str, c: dict) -> str:
    return (
        f"{name:17} killed {c['killed']:3}  exact {c['exact']:3} (resume record differs "
        f"{c['exact_but_resume_record']})  mismatches {c['mismatches']}  failed {c['failed']}  partial "
        f"{c['partial_after_kill']}  litter left {c['litter_left']}  already complete "
        f"{c['said_already_complete']}  landed {c['landed']}  T {c['uninterrupted_wall_s']} s"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=100, help="killed runs per command (--at steps: at most; 0 all)")
    p.add_argument(
        "--at",
        choices=("instants", "steps"),
        default="instants",
        help="kill at random instants, or on entering file-system steps (needs strace)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the kill instants")
    p.add_argument(
        "--commands",
        default=",".join(c.name for c in COMMANDS),
        help=f"comma-separated subset (--at steps also {OVERWRITE.name})",
    )
    p.add_argument("--out", type=Path, help="the JSON record (default: docs/results/faults_kill[_steps].json)")
    a = p.parse_args(argv)
    out = a.out or (OUT if a.at == "instants" else OUT.with_name("faults_kill_steps.json"))
    names = a.commands.split(",")
    result = run(a.kills, a.seed, names) if a.at == "instants" else run_steps(a.kills, names)
    write_atomic(out, json.dumps(result, indent=1) + "\n")
    bad = sum(c["mismatches"] + c["failed"] + c["partial_after_kill"] for c in result["commands"].values())
    print(f"{'all exact' if not bad else f'{bad} not exact'}; {result['wall_s']} s; wrote {out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
