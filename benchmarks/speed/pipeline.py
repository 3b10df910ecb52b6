"""Benchmark (not a test): end-to-end quantization (load → calibrate → quantize → save) of a real model with matgptq,
GPTQModel and llm-compressor on the same calibration windows, one tool per child process, in one run.

The parent draws the windows once (matgptq's calibration_windows: --nsamples windows of --seqlen tokens, --seed) and
hands every tool the same token ids. Each tool runs in its own process, so wall time, CPU time (user+sys) and peak
RSS are the child's own (os.wait4). Printed: one row per tool and the ratios CPU / fastest peer and RSS / lowest
peer, then matgptq's own breakdown (load, capture of the first block's inputs, block forwards, Hessian accumulation,
solver, error report, save).

Tools (--tools, comma-separated):
  matgptq-cli      `matgptq quantize MODEL --method gptq --bits B --group-size G` with the calibration options and no
                   other: what a user runs (model streamed block by block, checkpoint assembled from the block files);
                   it draws the very windows the others get (the same calibration_windows call on the same text)
                   (`--dtype auto`: for this float32 copy on a CPU with bfloat16 arithmetic, bfloat16 passes from
                   the float32 weights, written in float32; float32 elsewhere: quantization/run.calibration_dtypes)
  matgptq-cli-bf16 the same with --dtype bfloat16 (weights rounded to bfloat16 and written so: what `auto` gives a
                   model stored in bfloat16 on a CPU with bfloat16 arithmetic)
  matgptq-cli-fp32 the same with --dtype float32 (what `auto` gives this copy on a CPU without bfloat16 arithmetic)
  matgptq          GPTQ, --bits, group --group-size, symmetric, `--dtype auto`'s dtypes
  matgptq-bf16     the same with --dtype bfloat16 (Hessians and solver still float32), GPTQModel's CPU dtype
  matgptq-348      MatGPTQ parent {3,4,8} (master 8), model's dtype
  matgptq-348-bf16 the same in bfloat16
  gptqmodel        GPTQModel.load + quantize + save, QuantizeConfig(bits, group_size, sym=True, desc_act=False);
                   its CPU default dtype (bfloat16), its other defaults
  gptqmodel-fp32   the same with dtype=torch.float32 (its fastest setting on a CPU without AVX512-BF16 or AMX, where
                   bfloat16 products are emulated), its other defaults
  llmcompressor    oneshot with GPTQModifier(int weights, --bits, group --group-size, symmetric, targets Linear, lm_head
                   ignored), the model in its own dtype, sequential pipeline (its default), save_compressed.
                   A group size that does not divide every layer's columns (SmolLM2: 576 = 4.5 x 128) needs its
                   bypass_divisibility_checks=True; compressed-tensors cannot pack that, so the model is then saved
                   dense (the fake-quantized weights, i.e. the dequantized codes); 0.14.0.1 still stops there at g128 on
                   SmolLM2 (its observer: `unflatten: sizes [-1, 128]` of 576 columns, 2026-11-29), so
                   gptq_defaults.py runs it at g64

With --repeat N the tools run N times in turn (all of them, then all again), so a slow stretch of a shared machine
falls on every tool; each figure is then the median over the rounds, and the ratios to the peers are the median of
the per-round ratios, with their range.

Needs the bench venv (`make bench-venv`: GPTQModel 7.6.0, llm-compressor 0.14.0.1, .ci/constraints-bench.txt).
Timings on a shared machine vary; compare CPU time and read the load average printed in the header.
With --json FILE the measurements go to FILE and the page rendered from them alone beside it (FILE with .md; the
recorded run is docs/results/bench_pipeline.{json,md}, re-rendered by `python -m benchmarks.render_docs`).

    python -m benchmarks.speed.pipeline MODEL_DIR --calib FILE [--calib-range A:B] [--nsamples 64] [--seqlen 512]
        [--group-size 128] [--tools matgptq-cli,matgptq-cli-bf16,matgptq,matgptq-bf16,gptqmodel,llmcompressor]
        [--threads 2] [--repeat 1] [--work DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks._harness import child_env, format_table, header, load_json, machine, run_measured, write_page

TOOLS = (
    "matgptq-cli",
    "matgptq-cli-bf16",
    "matgptq-cli-fp32",
    "matgptq",
    "matgptq-bf16",
    "matgptq-348",
    "matgptq-348-bf16",
    "gptqmodel",
    "gptqmodel-fp32",
    "llmcompressor",
)
PEERS = ("gptqmodel", "gptqmodel-fp32", "llmcompressor")


def cli_command(args, tool: str, out: Path) -> list[str]:
    """The command line a user types (tool matgptq-cli[-bf16|-fp32])."""
    return [
        sys.executable,
        "-m",
        "matgptq",
        "quantize",
        args.model,
        "--out",
        str(out),
        "--method",
        "gptq",
        "--bits",
        str(args.bits),
        "--group-size",
        str(args.group_size),
        "--calib",
        args.calib,
        "--calib-range",
        args.calib_range,
        "--nsamples",
        str(args.nsamples),
        "--seqlen",
        str(args.seqlen),
        "--seed",
        str(args.seed),
        "--overwrite",
        "--quiet",
    ] + {"bf16": ["--dtype", "bfloat16"], "fp32": ["--dtype", "float32"]}.get(tool.rpartition("-")[2], [])


def run_child(args, tool: str, ids_file: Path, work: Path) -> dict:
    out = work / tool
    report = work / f"{tool}.json"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks._harness.peers",
        tool,
        args.model,
        "--ids",
        str(ids_file),
        "--out-model",
        str(out),
        "--bits",
        str(args.bits),
        "--group-size",
        str(args.group_size),
        "--report",
        str(report),
    ]
    cli = tool.startswith("matgptq-cli")
    usage = run_measured(cli_command(args, tool, out) if cli else cmd, child_env(args.threads), work / f"{tool}.log")
    made = (
        {"calibrated_in": json.loads((out / "matgptq.json").read_text())["calibration"]["dtype"]}
        if usage["ok"] and cli
        else {}
    )
    return {
        "tool": tool,
        **usage,
        **made,
        "breakdown": json.loads(report.read_text()) if usage["ok"] and not cli else {},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="Hugging Face model directory")
    p.add_argument("--calib", help="calibration text file")
    p.add_argument("--calib-range", default="0:1", help="character range START:END of --calib")
    p.add_argument("--nsamples", type=int, default=64, help="calibration windows")
    p.add_argument("--seqlen", type=int, default=512, help="tokens per window")
    p.add_argument("--seed", type=int, default=0, help="seed of the window draw")
    p.add_argument("--bits", type=int, default=4, help="GPTQ width")
    p.add_argument("--group-size", type=int, default=128, help="columns per scale group")
    p.add_argument(
        "--tools",
        default="matgptq-cli,matgptq-cli-bf16,matgptq,matgptq-bf16,gptqmodel,llmcompressor",
        help=f"comma-separated, from {', '.join(TOOLS)}",
    )
    p.add_argument("--threads", type=int, default=2, help="threads per tool (OMP_NUM_THREADS)")
    p.add_argument("--repeat", type=int, default=1, help="rounds of every tool in turn (medians and ranges over them)")
    p.add_argument("--work", help="keep outputs and logs here (default: a temporary directory, removed)")
    p.add_argument("--json", help="write the measurements to this file")
    args = p.parse_args()

    from safetensors.torch import save_file

    from matgptq.models import calibration_windows, load_tokenizer, read_text, tokenize

    tools = args.tools.split(",")
    unknown = set(tools) - set(TOOLS)
    if unknown or not args.calib or args.repeat < 1:
        p.error(
            f"unknown tools {sorted(unknown)}"
            if unknown
            else "--repeat must be at least 1"
            if args.calib
            else "--calib FILE is required"
        )
    a, b = (float(x) for x in args.calib_range.split(":"))
    ids = calibration_windows(
        tokenize(load_tokenizer(args.model), read_text(args.calib, (a, b))), args.nsamples, args.seqlen, args.seed
    )
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-pipeline-"))
    work.mkdir(parents=True, exist_ok=True)
    save_file({"ids": ids.contiguous()}, str(work / "ids.safetensors"))
    load_start = os.getloadavg()[0]
    print(
        f"{args.model}: {args.nsamples} x {args.seqlen} tokens, GPTQ {args.bits}-bit g{args.group_size} sym, "
        f"{args.threads} threads per tool, load average {load_start:.2f}",
        flush=True,
    )
    results = []
    for round_ in range(args.repeat):
        for tool in tools:
            results.append({**run_child(args, tool, work / "ids.safetensors", work), "round": round_})
            r = results[-1]
            print(
                f"  {tool}: {'ok' if r['ok'] else 'FAILED (see ' + str(work / (tool + '.log')) + ')'} "
                f"wall {r['wall']:.0f} s, CPU {r['cpu']:.0f} s, peak RSS {r['rss_gb']:.2f} GB",
                flush=True,
            )
    data = {
        "args": vars(args),
        "machine": machine(),
        "load_average_start": load_start,
        "load_average": os.getloadavg(),
        "results": results,
    }
    print("\n" + tables(data))
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=2))
        write_page(Path(args.json).with_suffix(".md"), page(load_json(Path(args.json))))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


def page(data: dict) -> str:
    """docs/results/bench_pipeline.md from its JSON."""
    a = data["args"]
    load = [f"{data['load_average_start']:.2f} at the start"] if "load_average_start" in data else []
    load += [f"{data['load_average'][0]:.2f} at the end"] if data.get("load_average") else []
    m = data.get("machine")
    where = f" Measured on {m['cpu']} ({m['cores']} cores) at commit {m['commit']}." if m else ""
    return "\n".join(
        [
            header("benchmarks/speed/pipeline.py", "bench_pipeline.json"),
            "# End-to-end quantization: matgptq against GPTQModel and llm-compressor",
            "",
            f"{a['model']}: {a['nsamples']} x {a['seqlen']} tokens (seed {a['seed']}, {a['calib']} "
            f"[{a['calib_range']}]), GPTQ {a['bits']}-bit g{a['group_size']} sym, {a['threads']} threads per "
            f"tool{', load average ' if load else ''}{' and '.join(load)}.{where}",
            "",
            tables(data),
        ]
    )


def summary(data: dict) -> dict[str, dict]:
    """Per tool that ran: the median over the rounds of wall, cpu and rss_gb; "cpu_ratio" and "rss_ratio", the median
    and (min, max) over the rounds of its figure over the fastest (leanest) peer of the same round (None without a
    peer); "runs", the rounds; "peer_cpu" and "peer_rss", the peers the ratios are to (of the last round)."""
    from statistics import median

    ok = [r for r in data["results"] if r["ok"]]
    rounds = sorted({r.get("round", 0) for r in ok})
    out = {}
    for tool in dict.fromkeys(r["tool"] for r in ok):
        mine = [r for r in ok if r["tool"] == tool]
        s = {k: median(r[k] for r in mine) for k in ("wall", "cpu", "rss_gb")} | {"runs": len(mine)}
        for key, name, peer in (("cpu", "cpu_ratio", "peer_cpu"), ("rss_gb", "rss_ratio", "peer_rss")):
            ratios = []
            for n in rounds:
                peers = [r for r in ok if r.get("round", 0) == n and r["tool"] in PEERS]
                best = min(peers, key=lambda r: r[key], default=None)
                ratios += [r[key] / best[key] for r in mine if r.get("round", 0) == n and best]
                s[peer] = best["tool"] if best else None
            s[name] = (median(ratios), (min(ratios), max(ratios))) if ratios else None
        out[tool] = s
    return out


def ratio_cell(x, unit: str = "") -> str:
    """A ratio (summary's (median, (min, max))): the median, with the rounds' range where they differ."""
    if x is None:
        return "-"
    mid, (lo, hi) = x
    return f"{mid:.2f}{unit}" + (f" ({lo:.2f}-{hi:.2f})" if f"{lo:.2f}" != f"{hi:.2f}" else "")


def tables(data: dict) -> str:
    """One row per tool (medians over the rounds) with the ratios to the peers, then matgptq's own breakdown."""
    results = data["results"]
    runs = summary(data)
    rounds = max((s["runs"] for s in runs.values()), default=1)
    rows = [
        [
            tool,
            f"{s['wall']:.0f}",
            f"{s['cpu']:.0f}",
            f"{s['rss_gb']:.2f}",
            ratio_cell(s["cpu_ratio"]),
            ratio_cell(s["rss_ratio"]),
        ]
        for tool, s in runs.items()
    ]
    out = [f"Medians over {rounds} rounds (ratios: the median of each round's, with their range).\n"] * (rounds > 1)
    out += [format_table(["tool", "wall s", "CPU s", "peak RSS GB", "CPU / fastest peer", "RSS / lowest peer"], rows)]
    failed = [r["tool"] for r in results if not r["ok"]]
    out += [
        f"- {t}: FAILED" + (f" ({failed.count(t)} of {rounds} rounds)" if rounds > 1 else "")
        for t in dict.fromkeys(failed)
    ]
    parts = [
        r for r in results if r["tool"].startswith("matgptq") and r["ok"] and r["breakdown"] and r.get("round", 0) == 0
    ]  # the CLI has none; the first round's
    if parts:
        keys = list(parts[0]["breakdown"])
        out += [
            "",
            format_table(
                ["seconds"] + [r["tool"] for r in parts], [[k] + [_fmt(r["breakdown"][k]) for r in parts] for k in keys]
            ),
        ]
    return "\n".join(out) + "\n"


def _fmt(v) -> str:
    return f"{v:.1f}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
    main()
