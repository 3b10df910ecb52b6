"""Benchmark (not a test): matgptq's GPTQ vs GPTQModel's and llm-compressor's GPTQ on the same layer, same process.

For each layer shape (out × in, an nn.Linear weight [out, in]): random weights, a Hessian H = 2·XᵀX/n from n = 2048
random activations X with a few large-magnitude outlier channels (the problem of benchmarks/bench_multibit.py), then
every installed implementation quantizes the same (W, H) with the same settings (bits, group size, symmetric,
act-order, relative damping 0.01, block size 128) on the same number of threads. Printed per shape: seconds (only
the quantization call, best of --repeat, after an untimed warm-up on a small layer), the relative output error
‖(W − Ŵ)Xᵀ‖_F / ‖W Xᵀ‖_F on the same 2048 activations (float64), and both as ratios to matgptq.
Goal: no slower than the fastest peer at no worse error.

Peers (the `bench` extra; missing ones print "not installed", --skip-peers skips them):
  * GPTQModel: `gptqmodel.quantization.gptq.GPTQ(nn.Linear, GPTQConfig)` with `.H` / `.nsamples` set directly,
    damp_percent=0.01 (its default is 0.05), damp_auto_increment=0, act_group_aware=False (its default GAR reorder
    would change the algorithm), static_groups=--static-groups, desc_act=--act-order. Ŵ = the dequantized weight it
    returns (float32 scales; matgptq's Ŵ uses its float16 scales, as exported).
    GPTQMODEL_CPU_WORKERS defaults to 2 here (set before the import).
  * llm-compressor: the pure `quantize_weight` (llmcompressor.modifiers.gptq.gptq_quantize) with QuantizationArgs
    (int, num_bits, symmetric, strategy group/channel) and scales/zero points from its default weight observer
    (memoryless min-max on the original weights; timed with the call). Its groups are static (parameters from the
    original weights, not refit on the error-updated ones, i.e. matgptq/GPTQModel with --static-groups); with
    --act-order it uses actorder "static" (desc-diag(H) processing order, contiguous groups). Ŵ = the fake-quantized
    weight it returns.

Timing: wall seconds and process CPU seconds of the quantization call only (preparation and error untimed), best of
--repeat rounds that interleave the implementations. On a machine with other jobs running, --threads equal to the
core count can be many times slower than --threads 1 and erratic (OpenMP threads spin-waiting on descheduled peers;
measured up to 10x on a shared 2-core box): compare with --threads 1 or OMP_WAIT_POLICY=PASSIVE, and note the load
average printed in the header and per shape.

    python -m benchmarks.bench_gptq [--shapes 4096x4096,11008x4096] [--bits 4] [--group-size 128] [--act-order]
                                 [--static-groups] [--asym] [--threads N] [--repeat 1] [--skip-peers]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import time
import traceback

os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")  # GPTQModel reads it at import time

import torch  # noqa: E402

from matgptq.execution import format_table  # noqa: E402
from matgptq.quantization.grid import NearestRounding  # noqa: E402
from matgptq.quantization.solver import gptq_quantize  # noqa: E402

DAMP = 0.01
BLOCK_SIZE = 128
N_SAMPLES = 2048
ERR_TOL = 1e-3  # errors within 0.1% count as equal (same algorithm; float16 vs float32 scales)


def layer_problem(rows: int, cols: int, seed: int = 0):
    """Random weight and a Hessian from 2048 random activations with a few large-magnitude outlier channels."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=gen) * 0.02
    x = torch.randn(N_SAMPLES, cols, generator=gen)
    x[:, torch.randperm(cols, generator=gen)[:8]] *= 25
    return w, 2 * x.T @ x / x.shape[0], x


def rel_output_error(w: torch.Tensor, w_hat: torch.Tensor, x: torch.Tensor, chunk: int = 2048) -> float:
    """‖(W − Ŵ)Xᵀ‖_F / ‖W Xᵀ‖_F in float64, in row chunks."""
    xt = x.to(torch.float64).T
    num = den = 0.0
    for a in range(0, w.shape[0], chunk):
        w64 = w[a : a + chunk].to(torch.float64)
        d = w64 - w_hat[a : a + chunk].to(torch.float64)
        num += float((d @ xt).square().sum())
        den += float((w64 @ xt).square().sum())
    return (num / den) ** 0.5


# Each implementation: setup(w, h, args) -> run; run() does one (untimed) preparation and returns (call, to_weight):
# `call` (zero arguments) is what is timed, `to_weight` (untimed) turns its output into the dequantized weight Ŵ
# [out, in]. Peers return Ŵ itself (their GPTQ computes it anyway); matgptq returns codes, fp16 scales and zeros.


