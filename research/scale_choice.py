#!/usr/bin/env python
"""How GPTQ's group scales are chosen: the plain --mse search, weighted by the Hessian diagonal (--mse-weighted), refit
to the codes by least squares (--refit-scales), or both — perplexity and KL per calibration seed.

Setting: GPTQ at the GGUF Q4_0 layout the llama.cpp comparison uses (benchmarks/gguf_vs_llamacpp_real.py): group 32,
llama.cpp's signed grid (--signed-scale), act-order + static groups, --mse. Protocols (models, calibration and
held-out text, token counts) are matgptq_ablation.py's: stories260K (GPTQ-3 and -4) and, with --real-model,
SmolLM2-135M-Instruct (GPTQ-4). Seeds 0-2. Resumable: every run is kept in docs/results/scale_choice.json as it
finishes. Writes docs/results/scale_choice.md (rendered from the JSON alone: `python -m benchmarks.render_docs`).

    python -m research.scale_choice [--real-model] [--variants plain,both] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics

from benchmarks._harness import RESULTS, header, write_page
from research.matgptq_ablation import SMOLLM2, STORIES, Protocol, setting

from matgptq.api import make_config
from matgptq.execution import format_table
from matgptq.evaluation.perplexity import score
from matgptq.models.text import calibration_windows
from matgptq.quantization.pipeline import quantize_model

STATE = RESULTS / "scale_choice.json"
LAYOUT = dict(group_size=32, signed_scale=True, act_order=True, static_groups=True, mse=True)
VARIANTS = {  # name -> options beyond LAYOUT
    "plain": {},
    "weighted": dict(mse_weighted=True),
    "refit": dict(refit_scales=True),
    "both": dict(mse_weighted=True, refit_scales=True),
}


def widths(p: Protocol) -> tuple[int, ...]:
    return (3, 4) if p is STORIES else (4,)


def measure(p: Protocol, names: list[str], seeds: list[int], results: dict) -> None:
    todo = [(n, b, s) for s in seeds for b in widths(p) for n in names if f"{p.name}|{n}|{b}|{s}" not in results]
    if not todo:
        return
    calib_tokens, windows, fp, batch, teacher = setting(p)
    for name, bits, seed in todo:
        model = copy.deepcopy(fp)
        cfg = make_config("gptq", bits, **LAYOUT, **VARIANTS[name])
        _, reports, _ = quantize_model(model, calibration_windows(calib_tokens, p.nsamples, p.seqlen, seed), cfg,
                                       progress=False)  # fmt: skip
        s = score(model, windows, teacher, batch)  # the model now holds the dequantized weights
        key = f"{p.name}|{name}|{bits}|{seed}"
        results[key] = {"ppl": s.ppl, "kl": s.kl, "seconds_per_layer": sum(r.seconds for r in reports) / len(reports)}
        tmp = STATE.with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=1))
        tmp.replace(STATE)
        print(key, results[key], flush=True)


def page(results: dict) -> str:
    """docs/results/scale_choice.md from its JSON."""
    return header("research/scale_choice.py", "scale_choice.json") + "\n" + render(results) + "\n"


def render(results: dict) -> str:
    out = ["GPTQ, group 32, `--signed-scale --act-order --static-groups --mse` plus the options named; mean ± std over "
           "the calibration seeds measured (n); ratios are to `plain` of the same seeds. Protocols of "
           "research/matgptq_ablation.py. ms/layer is the solver's time per layer as this run measured it, on a "
           "machine shared with other runs: not a cost measurement."]  # fmt: skip
    for p in (STORIES, SMOLLM2):
        rows = []
        for bits in widths(p):
            for name in VARIANTS:
                runs = {int(k.split("|")[3]): v for k, v in results.items() if k.startswith(f"{p.name}|{name}|{bits}|")}
                base = {int(k.split("|")[3]): v for k, v in results.items() if k.startswith(f"{p.name}|plain|{bits}|")}
                seeds = sorted(set(runs) & set(base))
                if not seeds:
                    continue
                cell = []
                for m, d in (("ppl", 3), ("kl", 4)):
                    v = [runs[s][m] for s in seeds]
                    sd = statistics.stdev(v) if len(v) > 1 else 0.0
                    ratio = statistics.mean(v) / statistics.mean(base[s][m] for s in seeds)
                    cell += [f"{statistics.mean(v):.{d}f} ± {sd:.{d}f}", f"{ratio:.3f}"]
                ms = statistics.mean(runs[s]["seconds_per_layer"] for s in seeds) * 1e3
                rows.append([f"GPTQ-{bits}", name, str(len(seeds)), *cell, f"{ms:.0f}"])
        if rows:
            out += [f"\n**{p.name}**\n", format_table(["", "scales", "n", "ppl", "÷ plain", "KL", "÷ plain", "ms/layer"],
                                                       rows)]  # fmt: skip
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real-model", action="store_true", help="SmolLM2-135M (make real-model) instead of stories260K")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--seeds", default="0,1,2", help="calibration seeds")
    ap.add_argument("--render-only", action="store_true", help="only re-render the page from the JSON")
    a = ap.parse_args()
    names = [n for n in a.variants.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"scale_choice: error: unknown variant {unknown[0]!r}; use {', '.join(VARIANTS)}")
    p = SMOLLM2 if a.real_model else STORIES
    if not (p.model / "config.json").is_file():
        raise SystemExit(f"scale_choice: error: no model at {p.model}; run `make real-model` first")
    results = json.loads(STATE.read_text()) if STATE.is_file() else {}
    if not a.render_only:
        measure(p, names, [int(s) for s in a.seeds.split(",")], results)
    text = page(results)
    write_page(RESULTS / "scale_choice.md", text)
    print(text)


if __name__ == "__main__":
    main()
