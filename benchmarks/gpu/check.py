"""`make gpu-check`: everything the project does on a GPU, measured in one run of a few minutes (issue #46).

On a CUDA machine (python3 with PYTHONPATH=src; nothing installed, nothing fetched) it runs, in this order, each
part on its own so that one failing part is recorded and the rest still measure:

  kernels   nested GEMV/GEMM vs fp16 torch.matmul and torch's int4 kernel (benchmarks/gpu/_kernels.py)
  decode    tokens/s of a Llama-3.1-8B-shaped model, fp16 vs nested layers (benchmarks/gpu/_decode.py)
  quantize  GPU quantize seconds and peak memory per 8B-shaped block, GPTQ and MatGPTQ (benchmarks/gpu/_quantize.py)
  search    the search's scoring tokens/s (benchmarks/gpu/_search.py)
  tests     the CUDA tests and the kernel tests compiled on the GPU (pytest, TRITON_INTERPRET=0)
  search_run  `matgptq search` itself on the quantize part's parent, issue #44's eight budgets under --time-limit

and writes docs/results/gpu.json (after every part, so a run cut short keeps what it measured; also copied to --out)
and its page docs/results/gpu.md (benchmarks/gpu/_report.py). Without CUDA it runs the same code on tiny shapes
(kernels in Triton's interpreter), writes nothing under docs/, prints `unmeasured: no CUDA device` and exits 0.

    python3 -m benchmarks.gpu.check [--parts kernels,decode,tests,quantize,search] [--methods gptq,matgptq]
                                    [--out DIR] [--prepare]

--prepare (on the machine with ../shared) fills .gpu-carry/ (gitignored) with what the GPU machine lacks: the test
fixtures of ../shared the CUDA tests read, a tokenizer and calibration text; `make gpu-check` there reads it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from benchmarks._harness import write_atomic

STARTED = time.perf_counter()  # the check's clock (CHECK_S)
CUDA = torch.cuda.is_available()
os.environ["TRITON_INTERPRET"] = "0" if CUDA else "1"  # before anything imports triton (kernels/triton_nested.py)

ROOT = Path(__file__).resolve().parents[2]
CARRY = ROOT / ".gpu-carry"
SHARED = ROOT.parent / "shared"
SHARED_FILES = ("data/tinystories/tinystories_val_head.txt", "models/stories260K")
RESULT = ROOT / "docs" / "results" / "gpu.json"
PARTS = ("kernels", "decode", "quantize", "search", "tests", "search_run")
TESTS = [
    "tests/kernels",
    "tests/runtime/test_nested.py",
    "tests/quantization/test_cuda.py",
    "tests/allocation/test_cuda.py",
    "tests/execution/test_devices.py",
]
TESTS_TIMEOUT_S, QUANTIZE_BUDGET_S, SEARCH_TIMEOUT_S, SEARCH_RUN_TIMEOUT_S = 150, 170, 90, 120
# issue #46: the whole check in at most 8 minutes. The parts before search_run took 367 s on an H200 (2026-12-04), so
# search_run, last, gets what is left of CHECK_S (at most SEARCH_RUN_TIMEOUT_S, at least MIN_SEARCH_RUN_S), and its
# --time-limit is that less STARTUP_S, a margin for the process's start (imports, reading the parent)
CHECK_S, MIN_SEARCH_RUN_S, STARTUP_S = 470.0, 45.0, 15.0
TINY_SEARCH_RUN_TIMEOUT_S = 600.0  # a hang guard: 300 s timed out at load 8 on 2 cores (#101)


def prepare() -> None:
    """Copy what the GPU machine lacks into .gpu-carry/ (module doc)."""
    from benchmarks.gpu import _quantize

    for rel in SHARED_FILES:
        src, dst = SHARED / rel, CARRY / "shared" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dst)
    _quantize.prepare_carry(CARRY)
    size = sum(p.stat().st_size for p in CARRY.rglob("*") if p.is_file())
    print(f"{CARRY}: {size / 2**20:.1f} MiB; carry it: run(carry=['.gpu-carry'])")


def run_tests(out: Path | None) -> dict:
    env = {
        **os.environ,
        "TRITON_INTERPRET": "0",
        "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT),
        "MATGPTQ_SHARED": str(CARRY / "shared"),
    }
    t0 = time.perf_counter()
    workers = ["-n", "8"] if importlib.util.find_spec("xdist") else []  # compiling kernels dominates: in parallel
    try:
        cmd = [sys.executable, "-m", "pytest", *TESTS, *workers, "-q", "-p", "no:cacheprovider", "-rfE"]
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TESTS_TIMEOUT_S)
        log, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as e:
        text = [b.decode(errors="replace") if isinstance(b, bytes) else b or "" for b in (e.stdout, e.stderr)]
        log, code = "".join(text) + f"\ntimed out after {TESTS_TIMEOUT_S} s", None
    if out:
        (out / "gpu_tests.log").write_text(log)
    lines = log.splitlines()
    summary = next((line.strip("= ") for line in reversed(lines) if re.search(r"\d+ (passed|failed|error)", line)), "")
    return {
        "returncode": code,
        "summary": summary,
        "seconds": time.perf_counter() - t0,
        "failures": [line for line in lines if line.startswith(("FAILED", "ERROR"))],
    }


def adopt_tiles(kernels: dict) -> dict:
    """Make the kernels part's fastest launch parameters (batch 1 → GEMV, batch 16 → GEMM) the defaults of this
    process, so that the decode part runs what was measured; returns what was adopted."""
    from matgptq.kernels import triton_nested as tn

    adopted = {}
    for batch, kern in (("1", tn.NestedKernel.GEMV), ("16", tn.NestedKernel.GEMM)):
        chosen = dict(kernels.get("sweep", {}).get(batch, {}).get("chosen") or {})
        if chosen.pop("kernel", None) == kern.value:
            tn.DEFAULT_TILES[kern] = tn.Tiles(**chosen)
            adopted[kern.value] = chosen
    return adopted


def run_part(name: str, work: Path, out: Path | None, results: dict, methods: tuple[str, ...] | None = None) -> dict:
    tiny = not CUDA
    if name == "kernels":
        from benchmarks.gpu import _kernels

        return _kernels.measure(tiny)
    if name == "decode":
        from benchmarks.gpu import _decode

        tiles = adopt_tiles(results.get("kernels", {}))
        return {**_decode.measure(tiny), "tiles": tiles}
    if name == "tests":
        return run_tests(out) if CUDA else {"skipped": "make test runs these in the interpreter"}
    if name == "quantize":
        from benchmarks.gpu import _quantize

        return {"runs": _quantize.measure_quantize(work, tiny, None if tiny else QUANTIZE_BUDGET_S, methods)}
    from benchmarks.gpu import _search

    parent = next(
        (
            Path(r["out"])
            for r in results.get("quantize", {}).get("runs", [])
            if r.get("method") == "matgptq" and r.get("ok") and r.get("out")
        ),
        None,
    )
    if name == "search_run":
        if tiny:  # a hang guard only (_quantize.TINY's comment)
            return _search.measure_search_run(work, parent, tiny, TINY_SEARCH_RUN_TIMEOUT_S)
        left = min(SEARCH_RUN_TIMEOUT_S, max(MIN_SEARCH_RUN_S, CHECK_S - (time.perf_counter() - STARTED)))
        return _search.measure_search_run(work, parent, tiny, left, (left - STARTUP_S) / 60)
    return _search.measure_search_scoring(work, parent, tiny, None if tiny else SEARCH_TIMEOUT_S)


def triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def header() -> dict:
    import transformers

    return {
        "device": torch.cuda.get_device_name() if CUDA else "cpu",
        "torch": torch.__version__,
        "triton": triton_version(),
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def save(results: dict, out: Path | None) -> None:
    """gpu.json and gpu.md under docs/results/ (on a GPU only) and in `out`, each written whole (temp, then rename)."""
    from benchmarks.gpu import _report

    files = {"gpu.json": json.dumps(results, indent=1, default=str) + "\n", "gpu.md": _report.page(results)}
    for folder in ([out] if out else []) + ([RESULT.parent] if CUDA else []):
        for name, text in files.items():
            write_atomic(folder / name, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--out", type=Path, help="also copy gpu.json and the logs here (the device tool's $OUT)")
    ap.add_argument(
        "--work",
        type=Path,
        help="scratch folder for models (default: /tmp/matgptq-gpu-check on a GPU, "
        "where a later call's parts reuse it; a fresh temporary one, removed after, for the CPU dry run)",
    )
    ap.add_argument("--prepare", action="store_true", help="fill .gpu-carry/ from ../shared and exit")
    ap.add_argument("--methods", help="quantize part: only these methods, comma-separated (default: gptq,matgptq)")
    a = ap.parse_args(argv)
    if a.prepare:
        prepare()
        return 0
    parts = [p for p in a.parts.split(",") if p]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        print(f"gpu_check: unknown part {bad[0]}; use some of {', '.join(PARTS)}", file=sys.stderr)
        return 2
    methods = tuple(a.methods.split(",")) if a.methods else None
    if methods and not set(methods) <= {"gptq", "matgptq"}:
        print(f"gpu_check: unknown method in --methods {a.methods}; use gptq, matgptq or both", file=sys.stderr)
        return 2
    if triton_version() is None:
        print(
            "unmeasured: no Triton, so neither the GPU nor its interpreter can run the kernels; "
            "pip install 'matgptq[kernels]'" + ("" if CUDA else " (and no CUDA device)")
        )
        return 0 if not CUDA else 1
    if a.work is None and not CUDA:  # the dry run reads nothing an earlier run left (#101)
        with tempfile.TemporaryDirectory(prefix="matgptq-gpu-check-") as work:
            return check(parts, Path(work), a.out, methods)
    return check(parts, a.work or Path("/tmp/matgptq-gpu-check"), a.out, methods)


def check(parts: list[str], work: Path, out: Path | None, methods: tuple[str, ...] | None) -> int:
    """Run `parts` in order, each recorded on its own (module docstring); 0 when none failed."""
    work.mkdir(parents=True, exist_ok=True)
    if out:
        out.mkdir(parents=True, exist_ok=True)
    results = {**header(), "parts": {}}
    for name in parts:
        t0 = time.perf_counter()
        print(f"gpu_check: {name} ...", flush=True)
        try:
            results[name] = run_part(name, work, out, results, methods)
        except Exception as e:  # noqa: BLE001 - one part failing is recorded; the others still measure
            results[name] = {"error": f"{type(e).__name__}: {e}"[:2000], "traceback": traceback.format_exc()[-4000:]}
            print(results[name]["traceback"], file=sys.stderr, flush=True)
        results["parts"][name] = round(time.perf_counter() - t0, 1)
        print(f"gpu_check: {name} done in {results['parts'][name]} s", flush=True)
        save(results, out)
    from benchmarks.gpu import _report

    print(_report.page(results))
    failed = [n for n in parts if results[n].get("error")]
    if failed:
        print(f"gpu_check: {', '.join(failed)} failed (their tracebacks are in gpu.json)", file=sys.stderr)
    if not CUDA:
        print("unmeasured: no CUDA device (the same code ran on tiny shapes in Triton's interpreter)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