def dequantize(r) -> torch.Tensor:
    """Ŵ = scales[:, g_idx] · (codes − zeros[:, g_idx]) of a matgptq QuantResult."""
    g = r.g_idx.long()
    return r.scales.float()[:, g] * (r.codes.float() - r.zeros.float()[:, g])


def identity(w_hat: torch.Tensor) -> torch.Tensor:
    return w_hat


def matgptq_setup(w, h, args):
    rounding = NearestRounding(args.bits)

    def run():
        def call():
            return gptq_quantize(w, h, rounding, group_size=args.group_size, sym=args.sym, act_order=args.act_order,
                                 static_groups=args.static_groups, damp=DAMP, block_size=BLOCK_SIZE)  # fmt: skip

        return call, dequantize

    return run


def gptqmodel_setup(w, h, args):
    from gptqmodel import GPTQConfig
    from gptqmodel.quantization.gptq import GPTQ

    qcfg = GPTQConfig(bits=args.bits, group_size=args.group_size, sym=args.sym, desc_act=args.act_order,
                      act_group_aware=False, static_groups=args.static_groups, damp_percent=DAMP,
                      damp_auto_increment=0.0, offload_to_disk=False)  # fmt: skip

    def run():
        module = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        module.weight.data = w.clone()
        g = GPTQ(module, qcfg)
        g.quantizer.configure(perchannel=True)
        g.H = h.clone()
        g.nsamples = N_SAMPLES

        def call():
            q, *_ = g.quantize(blocksize=BLOCK_SIZE)
            return q

        return call, identity

    return run


def llmcompressor_setup(w, h, args):
    from compressed_tensors.quantization import QuantizationArgs

    try:
        from llmcompressor.modifiers.gptq.gptq_quantize import quantize_weight
    except ImportError:  # older releases
        from llmcompressor.modifiers.quantization.gptq.gptq_quantize import quantize_weight
    from llmcompressor.observers.min_max import MemorylessMinMaxObserver

    grouped = args.group_size != -1
    qargs = QuantizationArgs(num_bits=args.bits, type="int", symmetric=args.sym,
                             strategy="group" if grouped else "channel",
                             group_size=args.group_size if grouped else None,
                             actorder="static" if args.act_order else None)  # fmt: skip

    def run():
        w3, h3 = w.clone().unsqueeze(0), h.clone().unsqueeze(0)  # quantize_weight works in place on both
        observer = MemorylessMinMaxObserver("weight", qargs)

        def call():
            qp = observer(w3[0]).get_qparams()
            q, _, fallback = quantize_weight(w3, h3, qp["scale"].unsqueeze(0), qp["zero_point"].unsqueeze(0), None,
                                             qargs, blocksize=BLOCK_SIZE, percdamp=DAMP)  # fmt: skip
            if bool(fallback.any()):
                raise RuntimeError("llm-compressor fell back to RTN (Hessian not positive definite)")
            return q[0]

        return call, identity

    return run


IMPLEMENTATIONS = [
    ("matgptq", None, matgptq_setup),
    ("GPTQModel", "gptqmodel", gptqmodel_setup),
    ("llm-compressor", "llmcompressor", llmcompressor_setup),
]


def installed(dist: str | None) -> str | None:
    """The installed version of `dist` (or of matgptq), None when missing."""
    try:
        return importlib.metadata.version(dist or "matgptq")
    except importlib.metadata.PackageNotFoundError:
        return None


def time_once(run, threads: int):
    """(wall seconds, process CPU seconds, Ŵ) of one call; preparation untimed."""
    call, to_weight = run()
    torch.set_num_threads(threads)  # peers' imports may change it
    with torch.no_grad():
        c0, t0 = time.process_time(), time.perf_counter()
        out = call()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return wall, cpu, to_weight(out)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",") if s]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", type=parse_shapes, default=parse_shapes("4096x4096,11008x4096"),
                    help="comma-separated OUTxIN layer shapes (nn.Linear weight [out, in])")  # fmt: skip
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=128, help="-1: one group per row")
    ap.add_argument("--asym", dest="sym", action="store_false", help="asymmetric grid (default symmetric)")
    ap.add_argument("--act-order", action="store_true", help="process columns by decreasing diag(H)")
    ap.add_argument("--static-groups", action="store_true",
                    help="matgptq and GPTQModel: group parameters from the original weights (llm-compressor always)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads for everyone")
    ap.add_argument("--repeat", type=int, default=1, help="best of this many timed calls per implementation")
    ap.add_argument("--skip-peers", action="store_true")
    return ap


