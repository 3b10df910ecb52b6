"""Benchmark: the nested-layout Triton kernels (kernels/triton_nested.py) vs torch.matmul in float16 on a GPU.

For each square layer size (default 4096² and 8192²), width r and batch (rows of x), one table row: the fp16
matmul's and the kernel's time (triton.testing.do_bench, median), the speed-up, and the bytes of weight each reads
(fp16: 2 per weight; nested: (r + 1)/8 per weight plus scales and zeros). The weights are a random 8-bit parent with
group size 128 (speed does not depend on the values). The paper's reference point (seed 001, §5.6): 3–5.6× over
fp16 at batch 1. Without CUDA it prints that the benchmark is unmeasured and exits 0.

    python scripts/bench_nested_gpu.py [--sizes 4096,8192] [--bits 2,3,4,8] [--batches 1,2,4,8,16,32,64]
"""

from __future__ import annotations

import argparse
import sys

import torch

from matgptq.execution import format_table
from matgptq.formats import QuantizedWeight
from matgptq.kernels import NestedLayout
from matgptq.kernels.triton_nested import nested_matmul


def random_parent(n: int, k: int, group: int) -> QuantizedWeight:
    g = k // group
    return QuantizedWeight(torch.randint(0, 256, (n, k), dtype=torch.uint8),
                           (torch.rand(n, g) * 0.01 + 1e-3).to(torch.float16),
                           torch.randint(0, 256, (n, g), dtype=torch.uint8),
                           torch.arange(k, dtype=torch.int32) // group, 8)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4096,8192", help="square layer sizes N = K")
    ap.add_argument("--bits", default="2,3,4,8", help="widths served from the one layout")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64", help="rows of x")
    ap.add_argument("--group-size", type=int, default=128, help="columns per scale group")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_nested_gpu: unmeasured: no CUDA device here (run it on a GPU machine with triton installed)")
        return 0
    import triton

    widths = [int(b) for b in args.bits.split(",")]
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        layout = NestedLayout.build(random_parent(size, size, args.group_size), widths=widths)
        layout = NestedLayout(layout.planes.cuda(), {r: s.cuda() for r, s in layout.scales.items()},
                              layout.zeros.cuda(), layout.group_size, layout.master_bits, layout.in_features,
                              None)  # fmt: skip
        w16 = torch.randn(size, size, device="cuda", dtype=torch.float16)
        for m in (int(b) for b in args.batches.split(",")):
            x = torch.randn(m, size, device="cuda", dtype=torch.float16)
            t_fp16 = triton.testing.do_bench(lambda: torch.matmul(x, w16.t()))
            for r in widths:
                t = triton.testing.do_bench(lambda: nested_matmul(x, layout, r))
                rows.append([f"{size}²", m, r, f"{t_fp16 * 1e3:.1f}", f"{t * 1e3:.1f}", f"{t_fp16 / t:.2f}x",
                             f"{(r + 1) / 16:.3f}"])  # fmt: skip
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print(format_table(["layer", "batch", "bits", "fp16 matmul µs", "nested µs", "speed-up",
                        "weight bytes / fp16"], rows))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
