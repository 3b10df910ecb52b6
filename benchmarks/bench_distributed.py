"""Benchmark (not a test): end-to-end quantization of SmolLM2-135M-Instruct (`make real-model`) with 1 and 2
processes on this machine, side by side in one run (issue #13 item 5).

Runs, each a fresh child: one process with 1 thread, one process with --threads threads (the same cores as the
two-process run), and `torchrun --standalone --nproc-per-node 2 -m matgptq quantize` with 1 thread per process
(gloo; windows split across ranks, Hessians all-reduced, each group's Linears spread over the ranks). Printed: wall
and CPU time (children's user+sys, os.wait4 — for torchrun the launcher's waited-for children), the speed-up over
1 process × 1 thread, and how many code tensors of the 2-process checkpoint equal the 1-process one bit for bit
(they may differ by float summation order: execution/distributed.py).

    python -m benchmarks.bench_distributed [MODEL_DIR] [--method gptq] [--bits 4] [--nsamples 32] [--seqlen 256]

--search PARENT times `matgptq search PARENT` instead (1 process x 1 thread vs torchrun x 2: the sensitivity table's
and every stage's scorings dealt across the ranks, allocation/spread.py) and checks that both runs chose the same mix.

    python -m benchmarks.bench_distributed --search PARENT [--search-args "--budget 3.0 --generations 4"]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from benchmarks._harness import child_env, last_error, run_measured

ROOT = Path(__file__).resolve().parents[1]
MODEL = Path.home() / ".cache" / "matgptq" / "SmolLM2-135M-Instruct"
CALIB = ROOT.parent / "shared" / "data" / "wikitext-2-raw" / "wiki.test.joined.txt"  # second half: as `make real-model`


def run(cmd: list[str], threads: int) -> dict:
    """Wall and CPU seconds of `cmd` (every process it starts included) with `threads` threads each."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "run.log"
        usage = run_measured(cmd, child_env(threads), log)
        if not usage["ok"]:
            raise SystemExit(f"{' '.join(cmd[:6])}… failed: {last_error(log)}")
    return {"wall": usage["wall"], "cpu": usage["cpu"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", type=Path, default=MODEL, help="HF model directory (default SmolLM2-135M)")
    ap.add_argument("--calib", type=Path, default=CALIB, help="calibration text")
    ap.add_argument("--method", default="gptq", help="gptq or matgptq")
    ap.add_argument("--bits", default="4", help="width(s)")
    ap.add_argument("--nsamples", type=int, default=32, help="calibration windows (split across processes)")
    ap.add_argument("--seqlen", type=int, default=256, help="tokens per window")
    ap.add_argument("--threads", type=int, default=2, help="threads of the one-process comparison run")
    ap.add_argument("--skip-threads", action="store_true", help="leave out the 1 process x --threads run")
    ap.add_argument("--search", type=Path, help="time `matgptq search` on this parent instead of quantization")
    ap.add_argument("--search-args",
                    default="--budget 3.0 --generations 4 --sensitivity probe --sensitivity-tokens 2048",
                    help="search options besides parent, --calib and --out")  # fmt: skip
    a = ap.parse_args()
    if a.search:
        return bench_search(a)
    if not a.model.is_dir():
        raise SystemExit(f"{a.model} is missing: run `make real-model` first")
    import torch
    from safetensors.torch import load_file

    args = ["--calib", str(a.calib), "--calib-range", "0.5:1", "--method", a.method, "--bits", a.bits, "--group-size",
            "64", "--nsamples", str(a.nsamples), "--seqlen", str(a.seqlen), "--quiet"]  # fmt: skip
    print(f"{a.model.name}: {a.method} {a.bits}-bit g64, {a.nsamples} x {a.seqlen} tokens; cores {os.cpu_count()}, "
          f"load {os.getloadavg()[0]:.2f} (shared machine: compare within this run only)")
    rows = {}
    with tempfile.TemporaryDirectory() as work:
        out = {k: Path(work) / k for k in ("p1t1", "p1tN", "p2t1")}
        single = [sys.executable, "-m", "matgptq", "quantize", str(a.model)]
        rows["1 process x 1 thread"] = run([*single, "--out", str(out["p1t1"]), *args], 1)
        if not a.skip_threads:
            rows[f"1 process x {a.threads} threads"] = run([*single, "--out", str(out["p1tN"]), *args], a.threads)
        two = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "matgptq",
               "quantize", str(a.model), "--out", str(out["p2t1"]), *args]  # fmt: skip
        rows["2 processes x 1 thread (gloo)"] = run(two, 1)
        x, y = load_file(str(out["p1t1"] / "model.safetensors")), load_file(str(out["p2t1"] / "model.safetensors"))
        codes = [k for k in x if k.endswith(".codes")]
        same = sum(int((x[k] == y[k]).sum()) for k in codes) / sum(x[k].numel() for k in codes)
        equal = sum(torch.equal(x[k], y[k]) for k in codes)
    table(rows)
    print(f"\n2 processes vs 1: {equal} of {len(codes)} code tensors bit-identical, {same:.4%} of packed code bytes equal")


def table(rows: dict) -> None:
    base = rows["1 process x 1 thread"]["wall"]
    print("\n| run | wall s | CPU s | speed-up (wall) |")
    print("|-----|--------|-------|-----------------|")
    for name, r in rows.items():
        print(f"| {name} | {r['wall']:.1f} | {r['cpu']:.1f} | {base / r['wall']:.2f}x |")


def bench_search(a) -> None:
    import json

    args = ["--calib", str(a.calib), "--calib-range", "0.5:1", *a.search_args.split(), "--quiet"]
    print(f"search {a.search} {a.search_args}; cores {os.cpu_count()}, load {os.getloadavg()[0]:.2f} (shared "
          "machine: compare within this run only)")  # fmt: skip
    rows = {}
    with tempfile.TemporaryDirectory() as work:
        one, two = Path(work) / "one", Path(work) / "two"
        rows["1 process x 1 thread"] = run([sys.executable, "-m", "matgptq", "search", str(a.search), "--out", str(one),
                                            *args], 1)  # fmt: skip
        rows["2 processes x 1 thread (gloo)"] = run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                     "--nproc-per-node", "2", "-m", "matgptq", "search", str(a.search),
                                                     "--out", str(two), *args], 1)  # fmt: skip
        mixes = sorted(p.name for p in one.glob("mix-*.json"))
        same = [json.loads((one / m).read_text())["bits"] == json.loads((two / m).read_text())["bits"] for m in mixes]
    table(rows)
    print(f"\n2 processes vs 1: {sum(same)} of {len(mixes)} mixes identical")


if __name__ == "__main__":
    main()
