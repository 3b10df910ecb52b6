"""GPU check of the quantize pipeline (issue #46 item 2): `matgptq.quantize` seconds and peak GPU memory per
Llama-3.1-8B-shaped block at 128 x 512 and 128 x 2048 calibration tokens, GPTQ (4-bit) and MatGPTQ ((3, 4, 8)), next
to llm-compressor 0.14's 2.19 s / 7.87 s per block (../shared/reference/gpu-anchors.md §4; the goal, item 3: at most
0.5x); it writes the parent whose search scoring benchmarks/gpu/_search.py measures. Functions for
benchmarks/gpu/check.py:

    prepare_carry(dest)                        on a machine with the data: the tokenizer and calibration text the GPU
                                               machine lacks, into `dest` (the repository's gitignored .gpu-carry/)
    measure_quantize(work, tiny) -> [dict]     one dict per run (RUNS), each run a `python3 -c` child

and the plumbing benchmarks/gpu/_search.py shares: the carried inputs (_inputs), the child runner (_child), the
budgets (FULL, TINY) and where the kept outputs lie (QUANT_DIR). The children's code: benchmarks/gpu/_children.py.

`tiny=True` runs the same code (children, instruments, dict keys) on a small random Llama on the CPU in well under a
minute; its ratios to the anchors mean nothing. The model is benchmarks/gpu/_random_llama.py's, built under `work` with
stories260K's tokenizer from ../shared (a full run: the carried SmolLM2 one). Every run is a child process with a
timeout out of a time budget; a failing, timed-out or skipped run records why (the last lines of its stderr) and the
others go on. A child reports what it finished as it goes (per block and per layer), so a run killed at its timeout
still tells how far it got and how fast. On an H100: measure_quantize at most 140 s (the model's build, the
agreement and the runs; a MatGPTQ run at most 60 s), the scoring (benchmarks/gpu/_search.py) at most 90 s:
FULL's budgets; the runs' order (RUNS) is their priority.

Per run: wall seconds of the `quantize` call, its seconds per block (wall / blocks, and the second block alone: its
groups' passes and solves, without reading and writing), the stages (tokenizing, opening, capturing the first block's
inputs, forward passes, Hessian accumulation, solver, error report, resume-state and block writes, assembling), the
shares of forward / Hessian / solver in the blocks' time, peak GPU memory (torch.cuda.max_memory_allocated), peak RSS,
per-layer solver seconds; and the codes of a small float32 Llama quantized on the GPU against the CPU's (fraction
differing, largest step; tests/quantization/test_cuda.py's bounds). On the GPU, the child synchronises around the
Hessian hooks and the solver calls so the stage seconds are the device's, not the launches'.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.gpu._children import AGREE_CHILD, QUANT_CHILD

ROOT = Path(__file__).resolve().parents[2]
CARRY = ROOT / ".gpu-carry"  # gitignored; carried to the GPU machine with the working tree
CARRY_PART = "quantize"  # this module's folder in it
SMOLLM2 = Path.home() / ".cache" / "matgptq" / "SmolLM2-135M-Instruct"
SHARED = Path(os.environ.get("MATGPTQ_SHARED") or ROOT.parent / "shared")  # as tests/conftest.py finds it
WIKI = SHARED / "data" / "wikitext-2-raw" / "wiki.test.raw"  # 301,948 SmolLM2 tokens
# the tiny dry run's tokenizer: the test fixture's (vocab 512), so a machine that never made SmolLM2 runs it (#101)
TINY_TOKENIZER = SHARED / "models" / "stories260K"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")

ANCHORS = {512: 2.19, 2048: 7.87}  # llm-compressor 0.14 oneshot seconds per Llama-3.1-8B block, 128 x seqlen
GOAL = 0.5  # issue #46 item 3: at most half the anchor
# (method, widths, seqlen of the full run): the goal's GPTQ first, then the MatGPTQ parent (search scoring)
RUNS = (("gptq", (4,), 512), ("gptq", (4,), 2048), ("matgptq", (3, 4, 8), 512), ("matgptq", (3, 4, 8), 2048))
# calib: the share of the text tokenized (from its start), ≥ 1.15x the tokens drawn: 0.3 ≈ 90k tokens, 1.0 ≈ 302k
# cap_s: a MatGPTQ run's own limit (its per-column host round trips make it the slowest; killed, it still reports the
# layers it finished), so that it cannot starve the runs after it
FULL = dict(
    shape="llama-3.1-8b",
    nsamples=128,
    budget_s=140.0,
    min_start_s=20.0,
    seqlen={512: 512, 2048: 2048},
    calib={512: 0.3, 2048: 1.0},
    cap_s={"gptq": 120.0, "matgptq": 60.0},
    agree_cap_s=30.0,
    score_timeout_s=90.0,
)
# TINY measures nothing (a CPU dry run of the same code): its limits only catch a hang, so they are 5x what an idle
# 2-core machine needs; at 45 s / 20 s each run of `make gpu-check` timed out on a loaded one (load 7, issue #101)
TINY = dict(
    shape="llama-tiny",
    nsamples=4,
    budget_s=240.0,
    min_start_s=6.0,
    seqlen={512: 32, 2048: 64},
    calib={512: 0.02, 2048: 0.02},
    cap_s={"gptq": 150.0, "matgptq": 150.0},
    agree_cap_s=100.0,
    score_timeout_s=200.0,
)
BLOCKS = 2
QUANT_DIR = "quantize"  # under `work`: the outputs kept for the search scoring


# ---------------------------------------------------------------------------------------------------------- inputs


def _carry(dest: Path | None = None) -> Path:
    return (dest or CARRY) / CARRY_PART


def prepare_carry(dest: Path = CARRY) -> dict:
    """Copy what this module's GPU runs need and the GPU machine lacks into `dest`/quantize/: SmolLM2's tokenizer
    files (no weights) and the WikiText-2 test text. Returns {relative path: bytes}."""
    part = _carry(Path(dest))
    (part / "tokenizer").mkdir(parents=True, exist_ok=True)
    copied = {}
    for name in TOKENIZER_FILES:
        if (SMOLLM2 / name).is_file():
            shutil.copy2(SMOLLM2 / name, part / "tokenizer" / name)
            copied[f"{CARRY_PART}/tokenizer/{name}"] = (SMOLLM2 / name).stat().st_size
    if "tokenizer.json" not in {Path(k).name for k in copied}:
        raise FileNotFoundError(f"no SmolLM2 tokenizer in {SMOLLM2}; run a SmolLM2 benchmark once to fetch it")
    shutil.copy2(WIKI, part / WIKI.name)
    copied[f"{CARRY_PART}/{WIKI.name}"] = WIKI.stat().st_size
    return copied


def _inputs(tiny: bool = False) -> tuple[Path | None, Path | None, str | None]:
    """(tokenizer directory, calibration text, what is missing): the carried ones, else this machine's; `tiny`:
    stories260K's tokenizer from ../shared, never SmolLM2's (the dry run needs nothing a target makes)."""
    part = _carry()
    toks = (TINY_TOKENIZER,) if tiny else (part / "tokenizer", SMOLLM2)
    tok = next((d for d in toks if (d / "tokenizer.json").is_file()), None)
    calib = next((f for f in (part / WIKI.name, WIKI) if f.is_file()), None)
    missing = [what for what, p in (("tokenizer", tok), ("calibration text", calib)) if p is None]
    why = None
    if missing:
        where = f"{TINY_TOKENIZER} / {WIKI}" if tiny else f"{part} (prepare_carry) and {SMOLLM2} / {WIKI}"
        why = f"no {' and no '.join(missing)}: looked in {where}"
    return tok, calib, why


def _env() -> dict:
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _text(x) -> str:
    return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")


def _child(code: str, args: list[str], timeout: float) -> dict:
    """Run `code` in `python3 -c` with src/ on the path: its @@result JSON, @@progress notes, and why it failed."""
    t0 = time.perf_counter()
    timed_out = False
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, *args],
            env=_env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=max(1.0, timeout),
        )
        rc, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err, timed_out = None, _text(e.stdout), _text(e.stderr), True
    result = next((json.loads(line[9:]) for line in reversed(out.splitlines()) if line.startswith("@@result ")), None)
    progress = [json.loads(line[11:]) for line in err.splitlines() if line.startswith("@@progress ")]
    tail = "\n".join(line for line in err.splitlines() if not line.startswith("@@progress "))[-2500:]
    error = None
    if timed_out:
        error = f"timed out after {timeout:.0f} s (killed); stderr tail:\n{tail}"
    elif rc != 0 or result is None:
        error = f"exit status {rc}; stderr tail:\n{tail or out[-2500:]}"
    return {
        "result": result,
        "progress": progress,
        "error": error,
        "timed_out": timed_out,
        "seconds": time.perf_counter() - t0,
    }


# -------------------------------------------------------------------------------------------------------- quantize


def _label(method: str, bits, nsamples: int, seqlen: int) -> str:
    return f"{method}-{','.join(map(str, bits))}-{nsamples}x{seqlen}"


def _empty_run(
    method: str, bits, nsamples: int, seqlen: int, anchor_seqlen: int, tiny: bool, cfg: dict, device: str
) -> dict:
    """A run's dict with every key (values None until measured)."""
    return {
        "label": _label(method, bits, nsamples, seqlen),
        "method": method,
        "bits": list(bits),
        "nsamples": nsamples,
        "seqlen": seqlen,
        "tokens": nsamples * seqlen,
        "group_size": 128,
        "tiny": tiny,
        "calib_range": [0.0, cfg["calib"][anchor_seqlen]],
        "started_at_s": None,
        "model": f"random {cfg['shape']}, {BLOCKS} blocks, bf16",
        "model_gib": None,
        "n_blocks": BLOCKS,
        "device": device,
        "device_name": None,
        "torch": None,
        "build_s": None,
        "ok": False,
        "error": None,
        "skipped": None,
        "timed_out": False,
        "wall_s": None,
        "process_s": None,
        "s_per_block": None,
        "steady_s_per_block": None,
        "second_block_s": None,
        "block_s": [],
        "solver_s_per_block": None,
        "stages_s": {},
        "stage_times": {},
        "shares": {},
        "peak_gpu_gib": None,
        "peak_reserved_gib": None,
        "peak_rss_gib": None,
        "anchor_seqlen": anchor_seqlen,
        "anchor_s": ANCHORS[anchor_seqlen],
        "ratio_per_block": None,
        "ratio_steady": None,
        "ratio_second_block": None,
        "meets_half_per_block": None,
        "meets_half_second_block": None,
        "layers": [],
        "partial": False,
        "codes_vs_cpu": None,
        "out": None,
        "instruments": [],
    }


