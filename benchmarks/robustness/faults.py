"""What a damaged file, a kill or a full disk costs a user, on one page (docs/results/faults.md): the price of the
checksums every reader verifies (measured here), beside the kill/resume counts (benchmarks/robustness/faults_kill.py writes
faults_kill.json).

    python -m benchmarks.robustness.faults [--model DIR] [--repeats 5]   # the checksums' price: faults_checksums.json
    python -m benchmarks.robustness.faults --fuzz                        # the damaged-input suite's counts: faults_fuzz.json
    python -m benchmarks.robustness.faults --full-disk                   # every writer on a full disk: faults_full_disk.json

The checksum cost: a SmolLM2-135M checkpoint at 8 bits (RTN: the bytes of a c = 8 parent), read with and without
verification (`read_checkpoint`, and `matgptq.load` whole), alternating, median of --repeats; and zlib's CRC-32 over
the checkpoint's bytes alone. The fuzz counts: tests/test_fuzz_volume.py run as CI runs it, each reader's cases and
seconds read from its junit report. The full-disk cases: tests/test_full_disk.py run twice, on the small tmpfs it mounts
and under the file-size limit it falls back to (MATGPTQ_TEST_NO_MOUNT=1), each case's outcome from its junit report.
Each writes its JSON, then the page from every JSON there is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import zlib
from pathlib import Path

from benchmarks._harness import RESULTS, header, load_json, machine, pytest_junit, write_atomic, write_page

SOURCES = (
    "faults_checksums.json",
    "faults_kill.json",
    "faults_fuzz.json",
    "faults_kill_steps.json",
    "faults_full_disk.json",
)  # page()'s arguments
SMOLLM2 = Path.home() / ".cache" / "matgptq" / "SmolLM2-135M-Instruct"  # `make real-model`


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(model: Path, repeats: int) -> dict:
    import matgptq
    from matgptq.formats import read_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "q8"
        matgptq.quantize(model, ckpt, method="rtn", bits=8, progress=False)
        files = sorted(ckpt.glob("*.safetensors"))
        size = sum(f.stat().st_size for f in files)
        rows: dict[str, list[float]] = {k: [] for k in ("read", "read_verified", "load", "load_verified", "crc")}
        for _ in range(repeats):  # alternating, so a drift of the machine falls on both
            rows["read"].append(timed(lambda: read_checkpoint(ckpt, verify=False)))
            rows["read_verified"].append(timed(lambda: read_checkpoint(ckpt, verify=True)))
            rows["load"].append(timed(lambda: matgptq.load(ckpt, verify=False)))
            rows["load_verified"].append(timed(lambda: matgptq.load(ckpt, verify=True)))
            rows["crc"].append(timed(lambda: [zlib.crc32(f.read_bytes()) for f in files]))
    med = {k: statistics.median(v) for k, v in rows.items()}
    return {
        "model": model.name,
        "checkpoint_bytes": size,
        "repeats": repeats,
        "seconds": rows,
        "median_s": med,
        "crc_gb_per_s": size / med["crc"] / 1e9,
        "machine": machine(),
    }


def fuzz() -> dict:
    """Per reader: cases, seconds and outcome of tests/test_fuzz_volume.py's volume test (its junit report)."""
    import xml.etree.ElementTree as ET

    junit, rc = pytest_junit(["tests/test_fuzz_volume.py"], "fuzz")
    rows, replayed = {}, 0
    for case in ET.parse(junit).iter("testcase") if junit else ():
        name = case.get("name", "")
        failed = _outcome(case) == "failed"
        if name.startswith("test_every_recipe_that_once_failed_passes"):
            replayed += 1
        elif name.startswith("test_damaged_inputs_at_volume["):
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            rows[name.split("[", 1)[1].rstrip("]")] = {
                "cases": int(props.get("cases", 0)),
                "seconds": float(props.get("seconds", 0)),
                "ok": not failed,
            }
    return {
        "readers": rows,
        "corpus_replayed": replayed,
        "pytest_exit": rc,
        "machine": machine(),
        "command": "python -m pytest tests/test_fuzz_volume.py",
    }


