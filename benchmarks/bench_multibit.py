"""Benchmark: MatGPTQ's fast exact code search vs the 2^c brute force (Algorithm 1), and MatGPTQ vs GPTQ per layer.

Prints, in one run: seconds per call of both searches on the same weights (and checks the codes are identical), then
the wall time of quantizing the same layer (weight, Hessian) with single-width GPTQ at 4 and 8 bits and with each
MatGPTQ variant (c = 8, R = {3,4,8}; per-width-scales includes its least-squares refit of widths 3 and 4), and the ratios
to GPTQ at the master width. With --model, also end to end: `matgptq quantize` of that HF model with GPTQ at 8 bits
and with the default MatGPTQ {3,4,8} parent (Table 1's settings: g128, 64 × 512 WikiText-2 tokens from the second
half, seed 0), each in its own process. Goals: search ≥ 8× faster than brute force; the default variant ≤ 1.5× GPTQ-8
per layer and end to end (issue 11).

    python -m benchmarks.bench_multibit [--rows 4096] [--cols 4096] [--threads 2] [--model ~/.cache/matgptq/SmolLM2-135M-Instruct]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks._harness import child_env, last_error, run_measured
from matgptq.execution import format_table
from matgptq.quantization.grid import NearestRounding, minmax_params
from matgptq.formats import QuantizedWeight
from matgptq.quantization.multibit import MatryoshkaRounding, PerWidthRounding, brute_force_codes
from matgptq.quantization.layer import with_width_scales
from matgptq.quantization.solver import gptq_quantize


WIKI = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2-raw" / "wiki.test.raw"


def end_to_end(model: str, threads: int) -> list[list]:
    """Wall seconds of `matgptq quantize MODEL` for GPTQ-8 and the default MatGPTQ parent, one process each."""
    runs = [("GPTQ 8-bit (master width)", ["--method", "gptq", "--bits", "8"]),
            ("MatGPTQ {3,4,8} (default variant)", ["--method", "matgptq", "--bits", "3,4,8"])]  # fmt: skip
    times = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in runs:
            cmd = [sys.executable, "-m", "matgptq", "quantize", model, "--out", str(Path(tmp) / "out"), *flags,
                   "--group-size", "128", "--calib", str(WIKI), "--calib-range", "0.5:1", "--nsamples", "64",
                   "--seqlen", "512", "--seed", "0", "--overwrite", "--quiet"]  # fmt: skip
            usage = run_measured(cmd, child_env(threads), Path(tmp) / "run.log")
            if not usage["ok"]:
                raise SystemExit(f"bench_multibit: error: {name} failed ({last_error(Path(tmp) / 'run.log')})")
            times[name] = usage["wall"]
    base = times[runs[0][0]]
    return [[name, Path(model).name, t, t / base] for name, t in times.items()]


def timed(fn, repeat: int = 3) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def layer_problem(rows: int, cols: int, seed: int = 0):
    """Random weight and a Hessian from 2048 random activations with a few large-magnitude outlier channels."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=gen) * 0.02
    x = torch.randn(2048, cols, generator=gen)
    x[:, torch.randperm(cols, generator=gen)[:8]] *= 25
    return w, 2 * x.T @ x / x.shape[0], x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=4096, help="output features of the test layer")
    ap.add_argument("--cols", type=int, default=4096, help="input features of the test layer")
    ap.add_argument("--group-size", type=int, default=128, help="columns per scale group of the per-layer runs")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads (and OMP of --model)")
    ap.add_argument("--model", help="also time `matgptq quantize` of this HF model directory end to end")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    widths, lambdas = (3, 4, 8), (1.0, 1.0, 1.0)
    rounding = MatryoshkaRounding(8, widths, lambdas)

    w, h, x = layer_problem(args.rows, args.cols)
    scale, zero = minmax_params(w[:, :128], 8, sym=True)
    col = w[:, 0]
    t_fast, fast = timed(lambda: rounding.codes(col, scale, zero), 20)
    t_brute, brute = timed(lambda: brute_force_codes(col, scale, zero, 8, widths, lambdas))
    assert torch.equal(fast, brute), "fast search disagrees with brute force"
    block = w[:, :128]
    s2, z2 = scale.unsqueeze(1), zero.unsqueeze(1)
    t_fast_b, fast_b = timed(lambda: rounding.codes(block, s2, z2))
    t_brute_b, brute_b = timed(lambda: brute_force_codes(block, s2, z2, 8, widths, lambdas), 1)
    assert torch.equal(fast_b, brute_b)
    print(format_table(
        ["code search (c=8, R={3,4,8})", "weights", "fast s", "brute force s", "speed-up"],
        [["one column", col.numel(), t_fast, t_brute, t_brute / t_fast],
         ["128 columns", block.numel(), t_fast_b, t_brute_b, t_brute_b / t_fast_b]],
    ))  # fmt: skip

    def matgptq(rnd, refit: bool):
        res = gptq_quantize(w, h, rnd, group_size=args.group_size, sym=True)
        if refit:
            with_width_scales(QuantizedWeight(res.codes, res.scales, res.zeros, res.g_idx, 8), w, h, res.damp, (3, 4))
        return res

    per_width = PerWidthRounding(8, widths, lambdas)
    runs = [("GPTQ 4-bit", lambda: gptq_quantize(w, h, NearestRounding(4), group_size=args.group_size, sym=True)),
            ("GPTQ 8-bit (master width)", lambda: gptq_quantize(w, h, NearestRounding(8), group_size=args.group_size)),
            ("MatGPTQ paper", lambda: matgptq(rounding, False)),
            ("MatGPTQ per-width", lambda: matgptq(per_width, False)),
            ("MatGPTQ per-width-scales (default)", lambda: matgptq(per_width, True))]  # fmt: skip
    times = {name: timed(fn, 2)[0] for name, fn in runs}
    base = times["GPTQ 8-bit (master width)"]
    rows = [[name, f"{args.rows}x{args.cols}", t, t / base] for name, t in times.items()]
    print()
    print(format_table(["per-layer quantization", "shape", "seconds", "/ GPTQ 8-bit"], rows))
    if args.model:
        print()
        print(format_table(["end-to-end quantization", "model", "seconds", "/ GPTQ 8-bit"],
                           end_to_end(args.model, args.threads)))  # fmt: skip

if __name__ == "__main__":
    main()