def _fill(run: dict, child: dict) -> None:
    """The run's numbers from its child's result (or, for a killed run, from its progress notes)."""
    run["process_s"] = round(child["seconds"], 2)
    run["error"], run["timed_out"] = child["error"], child["timed_out"]
    r = child["result"]
    if r is None:  # what the child finished before it failed or was killed
        run["block_s"] = [p["seconds"] for p in child["progress"] if p["kind"] == "block"]
        run["layers"] = [
            {k: p[k] for k in ("name", "shape", "seconds", "wall")} for p in child["progress"] if p["kind"] == "layer"
        ]
        run["partial"] = bool(run["block_s"] or run["layers"])
        if len(run["block_s"]) > 1:
            run["second_block_s"] = run["block_s"][1]
        return
    gib = 2.0**30
    n = max(1, len(r["blocks"]) or BLOCKS)
    stages, times = r["stages"], r["times"]
    fixed = sum(stages.get(k, 0.0) for k in ("windows", "open", "capture", "assemble"))
    run.update(
        ok=True,
        device_name=r["device_name"],
        torch=r["torch"],
        wall_s=round(r["wall"], 3),
        s_per_block=r["wall"] / BLOCKS,
        steady_s_per_block=(r["wall"] - fixed) / BLOCKS,
        block_s=r["blocks"],
        second_block_s=r["blocks"][1] if len(r["blocks"]) > 1 else None,
        solver_s_per_block=sum(x["seconds"] for x in r["layers"]) / n,
        stages_s={k: round(v, 4) for k, v in sorted(stages.items())},
        stage_times={k: round(v, 4) if isinstance(v, float) else v for k, v in times.items()},
        peak_gpu_gib=None if r["peak_gpu"] is None else r["peak_gpu"] / gib,
        peak_reserved_gib=None if r["peak_reserved"] is None else r["peak_reserved"] / gib,
        peak_rss_gib=None if r["rss"] is None else r["rss"] / gib,
        layers=r["layers"],
        instruments=r["instruments"],
    )
    in_blocks = sum(r["blocks"])
    if in_blocks > 0 and times:
        shares = {k: times.get(k, 0.0) / in_blocks for k in ("forward", "hessian", "solver", "report")}
        shares["other"] = 1.0 - sum(shares.values())
        run["shares"] = {k: round(v, 4) for k, v in shares.items()}
    a = run["anchor_s"]
    for key, value in (
        ("ratio_per_block", run["s_per_block"]),
        ("ratio_steady", run["steady_s_per_block"]),
        ("ratio_second_block", run["second_block_s"]),
    ):
        run[key] = None if value is None else value / a
    run["meets_half_per_block"] = run["ratio_per_block"] <= GOAL
    run["meets_half_second_block"] = None if run["ratio_second_block"] is None else run["ratio_second_block"] <= GOAL