def _outcome(case) -> str:
    """A junit testcase element's outcome: failed (a failure or an error), skipped or passed."""
    if case.find("failure") is not None or case.find("error") is not None:
        return "failed"
    return "skipped" if case.find("skipped") is not None else "passed"


DISK_MODES = {"tmpfs": {}, "file-size limit": {"MATGPTQ_TEST_NO_MOUNT": "1"}}  # the mode: its environment


def full_disk() -> dict:
    """Per mode of tests/test_full_disk.py (DISK_MODES), each case's outcome and seconds (its junit report)."""
    import os
    import xml.etree.ElementTree as ET

    modes = {}
    for mode, env in DISK_MODES.items():
        junit, rc = pytest_junit(["tests/test_full_disk.py"], "disk", env={**os.environ, **env})
        cases = {}
        for case in ET.parse(junit).iter("testcase") if junit else ():
            cases[case.get("name", "")] = {"outcome": _outcome(case), "seconds": float(case.get("time", 0))}
        modes[mode] = {"cases": cases, "pytest_exit": rc}
    return {"modes": modes, "machine": machine(), "command": "python -m pytest tests/test_full_disk.py"}


def _cell(case: dict | None) -> str:
    return f"{case['outcome']} ({case['seconds']:.0f} s)" if case else "not run"


def disk_section(d: dict) -> list[str]:
    names = list(dict.fromkeys(n for m in d["modes"].values() for n in m["cases"]))
    passed = {m: sum(c["outcome"] == "passed" for c in v["cases"].values()) for m, v in d["modes"].items()}
    return [
        "## A full disk",
        "",
        "Every writer (the parent and its resume state, a slice, GPTQ, compressed-tensors, GGUF, a search's mix and "
        "an eval JSON) on a filesystem that fills up mid-write: one line naming the path and the space needed, "
        "exit 2, no partial output, the previous output intact under `--overwrite`, and `--resume` finishing to the "
        "same bytes once there is room (tests/test_full_disk.py). Run twice: on a small tmpfs the test mounts, and "
        "under a file-size limit (RLIMIT_FSIZE), its fallback where mounting is not allowed. "
        f"{d['machine']['cpu']}, {d['machine']['cores']} cores:",
        "",
        "| case | " + " | ".join(d["modes"]) + " |",
        "|---" * (1 + len(d["modes"])) + "|",
        *(f"| `{n}` | " + " | ".join(_cell(d["modes"][m]["cases"].get(n)) for m in d["modes"]) + " |" for n in names),
        "",
        ", ".join(f"{m}: {passed[m]} of {len(v['cases'])} passed" for m, v in d["modes"].items())
        + f". Command: `{d['command']}`, and with `MATGPTQ_TEST_NO_MOUNT=1` "
        "(`python -m benchmarks.robustness.faults --full-disk` records both).",
        "",
    ]


def fuzz_section(f: dict) -> list[str]:
    rows = [
        f"| {r} | {c['cases']:,} | {c['seconds']:.0f} | {'none' if c['ok'] else 'FAILED'} |"
        for r, c in f["readers"].items()
    ]
    return [
        "## Damaged inputs at volume",
        "",
        "Each reader gets generated damaged copies of a small file of its kind (truncations, bit flips in headers "
        "and data, header and JSON edits, wrong dtypes and shapes, huge declared sizes), each judged: one-line "
        "error or a result its oracle accepts (a matgptq checkpoint that loads is the same model; a foreign "
        "format keeps its structure), within a time and memory bound "
        f"(tests/test_fuzz_volume.py). {f['corpus_replayed']} recipes that once failed are replayed too. "
        f"{f['machine']['cpu']}, {f['machine']['cores']} cores:",
        "",
        "| reader | cases | seconds | failures |",
        "|---|---|---|---|",
        *rows,
        "",
        f"Command: `{f['command']}` (`python -m benchmarks.robustness.faults --fuzz` records it).",
        "",
    ]