def print_setting(args, versions: dict) -> None:
    """The machine, the versions and the problem, with a warning when other jobs compete for the threads."""
    cores, others = os.cpu_count() or 1, os.getloadavg()[0]
    if args.threads > 1 and others > cores - args.threads + 0.5:
        print(f"warning: load average {others:.1f} on {cores} cores: other jobs compete for the {args.threads} "
              "threads, and OpenMP's spin-waiting can make every implementation several times slower and erratic; "
              "compare with --threads 1, or run with OMP_WAIT_POLICY=PASSIVE")  # fmt: skip
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"{os.cpu_count()} cores, load average {load}; torch {torch.__version__}, threads {args.threads}, "
          + ", ".join(f"{n} {v or 'not installed'}" for n, v in versions.items())
          + f"; {args.bits}-bit, group size {args.group_size}, {'sym' if args.sym else 'asym'}, "
          f"act-order {'on' if args.act_order else 'off'}, static groups {'on' if args.static_groups else 'off'}, "
          f"damp {DAMP}, block {BLOCK_SIZE}, best of {args.repeat}")  # fmt: skip


def warm_up(impls, versions: dict, args) -> tuple[dict, dict]:
    """Untimed warm-up on a small layer (imports, lazy initialisation, first-call costs): the set-ups that work, and
    why the others failed."""
    setups, failures = {}, {}
    w0, h0, _ = layer_problem(256, 256, seed=1)
    for name, dist, setup in impls:
        if versions[name] is None:
            continue
        try:
            call, to_weight = setup(w0, h0, args)()
            to_weight(call())
            setups[name] = setup
        except Exception as exc:  # a broken peer must not hide the others' numbers
            traceback.print_exc()
            failures[name] = f"failed: {type(exc).__name__}: {str(exc)[:80]}"
    return setups, failures


def time_shape(impls, setups: dict, failures: dict, w, h, x, args) -> dict:
    """name -> [best wall s, best CPU s, relative output error] on one layer; a failing implementation is dropped
    (and named in `failures`). Rounds interleave the implementations, so load drift hits all alike."""
    runs = {name: setups[name](w, h, args) for name, _, _ in impls if name in setups}
    results = {}
    for _ in range(args.repeat):
        for name in list(runs):
            try:
                t, cpu, w_hat = time_once(runs[name], args.threads)
            except Exception as exc:
                traceback.print_exc()
                failures[name] = f"failed: {type(exc).__name__}: {str(exc)[:80]}"
                del runs[name]
                results.pop(name, None)
                continue
            if name not in results:
                results[name] = [t, cpu, rel_output_error(w, w_hat, x)]
            results[name][:2] = min(results[name][0], t), min(results[name][1], cpu)
            del w_hat
    return results


def report_shape(impls, versions: dict, failures: dict, results: dict, title: str) -> None:
    """One shape's table (ratios to matgptq) and whether the goal is met against the peers."""
    ref = results.get("matgptq")
    table = []
    for name, _, _ in impls:
        if name in results:
            t, cpu, err = results[name]
            table.append([name, t, cpu, err, t / ref[0] if ref else None, err / ref[2] if ref else None])
        else:
            table.append([name, "not installed" if versions[name] is None else failures.get(name, "failed")])
            table[-1] += [None] * 4
    print(title)
    headers = ["implementation", "seconds", "CPU s", "rel. output error", "time / matgptq", "error / matgptq"]
    print(format_table(headers, table))
    peers = {n: r for n, r in results.items() if n != "matgptq"}
    if ref and peers:
        fastest = min(peers, key=lambda n: peers[n][0])
        best = min(peers, key=lambda n: peers[n][2])
        t_ratio, e_ratio = ref[0] / peers[fastest][0], ref[2] / peers[best][2]
        met = t_ratio <= 1 and e_ratio <= 1 + ERR_TOL
        print(f"\ngoal (no slower than the fastest peer at no worse error): {'met' if met else 'NOT met'}; "
              f"time ×{t_ratio:.3f} vs the fastest peer ({fastest}), "
              f"error ×{e_ratio:.4f} vs the most accurate peer ({best})")  # fmt: skip


def main() -> None:
    args = build_parser().parse_args()
    torch.set_num_threads(args.threads)
    impls = IMPLEMENTATIONS[:1] if args.skip_peers else IMPLEMENTATIONS
    versions = {name: installed(dist) for name, dist, _ in impls}
    print_setting(args, versions)
    setups, failures = warm_up(impls, versions, args)
    for rows, cols in args.shapes:
        w, h, x = layer_problem(rows, cols)
        load0 = os.getloadavg()[0]
        results = time_shape(impls, setups, failures, w, h, x, args)
        title = f"\n### {rows}x{cols} (out x in), 1-min load average {load0:.2f} -> {os.getloadavg()[0]:.2f}\n"
        report_shape(impls, versions, failures, results, title)


if __name__ == "__main__":
    main()