def _agreement(model: Path, calib: Path, device: str, work: Path, timeout: float) -> dict:
    """{method: codes of a small float32 Llama quantized on `device` against the CPU's} (tests/quantization/
    test_cuda.py's bounds), or {method: error}."""
    opts = {
        "device": device,
        "calib_range": [0.0, 0.02],
        "nsamples": 16,
        "seqlen": 64,
        "group_size": 32,
        "dtype": "float32",
    }
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        child = _child(AGREE_CHILD, [str(model), tmp, str(calib), json.dumps(opts)], timeout)
    if child["result"] is None:
        return {
            m: {"ok": False, "error": child["error"], "device": device, "process_s": child["seconds"]}
            for m in ("gptq", "matgptq")
        }
    return {
        m: {**v, "device_name": child["result"]["device_name"], "process_s": child["seconds"]}
        for m, v in child["result"]["runs"].items()
    }


def _build(cfg: dict, work: Path, tok: Path, device: str) -> tuple[Path, float, float]:
    """The random model of `cfg`'s shape, BLOCKS deep (benchmarks/gpu/_random_llama.py, on `device`), its build seconds
    and GiB."""
    from benchmarks.gpu._random_llama import build, weight_bytes

    t0 = time.perf_counter()
    model = build(
        cfg["shape"], out=work / f"random-{cfg['shape']}-{BLOCKS}l", layers=BLOCKS, tokenizer=tok, device=device
    )  # on the GPU: its random numbers drawn there, in seconds
    build_s, model_gib = time.perf_counter() - t0, weight_bytes(model) / 2.0**30
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()  # this process's cached blocks back to the children
    return model, build_s, model_gib