def page(
    checksums: dict,
    kills: dict | None = None,
    fuzzed: dict | None = None,
    steps: dict | None = None,
    disk: dict | None = None,
) -> str:
    m, med = checksums["machine"], checksums["median_s"]
    lines = [
        header("benchmarks/robustness/faults.py", *SOURCES),
        "",
        "# Faults: damaged files, kills, full disks",
        "",
        "What holds when a run is killed, the disk fills or a file is damaged, measured on stories260K (the "
        "CI model) and SmolLM2-135M. The tests check the same on every `make test`: a sample of kill instants "
        "(tests/test_kill_resume.py), every writer on a full disk (tests/test_full_disk.py), damaged inputs "
        "at volume (tests/test_fuzz_volume.py) and the checksums (tests/formats/test_checksums.py).",
        "",
    ]
    if kills is not None:
        lines += kill_section(kills)
    if steps is not None:
        lines += steps_section(steps)
    if disk is not None:
        lines += disk_section(disk)
    if fuzzed is not None:
        lines += fuzz_section(fuzzed)
    lines += [
        "## The price of the checksums",
        "",
        f"Every tensor of a matgptq checkpoint is checked against its CRC-32 when it is read "
        f"([formats](../formats.md) §1.10). On {checksums['model']} at 8 bits "
        f"({checksums['checkpoint_bytes'] / 1e6:.0f} MB of tensors), median of {checksums['repeats']} "
        f"alternating reads, {m['cpu']}, {m['cores']} cores:",
        "",
        "| | unverified (s) | verified (s) | added (s) |",
        "|---|---|---|---|",
        *(
            f"| `{what}` | {_spread(checksums['seconds'][key])} | {_spread(checksums['seconds'][key + '_verified'])} "
            f"| {med[key + '_verified'] - med[key]:+.3f} |"
            for what, key in (("read_checkpoint", "read"), ("matgptq.load", "load"))
        ),
        "",
        "Medians, with the fastest and slowest run in brackets. Verifying is one pass of CRC-32 over the "
        "bytes: a few times a bare tensor read (which maps the file and copies it), and within the run-to-run "
        "spread of a whole `matgptq.load`.",
        "",
        f"CRC-32 alone runs at {checksums['crc_gb_per_s']:.1f} GB/s here. `--no-verify` (`verify=False`) "
        "skips it. Command: `python -m benchmarks.robustness.faults`.",
    ]
    return "\n".join(lines) + "\n"


def _spread(seconds: list[float]) -> str:
    return f"{statistics.median(seconds):.3f} ({min(seconds):.3f}-{max(seconds):.3f})"


def kill_section(kills: dict) -> list[str]:
    """The kill/resume counts of benchmarks/robustness/faults_kill.py's record."""
    m = kills["machine"]
    rows = [
        f"| {name} | {c['uninterrupted_wall_s']:.1f} | {c['killed']} | {c['exact']} | {c['mismatches']} | "
        f"{c['failed']} | {c['partial_after_kill']} | {c['litter_left']} | {c['said_already_complete']} | "
        f"{c['landed']['none']} / {c['landed']['state']} / {c['landed']['write']} / {c['landed']['output']} |"
        for name, c in kills["commands"].items()
    ]
    total = {k: sum(c[k] for c in kills["commands"].values()) for k in ("killed", "exact")}
    writes = sum(c["landed"]["write"] for c in kills["commands"].values())
    return [
        "## Killed anywhere, resumed exactly",
        "",
        f"Each command killed with SIGKILL at {kills['kills_per_command']} instants drawn uniformly over its "
        f"uninterrupted run (seed {kills['seed']}), then run again (with `--resume` where it resumes) until it "
        "finished, and its output compared with the uninterrupted run's: tensors byte for byte, JSON equal but "
        f"for the timing fields. {m['cpu']}, {m['cores']} cores; {kills['wall_s'] / 60:.0f} minutes in all.",
        "",
        "| command | uninterrupted (s) | killed | exact | mismatches | failed | partial output | litter left | "
        '"already complete" | kill landed: before any state / in the resume state / inside a write / '
        "after the output |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"{total['exact']} of {total['killed']} kills resumed exactly. {writes} landed inside a write: on these "
        "small files a write lasts milliseconds of a run of seconds (most of it imports), so uniform instants "
        "seldom reach the inside of writes and renames; the next section kills there on purpose.",
        "",
        "Commands: `python -m benchmarks.robustness.faults_kill --kills 100` (the record: docs/results/faults_kill.json, "
        "with each command line).",
        "",
    ]


