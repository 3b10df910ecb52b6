"""Nested without regret: MatGPTQ variants against per-width GPTQ on stories260K, over calibration seeds.

Protocol of benchmarks/results.py: calibration 128×256 tokens from the last 40% of TinyStories (seeds 0, 1, 2), perplexity
and KL to the float32 model on the first 60% (40k tokens). Per grouping (per channel, g128) and seed:
  * GPTQ at 3, 4, 6 and 8 bits (each its own run), with the same grid options as the parent;
  * one parent per variant (c = 8, R = {3,4,8}) read at slices 3, 4, 6 (interpolated) and 8:
      paper             seed 001 as published: mean error fed back, every slice on the master scale
      per-width         one error-feedback track per width (multibit.PerWidthRounding)
      per-width-scales  + each target width's least-squares scales (quantization/refit.py), with λ = 1,1,1 and
                        with the master weighted ×4 (λ = 1,1,4), ×16 (λ = 1,1,16, the default), ×64 and ×256 (how far
                        weighting the master buys back slice-8 and what it costs the lower slices)
    and, per channel only, per-width-scales λ = 1,1,1 and GPTQ with the MSE grid (`--mse`); and, both groupings,
    the default parent and GPTQ with the Hessian-weighted grid and scale refit (`--mse --mse-weighted
    --refit-scales`, "+hw": what the GGUF rows of benchmarks/gguf_vs_llamacpp_real.py use).
Reported: mean ± standard deviation over seeds; a ratio to GPTQ is a tie when the two means are closer than the larger
spread. Also the solver's seconds per layer (stories260K's are tiny: the cost at 4096² is benchmarks/bench_gptq.py's).
Results are cached in docs/results/ablation.json as they come (a killed run continues); --fresh starts over.
Writes docs/results/ablation.{json,md} (the page is rendered from the JSON alone: `python -m benchmarks.render_docs`).

--real-model: the same comparison on SmolLM2-135M-Instruct (`make real-model`) with Table 1's protocol
(benchmarks/real_model_table.py: 64 × 512 calibration tokens from the second half of WikiText-2 test), g128 and per
channel (without the MSE-grid rows), for seeds 0-2, GPTQ 3/4/8 against the λ = 1,1,4 and the default (λ = 1,1,16)
parents, perplexity and KL on 16 × 2048 tokens of the first half (Table 1 scores 32 × 2048, so its numbers differ
slightly), two threads. Writes docs/results/ablation_real_model.{json,md}.

    python -m research.matgptq_ablation [--real-model] [--fresh]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from matgptq.api import make_config
from matgptq.evaluation.perplexity import Teacher, score
from matgptq.execution import format_table
from matgptq.models.hf import load_fp_model, load_tokenizer
from matgptq.models.text import calibration_windows, eval_windows, read_text, tokenize
from matgptq.quantization.pipeline import quantize_model
from benchmarks._harness import RESULTS, header, write_page
from benchmarks.real_model_table import DEFAULT_MODEL, WIKI

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
SEEDS = (0, 1, 2)
SLICES = (3, 4, 6, 8)


@dataclass(frozen=True)
class Protocol:
    name: str
    model: Path
    text: Path
    calib_range: tuple[float, float]
    eval_range: tuple[float, float]
    nsamples: int
    seqlen: int
    eval_seqlen: int
    eval_tokens: int
    groupings: dict
    variants: tuple[str, ...]  # keys of VARIANTS measured
    out: str  # docs/results/<out>.{json,md}
    threads: int
    mse_grid: bool  # per channel, also GPTQ and the λ = 1,1,1 parent with the MSE grid


STORIES = Protocol("stories260K", SHARED / "models" / "stories260K",
                   SHARED / "data" / "tinystories" / "tinystories_val_head.txt", (0.6, 1.0), (0.0, 0.6), 128, 256, 256,
                   40_000, {"per channel": -1, "g128": 128}, (), "ablation", 1, True)  # fmt: skip
SMOLLM2 = Protocol("SmolLM2-135M-Instruct", DEFAULT_MODEL, WIKI, (0.5, 1.0), (0.0, 0.5), 64, 512, 2048, 16 * 2048,
                   {"g128": 128, "per channel": -1},
                   ("per-width-scales λ=1,1,4", "per-width-scales λ=1,1,16 (default)"), "ablation_real_model", 2,
                   False)  # fmt: skip
ONES, MASTER4 = (1.0, 1.0, 1.0), (1.0, 1.0, 4.0)
VARIANTS = {  # name -> quantize options (λ explicit, so a change of defaults never relabels a cached row)
    "paper": dict(variant="paper", bit_weights=ONES),
    "per-width": dict(variant="per-width", bit_weights=ONES),
    "per-width-scales λ=1,1,1": dict(variant="per-width-scales", bit_weights=ONES),
    "per-width-scales λ=1,1,4": dict(variant="per-width-scales", bit_weights=MASTER4),
    "per-width-scales λ=1,1,16 (default)": dict(variant="per-width-scales", bit_weights=(1.0, 1.0, 16.0)),
    "per-width-scales λ=1,1,64": dict(variant="per-width-scales", bit_weights=(1.0, 1.0, 64.0)),
    "per-width-scales λ=1,1,256": dict(variant="per-width-scales", bit_weights=(1.0, 1.0, 256.0)),
}
MSE_VARIANT = "per-width-scales λ=1,1,1"
# the Hessian-weighted scale search and least-squares refit of the master (`--mse --mse-weighted --refit-scales`,
# grid.py and refit.py: llama.cpp's imatrix idea), GPTQ against the default parent, both groupings
HW = dict(mse=True, mse_weighted=True, refit_scales=True)
HW_VARIANT = "per-width-scales λ=1,1,16 (default)"


def variants(p: Protocol) -> list[str]:
    return list(p.variants or VARIANTS)


def gptq_widths(p: Protocol) -> tuple[int, ...]:
    return SLICES if p is STORIES else (3, 4, 8)  # the real model's 6-bit goal is against slice-8, not GPTQ-6


def runs(p: Protocol):
    """(key, method, options) for every run, in order: GPTQ rows then parents, per seed and grouping."""
    for seed in SEEDS:
        for gname, gs in p.groupings.items():
            for tag, grid, only in grid_rows(p, gs):
                for bits in gptq_widths(p):
                    yield f"{gname}|GPTQ{tag}|{bits}|{seed}", "gptq", bits, dict(group_size=gs, **grid), seed
                for name in variants(p):
                    if only is not None and name != only:
                        continue
                    opts = dict(group_size=gs, **grid, **VARIANTS[name])
                    yield f"{gname}|{name}{tag}|-|{seed}", "matgptq", (3, 4, 8), opts, seed


def grid_rows(p: Protocol, gs: int) -> list[tuple[str, dict, str | None]]:
    """(row suffix, grid options, the one variant measured with them or None for all) of a grouping."""
    rows = [("", dict(mse=False), None)]
    if p.mse_grid:
        rows += [(" +mse", dict(mse=True), MSE_VARIANT)] if gs == -1 else []
        rows += [(" +hw", HW, HW_VARIANT)]
    return rows


class Setting(NamedTuple):
    """What every run of a protocol shares: calibration tokens, held-out windows, the fp32 model and its logits."""

    calib_tokens: torch.Tensor
    windows: torch.Tensor
    fp: torch.nn.Module
    batch: int
    teacher: Teacher


def setting(p: Protocol) -> Setting:
    torch.set_num_threads(p.threads)
    tok = load_tokenizer(p.model)
    calib_tokens = tokenize(tok, read_text(p.text, p.calib_range))
    windows = eval_windows(tokenize(tok, read_text(p.text, p.eval_range)), p.eval_seqlen, p.eval_tokens)
    fp = load_fp_model(p.model, torch.float32)
    batch = max(1, 8192 // p.eval_seqlen)
    return Setting(calib_tokens, windows, fp, batch, Teacher(fp, windows, batch))


def measure(p: Protocol, results: dict, out: Path) -> None:
    todo = [r for r in runs(p) if r[0] not in results]
    if not todo:
        return
    calib_tokens, windows, fp, batch, teacher = setting(p)
    for key, method, bits, opts, seed in todo:
        model = copy.deepcopy(fp)
        cfg = make_config(method, bits, **opts)
        calib = calibration_windows(calib_tokens, p.nsamples, p.seqlen, seed)
        layers, reports, _ = quantize_model(model, calib, cfg, progress=False)
        entry = {"seconds_per_layer": sum(r.seconds for r in reports) / len(reports)}
        for r in SLICES if method == "matgptq" else (bits,):
            for name, q in layers.items():
                model.get_submodule(name).weight.data = q.slice(r).dequantize()
            s = score(model, windows, teacher, batch)
            entry[str(r)] = {"ppl": s.ppl, "kl": s.kl}
        results[key] = entry
        out.write_text(json.dumps(results, indent=1))
        print(key, {k: v for k, v in entry.items()}, flush=True)


def stats(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def collect(results: dict, grouping: str, row: str, width: int, metric: str) -> list[float]:
    """One value per seed (all seeds must be measured)."""
    if row.startswith("GPTQ"):
        return [results[f"{grouping}|{row}|{width}|{s}"][str(width)][metric] for s in SEEDS]
    return [results[f"{grouping}|{row}|-|{s}"][str(width)][metric] for s in SEEDS]


def verdict(a: list[float], b: list[float], goal: float) -> str:
    """`a` against `goal`·`b` (lower is better): the ratio of means, and whether it meets the goal beyond the spread."""
    (ma, sa), (mb, sb) = stats(a), stats(b)
    ratio = ma / mb
    if abs(ma - goal * mb) < max(sa, sb):
        return f"{ratio:.3f} (tie)"
    return f"{ratio:.3f} {'✓' if ma < goal * mb else '✗'}"


def stories_page(results: dict) -> str:
    """docs/results/ablation.md from its JSON."""
    return page(STORIES, results)


def real_model_page(results: dict) -> str:
    """docs/results/ablation_real_model.md from its JSON."""
    return page(SMOLLM2, results)


def page(p: Protocol, results: dict) -> str:
    return header("research/matgptq_ablation.py", f"{p.out}.json") + "\n" + render(p, results) + "\n"


def render(p: Protocol, results: dict) -> str:
    fmt = lambda v, d: f"{stats(v)[0]:.{d}f} ± {stats(v)[1]:.{d}f}" if v else "-"  # noqa: E731
    out = [f"Mean ± std over calibration seeds {', '.join(map(str, SEEDS))}; {p.name}, calibration {p.nsamples} × "
           f"{p.seqlen} tokens, perplexity and KL to fp32 on {p.eval_tokens} held-out tokens (windows of "
           f"{p.eval_seqlen})."]  # fmt: skip
    for gname, gs in p.groupings.items():
        rows = []
        extra = [(tag, only) for tag, _, only in grid_rows(p, gs) if tag]
        names = ["GPTQ", *variants(p)] + [n for tag, only in extra for n in (f"GPTQ{tag}", f"{only}{tag}")]
        for name in names:
            sec = [results[k]["seconds_per_layer"] for k in results if k.startswith(f"{gname}|{name}|")]
            widths = gptq_widths(p) if name.startswith("GPTQ") else SLICES
            get = lambda w, m, name=name: collect(results, gname, name, w, m) if w in widths else []  # noqa: E731
            rows.append([name, *[fmt(get(w, "ppl"), 3) for w in SLICES], *[fmt(get(w, "kl"), 4) for w in SLICES],
                         f"{statistics.mean(sec) * 1e3:.0f}"])  # fmt: skip
        headers = ["", *[f"ppl {w}" for w in SLICES], *[f"KL {w}" for w in SLICES], "ms/layer"]
        out += [f"\n**{gname}**\n", format_table(headers, rows)]
        goals = []
        for name, gptq in [(n, "GPTQ") for n in variants(p)] + [(f"{only}{tag}", f"GPTQ{tag}") for tag, only in extra]:
            line = [name]
            for metric in ("ppl", "kl"):
                get = lambda w, row=name: collect(results, gname, row, w, metric)  # noqa: E731
                base = lambda w: collect(results, gname, gptq, w, metric)  # noqa: E731
                line += [verdict(get(3), base(3), 1.0), verdict(get(4), base(4), 1.01), verdict(get(8), base(8), 1.005),
                         verdict(get(6), get(8), 1.01)]  # fmt: skip
            goals.append(line)
        heads = ["goal →", *[f"{m} {g}" for m in ("ppl", "KL") for g in
                             ("3 ≤ GPTQ-3", "4 ≤ 1.01·GPTQ-4", "8 ≤ 1.005·GPTQ-8", "6 ≤ 1.01·slice-8")]]  # fmt: skip
        out += [f"\nRatios against the goals ({gname}): ✓ met, ✗ missed, tie = within the seeds' spread.\n",
                format_table(heads, goals)]  # fmt: skip
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real-model", action="store_true",
                    help="SmolLM2-135M (make real-model) instead of stories260K: g128 and per channel, GPTQ 3/4/8 and "
                         "the λ = 1,1,4 and default parents, 16 × 2048 tokens scored; ~10 min per seed and grouping on "
                         "2 cores")  # fmt: skip
    ap.add_argument("--fresh", action="store_true", help="ignore cached results in docs/results/<table>.json")
    args = ap.parse_args()
    p = SMOLLM2 if args.real_model else STORIES
    if not (p.model / "config.json").is_file():
        raise SystemExit(f"matgptq_ablation: error: no model at {p.model}; run `make real-model` first")
    out = RESULTS / f"{p.out}.json"
    results = {} if args.fresh or not out.exists() else json.loads(out.read_text())
    if isinstance(results, list):  # the single-seed table of earlier versions
        results = {}
    measure(p, results, out)
    text = page(p, results)
    write_page(RESULTS / f"{p.out}.md", text)
    print(text)


if __name__ == "__main__":
    main()
