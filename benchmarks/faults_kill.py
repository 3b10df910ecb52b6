"""Killed anywhere, resumed exactly (#99 item 1): `matgptq quantize` (GPTQ, and a MatGPTQ parent), `search`, `export`
and `slice` killed with SIGKILL at random instants, then run again, against an uninterrupted run.

    python -m benchmarks.faults_kill --kills 100   # writes docs/results/faults_kill.json and prints a summary

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
import torch
from safetensors.torch import load_file

from benchmarks._harness import RESULTS, ROOT, child_env, machine, write_atomic

SHARED = ROOT.parent / "shared"
MODEL = SHARED / "models" / "stories260K"
TEXT = SHARED / "data" / "tinystories" / "tinystories_val_head.txt"
OUT = RESULTS / "faults_kill.json"
TIMEOUT = 600  # seconds any one child may take
RESUMES = 3  # runs with --resume after a kill before a trial counts as failed
# JSON fields that record a duration, as paths ("*": any key or index); nothing else may differ
TIMING = (
    ("report", "*", "seconds"),  # matgptq.json: each layer's solve
    *(("summary", k) for k in ("seconds", "teacher_seconds", "tables_seconds", "search_seconds", "report_seconds",
                               "report_guess_seconds", "refine_seconds")),  # mix-<budget>.json
    ("history", "*", "seconds"),  # mix-<budget>.json: per generation
    ("state", "seconds"), ("state", "history", "*", "seconds"), ("state", "refine", "seconds"),  # .state-<budget>.json
    ("tables", "*", "seconds"),  # .tables.json
)
RESUME_RECORDS = (("summary", "tables_reused"),)  # true where a resumed search read the tables back

QUANTIZE = ["--calib", TEXT, "--calib-range", "0.6:1", "--nsamples", "32", "--seqlen", "64", "--quiet"]
SEARCH = ["--budget", "2.5,3.5", "--calib", TEXT, "--calib-range", "0.6:0.7", "--generations", "4", "--offspring", "4",
          "--stages", "126:2,504:1", "--seqlen", "64", "--sensitivity-tokens", "126", "--calib-tokens", "1008",
          "--quiet"]  # fmt: skip


@dataclass(frozen=True)
class Command:
    name: str
    args: list  # `matgptq` arguments; None stands for the output path, "PARENT" for the MatGPTQ reference
    resumable: bool  # takes --resume
    whole: bool  # the output appears all at once (else file by file: search's mix files)
    suffix: str = ""  # of the output path

    def argv(self, out: Path, parent: Path) -> list[str]:
        subst = {None: out, "PARENT": parent}
        return [sys.executable, "-m", "matgptq", *(str(subst.get(a, a)) for a in self.args)]


COMMANDS = (
    Command("quantize-gptq", ["quantize", MODEL, "--out", None, *QUANTIZE], True, True),
    Command("quantize-matgptq", ["quantize", MODEL, "--out", None, "--method", "matgptq", "--bits", "2,3,4",
                                 *QUANTIZE], True, True),  # fmt: skip
    Command("search", ["search", "PARENT", "--out", None, *SEARCH], True, False),
    Command("export-gguf", ["export", "PARENT", "--format", "gguf", "--bits", "3", "--out", None], False, True,
            ".gguf"),
    Command("slice", ["slice", "PARENT", "--bits", "3", "--out", None], False, True),
)


def run_child(argv: list[str], log: Path, kill_at: float | None = None) -> tuple[int, float]:
    """(exit status, wall seconds) of `argv`, output to `log`; SIGKILLed (its process group) after `kill_at` seconds
    when given, status then −9 (or its own, where it ended first)."""
    t0 = time.monotonic()
    with open(log, "ab") as f:
        proc = subprocess.Popen(argv, env=child_env(1), stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=TIMEOUT if kill_at is None else kill_at)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    return proc.returncode, time.monotonic() - t0


def litter(out: Path) -> list[str]:
    """What lies beside `out` (its trial directory holds nothing else) or inside it under a temporary name: after a
    kill, a quantization's `.OUT.resume` is its state, after a finished run litter too."""
    beside = [p.name for p in out.parent.iterdir() if p.name != out.name and p.suffix != ".log"]
    inside = [f"{out.name}/{p.name}" for p in out.iterdir() if ".tmp" in p.name] if out.is_dir() else []
    return sorted(beside + inside)


