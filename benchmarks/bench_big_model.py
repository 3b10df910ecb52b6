"""Benchmark (not a test): quantize a random-initialised Llama of ~1B parameters (Llama-3.2-1B's shape, bf16 shards
on disk, benchmarks/random_llama.py) with a small calibration set, streamed (the default: one block in memory) and
loaded whole (--no-stream), each in its own process; prints time per block and peak RSS next to the model's size.

Expected streamed peak ≈ interpreter and libraries (measured: a 2-block model's run, --layers 2) + embeddings and
lm_head + one block + calibration activations + one output shard being assembled; whole ≈ that + every block.
Child processes run with MALLOC_MMAP_THRESHOLD_=131072 (large buffers go back to the OS when freed; without it
glibc's heap fragments and the peak drifts up with the number of blocks: tests/models/test_lazy.py) unless
--default-malloc.

    python -m benchmarks.bench_big_model [--layers 16] [--nsamples 8] [--seqlen 128] [--threads 1] [--modes stream,whole]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks._harness import child_env, last_error, run_measured
from benchmarks.random_llama import SHAPES, build, weight_bytes

ROOT = Path(__file__).resolve().parents[1]
CALIB = ROOT.parent / "shared" / "data" / "tinystories" / "tinystories_val_head.txt"


def run(model: Path, out: Path, stream: bool, a) -> dict:
    cmd = [sys.executable, "-m", "matgptq", "quantize", str(model), "--out", str(out), "--calib", str(CALIB),
           "--method", "gptq", "--bits", "4", "--group-size", "128", "--nsamples", str(a.nsamples), "--seqlen",
           str(a.seqlen), "--quiet", *([] if stream else ["--no-stream"])]  # fmt: skip
    env = child_env(a.threads, **({} if a.default_malloc else {"MALLOC_MMAP_THRESHOLD_": "131072"}))
    log = out.with_suffix(".log")
    usage = run_measured(cmd, env, log)  # the child's own peak RSS (the harness's launcher)
    if not usage["ok"]:
        raise SystemExit(f"quantize failed: {last_error(log)}")
    report = json.loads((out / "matgptq.json").read_text())["report"]
    return {"wall": usage["wall"], "cpu": usage["cpu"], "rss": usage["rss_gb"] * 2**30,
            "solver": sum(r["seconds"] for r in report)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16, help="decoder blocks (16 = the real Llama-3.2-1B)")
    ap.add_argument("--nsamples", type=int, default=8, help="calibration windows")
    ap.add_argument("--seqlen", type=int, default=128, help="tokens per calibration window")
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the quantization")
    ap.add_argument("--modes", default="stream,whole", help="stream (default path), whole (--no-stream)")
    ap.add_argument("--default-malloc", action="store_true", help="leave glibc's sliding mmap threshold on")
    a = ap.parse_args()
    shape = SHAPES["llama-3.2-1b"]
    model = build("llama-3.2-1b", layers=None if a.layers == shape["num_hidden_layers"] else a.layers)
    small = build("llama-3.2-1b", layers=2)  # baseline: the same run with 2 blocks
    h, f, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    q, kv = shape["num_attention_heads"] * shape["head_dim"], shape["num_key_value_heads"] * shape["head_dim"]
    block = 2 * (2 * h * q + 2 * h * kv + 3 * h * f + 2 * h)  # bf16 bytes
    embed = 2 * v * h
    acts = a.nsamples * a.seqlen * h * 2 * 4  # block inputs and outputs, bf16, with headroom ×2
    total = weight_bytes(model)
    print(f"model: {a.layers} blocks, {total / 2**30:.2f} GiB bf16 ({total / 2 / 1e9:.2f} B parameters); "
          f"embeddings {embed / 2**20:.0f} MiB (lm_head tied), one block {block / 2**20:.0f} MiB; "
          f"calibration {a.nsamples} x {a.seqlen} tokens; threads {a.threads}; load {os.getloadavg()[0]:.2f}")
    rows = []
    with tempfile.TemporaryDirectory(dir=Path.home() / ".cache" / "matgptq") as work:
        base = run(small, Path(work) / "base", True, a)
        print(f"2-block streamed baseline: peak RSS {base['rss'] / 2**30:.2f} GiB, wall {base['wall']:.0f} s")
        for mode in a.modes.split(","):
            r = run(model, Path(work) / mode, mode == "stream", a)
            rows.append((mode, r))
    print()
    print("| mode   | wall s | s/block | solver s/block | CPU s | peak RSS GiB | RSS / model | RSS − 2-block run GiB |")
    print("|--------|--------|---------|----------------|-------|--------------|-------------|-----------------------|")
    for mode, r in rows:
        print(f"| {mode:6} | {r['wall']:6.0f} | {r['wall'] / a.layers:7.1f} | {r['solver'] / a.layers:14.1f} | "
              f"{r['cpu']:5.0f} | {r['rss'] / 2**30:12.2f} | {r['rss'] / total:11.2f} | "
              f"{(r['rss'] - base['rss']) / 2**30:21.2f} |")
    print(f"\n(model {total / 2**30:.2f} GiB; embeddings + one block + activations = "
          f"{(embed + block + acts) / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
