"""Benchmark (not a test): quantize a random-initialised Llama-3.1-8B-shaped model (bf16 shards on disk,
scripts/random_llama.py: 16 GB, 32 blocks) on a CUDA GPU with `--device cuda`, the model streamed block by block;
prints time per block, peak GPU memory (torch.cuda.max_memory_allocated) and peak host RSS next to the model's
size. Without CUDA it says so and measures nothing (exit 0).

    python scripts/bench_gpu.py [--layers 32] [--method gptq] [--bits 4] [--nsamples 128] [--seqlen 2048]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from random_llama import SHAPES, build, weight_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CALIB = ROOT.parent / "shared" / "data" / "wikitext-2-raw" / "wiki.test.joined.txt"
CHILD = """
import json, re, sys, time, torch
import matgptq
model, out, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
t0 = time.perf_counter()
_, reports = matgptq.quantize(model, out, device="cuda", progress=False, **opts)
torch.cuda.synchronize()
print(json.dumps({"wall": time.perf_counter() - t0, "gpu": torch.cuda.max_memory_allocated(),
                  "rss": int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024,
                  "solver": sum(r.seconds for r in reports), "device": torch.cuda.get_device_name()}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32, help="decoder blocks (32 = the real Llama-3.1-8B)")
    ap.add_argument("--method", default="gptq", help="gptq or matgptq")
    ap.add_argument("--bits", default="4", help="width(s), e.g. 4 or 3,4,8")
    ap.add_argument("--nsamples", type=int, default=128, help="calibration windows")
    ap.add_argument("--seqlen", type=int, default=2048, help="tokens per window")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print(f"unmeasured: torch {torch.__version__} finds no CUDA device on this machine; this benchmark runs only "
              "on a GPU (it would build a 16 GB Llama-3.1-8B-shaped model and quantize it with --device cuda)")
        return
    full = SHAPES["llama-3.1-8b"]["num_hidden_layers"]
    model = build("llama-3.1-8b", layers=None if a.layers == full else a.layers)
    total = weight_bytes(model)
    opts = {"calib": str(CALIB), "calib_range": [0.5, 1.0], "method": a.method,
            "bits": [int(b) for b in a.bits.split(",")], "nsamples": a.nsamples, "seqlen": a.seqlen, "group_size": 128}
    with tempfile.TemporaryDirectory(dir=model.parent) as work:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "MALLOC_MMAP_THRESHOLD_": "131072"}
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", CHILD, str(model), str(Path(work) / "out"), json.dumps(opts)],
                              env=env, capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"quantize failed: {done.stderr[-3000:]}")
        r = json.loads(done.stdout.strip().splitlines()[-1])
        r["process"] = time.perf_counter() - t0
    print(f"{r['device']}: {a.layers}-block Llama-3.1-8B shape, {total / 2**30:.1f} GiB bf16; {a.method} {a.bits}-bit "
          f"g128, {a.nsamples} x {a.seqlen} calibration tokens")
    print("| wall s (quantize) | s/block | solver s/block | peak GPU GiB | GPU / model | peak RSS GiB | RSS / model |")
    print("|-------------------|---------|----------------|--------------|-------------|--------------|-------------|")
    print(f"| {r['wall']:.0f} | {r['wall'] / a.layers:.1f} | {r['solver'] / a.layers:.1f} | {r['gpu'] / 2**30:.2f} | "
          f"{r['gpu'] / total:.2f} | {r['rss'] / 2**30:.2f} | {r['rss'] / total:.2f} |")


if __name__ == "__main__":
    main()