def _matches(path: tuple, patterns) -> bool:
    return any(len(p) == len(path) and all(a in ("*", b) for a, b in zip(p, path)) for p in patterns)


def json_diff(a, b, path: tuple = ()) -> list[tuple]:
    """The paths where JSON values `a` and `b` differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in json_diff(a.get(k, ...), b.get(k, ...), (*path, k))]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in json_diff(x, y, (*path, i))]
    return [] if a == b and type(a) is type(b) else [path]


def tensors_equal(a: Path, b: Path) -> bool:
    """The same tensor names, each of the same dtype and shape and the same bytes."""
    ta, tb = load_file(str(a)), load_file(str(b))
    raw = lambda t: t.contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
    return sorted(ta) == sorted(tb) and all(ta[k].dtype == tb[k].dtype and ta[k].shape == tb[k].shape
                                            and raw(ta[k]).equal(raw(tb[k])) for k in ta)  # fmt: skip


def compare_file(a: Path, b: Path) -> tuple[list[str], list[str]]:
    """(differences, resume records that differ) of output file `a` against the reference `b`."""
    if a.suffix == ".safetensors":
        return ([] if tensors_equal(a, b) else [f"{a.name}: tensors"]), []
    if a.suffix == ".json":
        diffs = [d for d in json_diff(json.loads(a.read_text()), json.loads(b.read_text())) if not _matches(d, TIMING)]
        records = [d for d in diffs if _matches(d, RESUME_RECORDS)]
        return [f"{a.name}: {'.'.join(map(str, d))}" for d in diffs if d not in records], \
            [f"{a.name}: {'.'.join(map(str, d))}" for d in records]  # fmt: skip
    return ([] if a.read_bytes() == b.read_bytes() else [f"{a.name}: bytes"]), []


def compare(out: Path, ref: Path) -> tuple[list[str], list[str]]:
    """(differences, resume records) of output `out` against `ref`: a file, or a directory's files but temporary
    ones."""
    if ref.is_file():
        return compare_file(out, ref) if out.is_file() else ([f"{out.name} missing"], [])
    names = lambda d: {p.name for p in d.iterdir() if p.is_file() and ".tmp" not in p.name}  # noqa: E731
    mine, theirs = (names(out) if out.is_dir() else set()), names(ref)
    diffs = [f"{n}: extra" for n in sorted(mine - theirs)] + [f"{n}: missing" for n in sorted(theirs - mine)]
    records: list[str] = []
    for n in sorted(mine & theirs):
        d, r = compare_file(out / n, ref / n)
        diffs, records = diffs + d, records + r
    return diffs, records


def after_kill(cmd: Command, out: Path, ref: Path) -> tuple[str, list[str]]:
    """Where the kill caught the run: `write` (a temporary file or directory is left: inside a write), `output` (the
    output, or some of search's mix files, in place), `state` (a resume state only), `none`; and how what it put in
    place differs from the reference."""
    if cmd.whole:
        placed = [out] if out.exists() else []
        diffs = compare(out, ref)[0] if placed else []
    else:
        placed = sorted(out.glob("[!.]*")) if out.is_dir() else []
        diffs = [d for p in placed for d in (compare_file(p, ref / p.name)[0] if (ref / p.name).is_file()
                                             else [f"{p.name}: extra"])]  # fmt: skip
    left = [p.name for p in out.parent.rglob("*") if p.name != "run.log"]
    where = "write" if any(".tmp" in n for n in left) else "output" if placed else \
        "state" if any(n.startswith(".") for n in left) else "none"  # fmt: skip
    return where, diffs


def trial(cmd: Command, work: Path, ref: Path, parent: Path, kill_at: float) -> dict:
    """One kill and what follows it (the protocol in the module docstring); the trial's directory is removed."""
    work.mkdir(parents=True)
    out, log = work / f"out{cmd.suffix}", work / "run.log"
    rc, _ = run_child(cmd.argv(out, parent), log, kill_at)
    row = {"killed": rc == -signal.SIGKILL, "rc": rc}
    if not row["killed"]:
        shutil.rmtree(work)
        return row
    row["landed"], row["partial"] = after_kill(cmd, out, ref)
    row["litter_after_kill"] = [n for n in litter(out) if not n.endswith(".resume")]
    runs = []
    if cmd.resumable:
        while not runs or (runs[-1] != 0 and len(runs) < RESUMES):
            runs.append(run_child(cmd.argv(out, parent) + ["--resume"], log)[0])
    elif not out.exists():
        runs.append(run_child(cmd.argv(out, parent), log)[0])
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
        "uninterrupted_wall_s": round(wall, 2), "killed": len(killed), "ended_before_kill": len(rows) - len(killed),
        "ended_before_kill_failed": sum(not r["killed"] and r["rc"] != 0 for r in rows),
        "kill_instants_s": [round(t, 3) for t, r in zip(instants, rows) if r["killed"]], "landed": landed,
        "exact": len(exact), "exact_but_resume_record": sum(bool(r["records"]) for r in exact),
        "mismatches": sum(bool(r["diffs"]) for r in killed if r["ok"]), "failed": sum(not r["ok"] for r in killed),
        "partial_after_kill": sum(bool(r["partial"]) for r in killed),
        "reruns": sum(len(r["runs"]) for r in killed),
        "said_already_complete": sum(r["already_complete"] for r in killed),
        "litter_after_kill": sum(bool(r["litter_after_kill"]) for r in killed),
        "litter_left": sum(bool(r["litter_left"]) for r in killed),
        "examples": _examples(killed),
    }  # fmt: skip


