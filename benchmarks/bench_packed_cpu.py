"""Benchmark: prefill and decode tokens/s of packed slices on CPU vs the dense fp32/bf16 model and llama.cpp (issue 14).

One run prints a side-by-side table. Every configuration runs in its own subprocess (so its peak RSS is its own):
dense fp32 and bf16 (the float model from the HF directory), this package's packed bf16 slices (PackedLinear,
Kernel.INT4: runtime/int4_cpu.py) at each --bits width, the bit-stream packed slice (Kernel.BITSTREAM, r bits per
weight), and llama.cpp (llama-cpp-python) on this project's GGUF export (`matgptq export --format gguf --bits r`) of
the same slice. Same prompt token ids, same thread count, greedy decode of --new tokens with a KV cache.
Columns: tokens/s of the prompt (prefill) and of decode, decode ratio to dense bf16, weight bytes (parameters +
buffers; llama.cpp: the GGUF file) and peak RSS of the process.

    python -m benchmarks.bench_packed_cpu --model ~/.cache/matgptq/SmolLM2-135M-Instruct --parent PARENT \\
        [--bits 3,4,8] [--memory-bits 2,3,4,8] [--threads 2] [--prompt-tokens 128] [--new 64]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks._harness import child_env

TEXT = ("Once upon a time, in a small village by the sea, there lived a girl named Lily who loved to collect shells. "
        "Every morning she walked along the shore with her little dog, looking for the most beautiful ones. ") * 20  # fmt: skip


def prompt_ids(model_dir: Path, n: int) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)(TEXT)["input_ids"][:n]


def run_hf(cfg: dict, ids: list[int], new: int) -> dict:
    import matgptq
    from matgptq.runtime.packed import Kernel, PackedLinear, weight_bytes

    dtype = getattr(torch, cfg["dtype"])
    if cfg["kind"] == "dense":
        model = matgptq.load(cfg["model"], dtype=dtype)
    else:
        model = matgptq.load(cfg["parent"], bits=cfg["bits"], dtype=dtype, packed=True)
        if cfg.get("kernel") == "bitstream":  # re-pack every layer on the bit stream
            for name, q in model.matgptq.layers.items():
                m = model.get_submodule(name)
                model.set_submodule(name, PackedLinear(q.slice(m.bits), m.bias, dtype, Kernel.BITSTREAM))
    x = torch.tensor([ids])
    with torch.inference_mode():
        model(x[:, :8])  # warm-up
        t0 = time.perf_counter()
        out = model(x, use_cache=True)
        prefill = time.perf_counter() - t0
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        t0 = time.perf_counter()
        for _ in range(new):
            out = model(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        decode = time.perf_counter() - t0
    return {"prefill": len(ids) / prefill, "decode": new / decode, "bytes": weight_bytes(model)}


def run_llamacpp(cfg: dict, ids: list[int], new: int, threads: int) -> dict:
    from llama_cpp import Llama

    n_ctx = len(ids) + new + 8  # n_batch = n_ctx: llama-cpp-python keeps n_batch rows of scores
    llm = Llama(model_path=cfg["gguf"], n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads,
                n_threads_batch=threads, verbose=False)  # fmt: skip
    llm.eval(ids[:8])
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(new):
        tok = int(llm.scores[llm.n_tokens - 1].argmax())
        llm.eval([tok])
    decode = time.perf_counter() - t0
    return {"prefill": len(ids) / prefill, "decode": new / decode, "bytes": os.path.getsize(cfg["gguf"])}


def child(cfg: dict) -> None:
    torch.set_num_threads(cfg["threads"])
    if cfg["kind"] == "llama.cpp":
        res = run_llamacpp(cfg, cfg["ids"], cfg["new"], cfg["threads"])
    else:
        res = run_hf(cfg, cfg["ids"], cfg["new"])
    res["rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("RESULT " + json.dumps(res))


def spawn(cfg: dict) -> dict:
    env = child_env(cfg["threads"])
    cmd = [sys.executable, "-m", "benchmarks.bench_packed_cpu", "--child", json.dumps(cfg)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        print(f"{cfg['label']}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
        return {}
    return json.loads(lines[-1][7:])


def export_gguf(parent: str, bits: int, out: Path) -> Path:
    if not out.exists():
        subprocess.run([sys.executable, "-m", "matgptq", "export", parent, "--format", "gguf", "--bits", str(bits),
                        "--out", str(out)], check=True, capture_output=True)  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="the float HF model directory the parent was quantized from")
    ap.add_argument("--parent", help="matgptq parent (quantize --method matgptq)")
    ap.add_argument("--bits", default="3,4,8", help="widths to time (comma-separated)")
    ap.add_argument("--memory-bits", default="2", help="extra widths to measure memory/speed for (no llama.cpp)")
    ap.add_argument("--mix", action="store_true", help="also a mix: 3 bits, mlp.down_proj at 4")
    ap.add_argument("--threads", type=int, default=2, help="threads for torch and llama.cpp alike")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="prompt length (prefill)")
    ap.add_argument("--new", type=int, default=64, help="greedy decode steps")
    ap.add_argument("--gguf-dir", default=None, help="where GGUF exports are cached (default: a temp dir)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    if not args.model or not args.parent:
        ap.error("give --model and --parent")
    from matgptq.execution import format_table

    ids = prompt_ids(Path(args.model), args.prompt_tokens)
    base = {"model": args.model, "parent": args.parent, "ids": ids, "new": args.new, "threads": args.threads}
    bits = [int(b) for b in args.bits.split(",")]
    extra = [int(b) for b in args.memory_bits.split(",") if b] if args.memory_bits else []
    cfgs = [dict(base, kind="dense", dtype="float32", label="dense fp32"),
            dict(base, kind="dense", dtype="bfloat16", label="dense bf16")]  # fmt: skip
    for r in sorted(set(bits) | set(extra)):
        cfgs.append(dict(base, kind="packed", dtype="bfloat16", bits=r, label=f"packed {r}-bit (int4 kernel)"))
    if args.mix:
        from matgptq.runtime import open_checkpoint

        names = open_checkpoint(args.parent).layers
        mix = {n: 4 if n.endswith("mlp.down_proj") else 3 for n in names}
        cfgs.append(dict(base, kind="packed", dtype="bfloat16", bits=mix, label="packed mix 3/4 (down_proj 4)"))
    for r in bits:
        if r <= 4:
            cfgs.append(dict(base, kind="packed", dtype="bfloat16", bits=r, kernel="bitstream",
                             label=f"packed {r}-bit (bit stream)"))  # fmt: skip
    gguf_dir = Path(args.gguf_dir or tempfile.mkdtemp(prefix="bench_packed_"))
    gguf_dir.mkdir(parents=True, exist_ok=True)
    for r in bits:
        path = export_gguf(args.parent, r, gguf_dir / f"slice{r}.gguf")
        cfgs.append(dict(base, kind="llama.cpp", gguf=str(path), label=f"llama.cpp {r}-bit GGUF"))
    rows, results = [], []
    for cfg in cfgs:
        print(f"running {cfg['label']} …", file=sys.stderr, flush=True)
        results.append((cfg["label"], spawn(cfg)))
    ref = next((r["decode"] for label, r in results if label == "dense bf16" and r), None)
    for label, r in results:
        if not r:
            rows.append([label, "failed", "", "", "", ""])
            continue
        ratio = f"{r['decode'] / ref:.2f}x" if ref else "n/a"
        rows.append([label, f"{r['prefill']:.1f}", f"{r['decode']:.1f}", ratio, f"{r['bytes'] / 2**20:.1f}",
                     f"{r['rss'] / 2**20:.0f}"])  # fmt: skip
    print(f"prompt {len(ids)} tokens, {args.new} decode steps, {args.threads} threads, torch {torch.__version__}")
    print(format_table(["config", "prefill tok/s", "decode tok/s", "decode / dense bf16", "weights MiB",
                        "peak RSS MiB"], rows))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
