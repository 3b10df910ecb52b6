"""GPU check of the search (issues #46 item 2, #44 item 3) on the parent benchmarks/gpu/_quantize.py's
measure_quantize wrote. The functions for benchmarks/gpu/check.py:

    measure_search_scoring(work, parent, tiny) -> dict      the scoring's tokens/s
    measure_search_run(work, parent, tiny) -> dict           `matgptq search` itself: issue #44's eight budgets

The scoring (allocation/fitness.py `Fitness.kl`) runs in a `python3 -c` child (benchmarks/gpu/_children.py's
SCORE_CHILD) with a timeout: on an H100 at most 90 s (FULL's score_timeout_s); a failing or timed-out child records why
(the last lines of its stderr). `tiny=True` runs the same code (child, dict keys) on a small random Llama on the CPU,
quantizing a tiny parent of its own when `work` holds none. The carried inputs, the child runner and the budgets are
benchmarks/gpu/_quantize.py's; its command line runs this after the quantize runs.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.gpu._children import CLI_CHILD, SCORE_CHILD
from benchmarks.gpu._quantize import FULL, QUANT_DIR, TINY, _child, _inputs, measure_quantize

BUDGETS = "2.5,2.75,3,3.25,3.5,4,5,6"  # issue #44's eight
# --time-limit in minutes: the CLI fits the teacher, the tables and every budget's search and report into it (on an
# H200, 2026-12-04, its one-shot tables alone took 90.5 s of a 0.75-minute limit: docs/results/gpu.json)
RUN_MINUTES = {True: 0.3, False: 0.75}  # tiny (CPU), full (GPU)
ROW_KEYS = (
    "code_bits",
    "kl",
    "start_kl",
    "chosen",
    "evaluations",
    "generations",
    "seconds",
    "teacher_seconds",
    "tables_seconds",
    "search_seconds",
    "report_seconds",
    "refine_steps",
)


def _default_parent(work: Path) -> Path | None:
    """The MatGPTQ parent measure_quantize kept, else its GPTQ 4-bit output (also sliceable: widths 2..4)."""
    outs = work / QUANT_DIR
    for method in ("matgptq", "gptq"):
        found = sorted(outs.glob(f"{method}-*")) if outs.is_dir() else []
        found = [p for p in found if (p / "matgptq.json").is_file()]
        if found:
            return found[0]
    return None


def measure_search_scoring(work: Path, parent: Path | None, tiny: bool, timeout_s: float | None = None) -> dict:
    """The search's scoring throughput (allocation/fitness.py `Fitness.kl`: the candidate's forward over the calibration
    windows at a mix of widths and its KL to the teacher) on the device: after a warm-up, a few candidates each
    two layers away from the last (an EvoPress child), timed apart from their `set_bits` re-slicing. `parent`: a
    parent written by measure_quantize (default: the one it kept under `work`)."""
    work = Path(work)
    device = "cpu" if tiny else "cuda"
    res = {
        "ok": False,
        "error": None,
        "timed_out": False,
        "device": device,
        "device_name": None,
        "tiny": tiny,
        "parent": None,
        "parent_method": None,
        "score_dtype": None,
        "tokens_per_s": None,
        "tokens_per_s_with_apply": None,
        "kl_s_per_candidate": None,
        "apply_s_per_candidate": None,
        "tokens_per_candidate": None,
        "candidates": None,
        "windows": None,
        "seqlen": None,
        "levels": None,
        "layers": None,
        "vocab": None,
        "hidden": None,
        "measured": {},
        "teacher_s": None,
        "load_s": None,
        "warmup_s": None,
        "process_s": None,
        "peak_gpu_gib": None,
        "peak_rss_gib": None,
    }
    parent = Path(parent) if parent is not None else _default_parent(work)
    if parent is None or not (parent / "matgptq.json").is_file():
        if tiny and parent is None:  # a tiny parent of its own
            measure_quantize(work, True)
            parent = _default_parent(work)
        if parent is None or not (parent / "matgptq.json").is_file():
            where = parent or work / QUANT_DIR
            res["error"] = f"no parent to score: {where} holds no checkpoint (did measure_quantize fail?)"
            return res
    _, calib, why = _inputs(tiny)
    if why is not None:
        res["error"] = why
        return res
    meta = json.loads((parent / "matgptq.json").read_text())
    res.update(parent=str(parent), parent_method=meta.get("quantization", {}).get("method"))
    opts = {
        "device": device,
        "seqlen": 32 if tiny else 256,
        "windows": 8 if tiny else 32,
        "batch": 8,
        "candidates": 3 if tiny else 5,
        "calib_range": [0.0, 0.05],
    }
    timeout = timeout_s or (TINY if tiny else FULL)["score_timeout_s"]
    opts["stack_dump_s"] = max(1.0, timeout - 3)  # the child's stacks into its stderr tail, should it time out
    child = _child(SCORE_CHILD, [str(parent), str(calib), json.dumps(opts)], timeout)
    res.update(
        error=child["error"],
        timed_out=child["timed_out"],
        process_s=round(child["seconds"], 2),
        candidates=opts["candidates"],
        stages=[p for p in child["progress"] if p["kind"] == "stage"],
    )
    r = child["result"]
    if r is None:
        return res
    main = r["measured"][r["score_dtype"]]
    res.update(
        ok=True,
        device_name=r["device_name"],
        score_dtype=r["score_dtype"],
        measured=r["measured"],
        tokens_per_s=main["tokens_per_s"],
        tokens_per_s_with_apply=main["tokens_per_s_with_apply"],
        kl_s_per_candidate=main["kl_s_per_candidate"],
        apply_s_per_candidate=main["apply_s_per_candidate"],
        tokens_per_candidate=main["tokens_per_candidate"],
        windows=r["windows"],
        seqlen=r["seqlen"],
        levels=r["levels"],
        layers=r["layers"],
        vocab=r["vocab"],
        hidden=r["hidden"],
        teacher_s=r["teacher_s"],
        load_s=r["load_s"],
        warmup_s=r["warmup_s"],
        peak_gpu_gib=None if r["peak_gpu"] is None else r["peak_gpu"] / 2.0**30,
        peak_rss_gib=None if r["rss"] is None else r["rss"] / 2.0**30,
    )
    return res


def measure_search_run(
    work: Path, parent: Path | None, tiny: bool, timeout_s: float = 120.0, minutes: float | None = None
) -> dict:
    """`python -m matgptq search PARENT --budget BUDGETS --time-limit M --device D` in a child: its wall seconds and,
    per budget, the summary row of its mix file (ROW_KEYS: the seconds of teacher, tables, search and report, the
    evaluations and generations that fitted, the chosen mix's calibration KL). Nothing here is timed twice: the rows
    are the CLI's own clocks. `minutes`: its --time-limit (default RUN_MINUTES)."""
    work = Path(work)
    minutes = RUN_MINUTES[tiny] if minutes is None else round(minutes, 2)
    res = {
        "ok": False,
        "error": None,
        "timed_out": False,
        "tiny": tiny,
        "budgets": BUDGETS,
        "time_limit_min": minutes,
        "timeout_s": round(timeout_s),
        "wall_s": None,
        "rows": [],
    }
    parent = Path(parent) if parent is not None else _default_parent(work)
    _, calib, why = _inputs(tiny)
    if parent is None or not (parent / "matgptq.json").is_file() or why is not None:
        res["error"] = why or f"no parent to search: {parent or work / QUANT_DIR} holds no checkpoint"
        return res
    out = work / "search-run"
    cmd = [
        "search",
        str(parent),
        "--budget",
        BUDGETS,
        "--calib",
        str(calib),
        "--calib-range",
        "0:0.3",
        "--out",
        str(out),
        "--device",
        "cpu" if tiny else "cuda",
        "--time-limit",
        str(minutes),
        "--overwrite",
        "--quiet",
    ]
    if tiny:
        cmd += ["--generations", "2", "--offspring", "4", "--calib-tokens", "4096"]
    res["command"] = " ".join(["matgptq", *cmd])
    child = _child(CLI_CHILD, cmd, timeout_s)
    res.update(error=child["error"], timed_out=child["timed_out"], wall_s=round(child["seconds"], 2))
    for path in out.glob("mix-*.json"):
        row = json.loads(path.read_text()).get("summary", {})
        res["rows"].append({"budget": row.get("budget", path.stem), **{k: row.get(k) for k in ROW_KEYS}})
    res["rows"].sort(key=lambda r: r["code_bits"] or 0.0)
    res["ok"] = res["error"] is None and len(res["rows"]) == len(BUDGETS.split(","))
    return res