def steps_section(steps: dict) -> list[str]:
    """The kills at file-system steps (faults_kill.py --at steps)."""
    cs = steps["commands"]
    rows = [
        f"| {name} | {c['steps']} | {c['kinds']} | {c['chosen']} | {c['killed']} | {c['on_target']} | "
        f"{c['exact']} | {c['mismatches']} | {c['failed']} | {c['partial_after_kill']} | {c['litter_left']} |"
        for name, c in cs.items()
    ]
    total = {k: sum(c[k] for c in cs.values()) for k in ("killed", "exact", "on_target", "litter_left")}
    return [
        "## Killed inside writes and renames",
        "",
        "Each command's uninterrupted run traced with strace: its file-system steps (write, ftruncate, "
        "rename, link, unlink, mkdir, rmdir, … on its output, temporary copies and resume state) grouped into "
        "kinds (the call and its paths, temporary names and numbers generalised). Then for the first, the "
        "middle and the last step of every kind, a run SIGKILLed by strace on entering that step (the step "
        "entered, not done), run again as above and compared the same way; the killed run's own trace says "
        "where it died. `slice-overwrite` slices over an existing output with `--overwrite`: right after the "
        "kill the old output or the new one must be in place, whole.",
        "",
        "| command | steps | kinds | killed at | killed | died at that step | exact | mismatches | failed | "
        "partial output | litter left |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"{total['exact']} of {total['killed']} kills resumed exactly; {total['on_target']} died at the "
        f"step aimed at. Litter left: {total['litter_left']} runs, each a hidden `.NAME.tmp-PID@HOST-…` (empty, or a "
        "second hard link to the finished file), left where the kill came after the output was in place "
        "(nothing runs again there); the next write to that path removes it (fsutil.clear_stale). "
        + (f"Note: {steps['search_rerun']}. " if "search_rerun" in steps else "")
        + f"{steps['machine']['cpu']}, {steps['machine']['cores']} cores; {steps['wall_s'] / 60:.0f} minutes.",
        "",
        "Command: `python -m benchmarks.robustness.faults_kill --at steps --kills 0 --commands "
        f"{','.join(cs)}` (needs strace; the record: docs/results/faults_kill_steps.json).",
        "",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=SMOLLM2, help="the model to quantize and read (default: SmolLM2)")
    ap.add_argument("--repeats", type=int, default=5, help="timed reads per variant")
    ap.add_argument("--fuzz", action="store_true", help="run the damaged-input suite instead and record its counts")
    ap.add_argument("--full-disk", action="store_true", help="run the full-disk suite in both modes and record it")
    a = ap.parse_args()
    if a.full_disk:
        data = full_disk()
        write_atomic(RESULTS / "faults_full_disk.json", json.dumps(data, indent=1) + "\n")
        print("; ".join(f"{m}: pytest exit {v['pytest_exit']}" for m, v in data["modes"].items()))
    elif a.fuzz:
        data = fuzz()
        write_atomic(RESULTS / "faults_fuzz.json", json.dumps(data, indent=1) + "\n")
        print(", ".join(f"{r} {c['cases']} cases {c['seconds']:.0f} s" for r, c in data["readers"].items()))
    else:
        data = measure(a.model, a.repeats)
        write_atomic(RESULTS / "faults_checksums.json", json.dumps(data, indent=1) + "\n")
        med = data["median_s"]
        print(
            f"verified/unverified: read_checkpoint {med['read_verified']:.3f}/{med['read']:.3f} s, matgptq.load "
            f"{med['load_verified']:.3f}/{med['load']:.3f} s; CRC-32 {data['crc_gb_per_s']:.1f} GB/s"
        )
    write_page(
        RESULTS / "faults.md", page(*(load_json(RESULTS / f) if (RESULTS / f).is_file() else None for f in SOURCES))
    )


if __name__ == "__main__":
    main()
