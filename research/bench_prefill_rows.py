"""Benchmark: where PackedLinear's int4 kernel stops paying off against dequantize-then-matmul (runtime/packed.py,
PREFILL_ROWS), per layer shape, width and row count, with the dense bf16 F.linear beside them.

Codes, scales and zeros are random (the kernels' cost does not depend on the values); one thread unless --threads.
Prints ms per call: `kernel` (aten._weight_int4pack_mm_for_cpu, cost linear in the rows), `dequant` (exact int4
dequantization + F.linear, a fixed cost per call plus a dense matmul) and `dense` (F.linear on a bf16 weight).

    python -m research.bench_prefill_rows [--shapes 576x576,192x576,1536x576,576x1536] [--bits 3,8]
        [--rows 1,16,64,128,256,512] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import matgptq.runtime.packed as packed
from matgptq.formats import QuantizedWeight


def random_weight(n: int, k: int, bits: int, gen: torch.Generator, master: int = 8, group: int = 128):
    groups = -(-k // group)
    return QuantizedWeight(torch.randint(0, 1 << bits, (n, k), generator=gen, dtype=torch.uint8),
                           (torch.rand(n, groups, generator=gen) * 0.01 + 0.001).half(),
                           torch.randint(100, 150, (n, groups), generator=gen, dtype=torch.uint8),
                           torch.arange(k, dtype=torch.int32) // group, bits, master - bits)  # fmt: skip


def ms_per_call(fn, reps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="576x576,192x576,1536x576,576x1536", help="N x K per layer (SmolLM2-135M's)")
    ap.add_argument("--bits", default="3,8", help="slice widths (≤ 4: one int4 plane, 5..8: two)")
    ap.add_argument("--rows", default="1,16,64,128,256,512", help="rows per call (tokens of a prompt)")
    ap.add_argument("--reps", type=int, default=20, help="calls timed per cell")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(0)
    saved = packed.PREFILL_ROWS
    print("| bits | N x K | rows | kernel ms | dequant ms | dense ms | faster packed path |")
    print("|------|-------|------|-----------|------------|----------|--------------------|")
    for bits in (int(b) for b in a.bits.split(",")):
        for shape in a.shapes.split(","):
            n, k = (int(v) for v in shape.split("x"))
            layer = packed.PackedLinear(random_weight(n, k, bits, gen), None, torch.bfloat16)
            dense = layer.dequantized_weight()
            for rows in (int(r) for r in a.rows.split(",")):
                x = torch.randn(1, rows, k, generator=gen).to(torch.bfloat16)
                packed.PREFILL_ROWS = 1 << 40  # every call through the kernel
                kern = ms_per_call(lambda: layer(x), a.reps)
                packed.PREFILL_ROWS = 0  # every call dequantizes
                deq = ms_per_call(lambda: layer(x), a.reps)
                dn = ms_per_call(lambda: F.linear(x, dense), a.reps)
                best = "kernel" if kern < deq else "dequant"
                print(f"| {bits} | {n}x{k} | {rows} | {kern:.2f} | {deq:.2f} | {dn:.2f} | {best} |", flush=True)
    packed.PREFILL_ROWS = saved
    print(f"\nPREFILL_ROWS = {saved}: calls with fewer rows use the kernel.")


if __name__ == "__main__":
    main()