def measure_quantize(
    work: Path, tiny: bool, budget_s: float | None = None, methods: tuple[str, ...] | None = None
) -> list[dict]:
    """One dict per run of RUNS (module docstring): with `tiny` a small random Llama on the CPU, else the
    Llama-3.1-8B-shaped one on CUDA. Runs start while the `budget_s` seconds (default: 140 full, 45 tiny; the model's
    build and the code agreement included) leave at least a minimum; each gets the rest (at most its method's cap)
    as its timeout. `methods`: only the runs of these (the others are recorded as skipped)."""
    t_start = time.perf_counter()
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    cfg = TINY if tiny else FULL
    budget = cfg["budget_s"] if budget_s is None else budget_s
    device = "cpu" if tiny else "cuda"
    runs = [_empty_run(m, b, cfg["nsamples"], cfg["seqlen"][s], s, tiny, cfg, device) for m, b, s in RUNS]
    tok, calib, why = _inputs(tiny)
    if why is not None:
        for run in runs:
            run["error"] = why
        return runs
    try:
        model, build_s, model_gib = _build(cfg, work, tok, device)
    except Exception as e:  # noqa: BLE001 — recorded, not raised: the check goes on
        for run in runs:
            run["error"] = f"building the model failed: {type(e).__name__}: {e}"[-2500:]
        return runs
    from benchmarks.gpu._random_llama import build

    small = (
        model
        if tiny
        else build(TINY["shape"], out=work / f"random-{TINY['shape']}-{BLOCKS}l", layers=BLOCKS, tokenizer=tok)
    )
    left = lambda: budget - (time.perf_counter() - t_start)  # noqa: E731
    agree = _agreement(small, calib, device, work, min(cfg["agree_cap_s"], max(1.0, left())))
    out_dir = work / QUANT_DIR
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    kept: set[str] = set()
    for run in runs:
        run.update(build_s=round(build_s, 2), model_gib=round(model_gib, 3), codes_vs_cpu=agree.get(run["method"]))
        if methods is not None and run["method"] not in methods:
            run["skipped"] = f"not asked for (methods {', '.join(methods)})"
            continue
        if left() < cfg["min_start_s"]:
            run["skipped"] = f"time budget of {budget:.0f} s spent ({budget - left():.0f} s used)"
            continue
        out = out_dir / run["label"]
        run["started_at_s"] = round(time.perf_counter() - t_start, 2)
        opts = {
            "device": device,
            "calib": str(calib),
            "calib_range": run["calib_range"],
            "method": run["method"],
            "bits": run["bits"],
            "nsamples": run["nsamples"],
            "seqlen": run["seqlen"],
            "group_size": 128,
        }
        timeout = min(left(), cfg["cap_s"][run["method"]])
        _fill(run, _child(QUANT_CHILD, [str(model), str(out), json.dumps(opts)], timeout))
        if run["ok"] and run["method"] not in kept:  # the first of each method stays, for the search's scoring
            kept.add(run["method"])
            run["out"] = str(out)
        else:
            shutil.rmtree(out, ignore_errors=True)
    return runs
