"""GEMV/GEMM of the nested kernels (kernels/triton_nested.py) against fp16 `torch.matmul` and torch's int4 kernel
(tinygemm, `aten._weight_int4pack_mm`) in one process, timed as CUDA graphs; a part of `make gpu-check`
(benchmarks/gpu/check.py), which calls `measure(tiny)`.

Timing: each timed graph runs the operation on COPIES different weights in turn and the time is divided by COPIES,
so every call reads its weight from HBM (a 4-bit 8192² layer, 42 MB with its carry plane, fits the H100's 50 MB L2
and would otherwise flatter every kernel, gpu-anchors.md §5); median of REPEATS replays of REPLAYS graph launches.
The weights are a random 8-bit parent with group size 128 (speed does not depend on the values). Two layouts per
width r: `slice` (the r planes of one slice, the memory of r bits) and `parent` (the whole parent's layout, width r
read from its top r + 1 planes). Launch parameters: a sweep of candidate Tiles at the largest shape, 4 bits, per
batch; the fastest is used for every width and shape of that batch (recorded in the JSON). Every timed output is
checked against the float32 product with the dequantized weight (relative error recorded).

tiny=True (no CUDA): the same code on tiny shapes in Triton's interpreter, one launch each: it runs, it times nothing.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from statistics import median

import torch

from matgptq.formats import QuantizedWeight
from matgptq.kernels import NestedLayout
from matgptq.kernels.triton_nested import NestedKernel, Tiles, nested_matmul

COPIES, REPLAYS, REPEATS = 4, 20, 3
GROUP = 128
# Candidates. The second make gpu-check (H100, 2026-11-26; docs/results/gpu.json) timed 2D-tile versions of the
# kernels: at 8192², batch 1, 4 bits GEMV (32, 256, split 4) took 39 µs, (64, 128, split 4) 42, (128, 128, split 2)
# 87, the generic path 187; GEMM (64, 512) 92 µs at batch 16, the generic path 455. The third (H200, 2026-11-26 22:37)
# timed lanes decoded in place (inplace=True) and shifted down first: (32, 512, split 2) 28.9 µs, (32, 256, split 8)
# 30.5, (16, 512, split 4) 31.1, (32, 256, split 4) 33.9 in place and 31.5 shifted. The fourth (H200, 2026-11-28
# 01:50) loaded each plane word once (hoist): (32, 1024, split 1) 26.3 µs against 29.4 without, (16, 1024, split 1)
# 26.9, (32, 512, split 4) 28.0 (27.9 without); GEMM (64, 512) 94.4 against 93.3 without, and one product per K block
# of the 32 lanes' joined tiles 140 (removed). split_k = 0: chosen from the shape (triton_nested.auto_split).
GEMV_TILES = [
    Tiles(32, 1024, split_k=0, hoist=True),
    Tiles(32, 1024, split_k=1, hoist=True),
    Tiles(16, 1024, split_k=1, hoist=True),
    Tiles(32, 2048, split_k=1, hoist=True),
    Tiles(32, 1024, split_k=1, hoist=True, num_warps=8),
    Tiles(32, 512, split_k=4, hoist=True),
    Tiles(32, 512, split_k=2),
]
GEMM_TILES = [Tiles(64, 512, 16), Tiles(128, 512, 16, num_warps=8), Tiles(32, 512, 16)]


def random_parent(n: int, k: int, device: str, seed: int = 0) -> QuantizedWeight:
    g = torch.Generator(device=device).manual_seed(seed)
    groups = k // GROUP
    return QuantizedWeight(
        torch.randint(0, 256, (n, k), generator=g, device=device, dtype=torch.uint8),
        (torch.rand(n, groups, generator=g, device=device) * 2e-4 + 1e-4).to(torch.float16),
        torch.randint(0, 256, (n, groups), generator=g, device=device, dtype=torch.uint8),
        torch.arange(k, dtype=torch.int32, device=device) // GROUP,
        8,
    )


def graph_us(calls: list, tiny: bool, replays: int = REPLAYS, warmups: int = 1) -> float:
    """Microseconds per call of `calls` (run in turn) as one CUDA graph replayed `replays` times, the median of
    REPEATS timings after `warmups` eager runs (they compile and allocate); tiny: run once, return nan."""
    if tiny:
        for c in calls:
            c()
        return float("nan")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            for c in calls:
                c()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (replays * len(calls)))
    return median(times)


def int4_us(x: torch.Tensor, n: int, k: int, tiny: bool) -> tuple[float | None, str | None]:
    """torch's tinygemm int4 g128 (bfloat16 activations) on COPIES random weights, or (None, why)."""
    if tiny:
        return None, "CUDA only"
    try:
        xb = x.to(torch.bfloat16)
        ws = []
        for _ in range(COPIES):
            w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=x.device)
            packed = torch.ops.aten._convert_weight_to_int4pack(w, 8)
            sz = torch.rand(k // GROUP, n, 2, device=x.device, dtype=torch.bfloat16)
            ws.append((packed, sz))
        calls = [lambda p=p, s=s: torch.ops.aten._weight_int4pack_mm(xb, p, GROUP, s) for p, s in ws]
        return graph_us(calls, tiny), None
    except Exception as e:  # noqa: BLE001 - a baseline that does not run is recorded, not fatal
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def rel_error(y: torch.Tensor, x: torch.Tensor, layout: NestedLayout, bits: int) -> float:
    ref = x.float() @ layout.dequantize(bits).t()
    return float((y.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def layouts(n: int, k: int, bits: int, device: str) -> dict[str, list[NestedLayout]]:
    parents = [random_parent(n, k, device, seed) for seed in range(COPIES)]
    return {
        "slice": [NestedLayout.build(q.slice(bits)) for q in parents],
        "parent": [NestedLayout.build(q) for q in parents],
    }


def sweep(n: int, k: int, batch: int, candidates: list, device: str, tiny: bool) -> tuple[list, list[dict]]:
    """Every candidate (kernel, Tiles) at 4 bits (slice layout): those whose output is right, fastest first."""
    lays = layouts(n, k, 4, device)["slice"]
    x = torch.randn(batch, k, device=device, dtype=torch.float16 if not tiny else torch.float32)
    rows, ok = [], []
    for kern, t in candidates:
        try:
            err = rel_error(nested_matmul(x, lays[0], 4, kern, t), x, lays[0], 4)
            us = graph_us([lambda lay=lay: nested_matmul(x, lay, 4, kern, t) for lay in lays], tiny)
            rows.append({"kernel": kern.value, "tiles": asdict(t), "us": us, "rel_error": err})
            if err < 1e-2:
                ok.append((us, kern, t))
        except Exception as e:  # noqa: BLE001 - a candidate that fails to compile is recorded and skipped
            rows.append({"kernel": kern.value, "tiles": asdict(t), "error": f"{type(e).__name__}: {str(e)[:300]}"})
    if not ok:
        raise RuntimeError(f"no candidate ran correctly at batch {batch}: {rows}")
    return [(kern, t) for _, kern, t in sorted(ok, key=lambda o: (o[0], str(o[2])))], rows


def candidates_for(batch: int, ranked: dict, tiny: bool) -> list:
    """Batch 1: every GEMV candidate; batch 16: batch 1's fastest GEMV and every GEMM candidate; other batches: the
    fastest of each kernel found so far (nothing new to compile)."""
    if tiny:  # one of each kernel: the code runs, nothing is timed
        return [(NestedKernel.GEMV, GEMV_TILES[0])] + ([(NestedKernel.GEMM, GEMM_TILES[0])] if batch > 1 else [])
    if batch == 1:
        return [(NestedKernel.GEMV, t) for t in GEMV_TILES]
    best_gemv = [ranked[1][0]] if 1 in ranked else []
    if batch == 16:
        return best_gemv + [(NestedKernel.GEMM, t) for t in GEMM_TILES]
    return best_gemv + [next(c for c in ranked[16] if c[0] == NestedKernel.GEMM)] if 16 in ranked else best_gemv


def measure(tiny: bool) -> dict:
    device = "cpu" if tiny else "cuda"
    shapes = [(64, 256)] if tiny else [(8192, 8192), (4096, 4096)]
    batches, widths = ([1, 16], [2, 4]) if tiny else ([1, 16, 4], [2, 3, 4, 8])
    out = {"gemv": [], "sweep": {}, "baselines": []}
    ranked: dict = {}
    for batch in batches:
        t0 = time.perf_counter()
        ranked[batch], rows = sweep(*shapes[0], batch, candidates_for(batch, ranked, tiny), device, tiny)
        kern, tiles = ranked[batch][0]
        out["sweep"][str(batch)] = {
            "chosen": {"kernel": kern.value, **asdict(tiles)},
            "candidates": rows,
            "seconds": time.perf_counter() - t0,
        }
        for n, k in shapes:
            x = torch.randn(batch, k, device=device, dtype=torch.float16 if not tiny else torch.float32)
            w16 = [torch.randn(n, k, device=device, dtype=x.dtype) * 0.02 for _ in range(COPIES)]
            fp16 = graph_us([lambda w=w: torch.matmul(x, w.t()) for w in w16], tiny)
            del w16
            i4, why = int4_us(x, n, k, tiny)
            out["baselines"].append(
                {"shape": [n, k], "batch": batch, "fp16_us": fp16, "int4_tinygemm_us": i4, "int4_error": why}
            )
            for bits in widths:
                for kind, lays in layouts(n, k, bits, device).items():
                    y = nested_matmul(x, lays[0], bits, kern, tiles)
                    us = graph_us([lambda lay=lay: nested_matmul(x, lay, bits, kern, tiles) for lay in lays], tiny)
                    out["gemv"].append(
                        {
                            "shape": [n, k],
                            "batch": batch,
                            "bits": bits,
                            "layout": kind,
                            "us": us,
                            "fp16_us": fp16,
                            "speedup_vs_fp16": fp16 / us,
                            "int4_us": i4,
                            "kernel": kern.value,
                            "rel_error": rel_error(y, x, lays[0], bits),
                        }
                    )
    return out