def _shown(arg: str) -> str:
    """An argument as the record shows it: ../shared paths relative to the checkout."""
    return arg.replace(str(SHARED), "../shared")


def _examples(killed: list[dict]) -> dict:
    """The first few of each kind of finding, for the record."""
    pick = lambda key: [r[key] for r in killed if r.get(key)][:3]  # noqa: E731
    return {k: v for k, v in {"diffs": pick("diffs"), "resume_records": pick("records"), "partial": pick("partial"),
                              "errors": pick("error"), "litter_after_kill": pick("litter_after_kill"),
                              "litter_left": pick("litter_left")}.items() if v}  # fmt: skip


def run(kills: int, seed: int, names: list[str]) -> dict:
    rng = np.random.Generator(np.random.PCG64(seed))
    t0 = time.monotonic()
    result = {"protocol": __doc__.split("Protocol. ", 1)[1].strip(), "kills_per_command": kills, "seed": seed,
              "timing_fields": [".".join(map(str, p)) for p in TIMING],
              "resume_records": [".".join(map(str, p)) for p in RESUME_RECORDS], "machine": machine(),
              "commands": {}}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="faults_kill-") as tmp:
        work = Path(tmp)
        refs = references(work)
        for cmd in (c for c in COMMANDS if c.name in names):
            ref, wall = refs[cmd.name]
            rows, instants = [], []
            while sum(r["killed"] for r in rows) < kills and len(rows) < 3 * kills:
                instants.append(float(rng.uniform(0, wall)))
                rows.append(trial(cmd, work / "trials" / f"{cmd.name}-{len(rows)}", ref, refs["quantize-matgptq"][0],
                                  instants[-1]))  # fmt: skip
            result["commands"][cmd.name] = tally(cmd, wall, rows, instants)
            print(_line(cmd.name, result["commands"][cmd.name]), flush=True)
    result["wall_s"] = round(time.monotonic() - t0, 1)
    return result


def _line(name: str, c: dict) -> str:
    return (f"{name:17} killed {c['killed']:3}  exact {c['exact']:3} (resume record differs "
            f"{c['exact_but_resume_record']})  mismatches {c['mismatches']}  failed {c['failed']}  partial "
            f"{c['partial_after_kill']}  litter left {c['litter_left']}  already complete "
            f"{c['said_already_complete']}  landed {c['landed']}  T {c['uninterrupted_wall_s']} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=100, help="killed runs per command")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill instants")
    p.add_argument("--commands", default=",".join(c.name for c in COMMANDS), help="comma-separated subset")
    p.add_argument("--out", type=Path, default=OUT, help="the JSON record")
    a = p.parse_args(argv)
    result = run(a.kills, a.seed, a.commands.split(","))
    write_atomic(a.out, json.dumps(result, indent=1) + "\n")
    bad = sum(c["mismatches"] + c["failed"] + c["partial_after_kill"] for c in result["commands"].values())
    print(f"{'all exact' if not bad else f'{bad} not exact'}; {result['wall_s']} s; wrote {a.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
