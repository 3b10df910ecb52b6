"""The search against the one-shot allocators (issue #44): per budget and calibration seed, on one parent and one
calibration, the mix `matgptq search` writes against every allocation it could have returned instead.

Protocol (stories260K, as benchmarks/search_results.py): for each seed s, a MatGPTQ parent (c = 8, R = {2,3,4,6,8},
symmetric, per-channel) calibrated on 128 × 256 tokens drawn with seed s from the last 40% of tinystories_val_head.txt;
the search's own fitness on the first 16,384 tokens of that 40% (search_results.search_fitness); the one-shot tables
below on its first 2,048 scored tokens (nine windows: probe's default --sensitivity-tokens). Rows per budget:
  uniform     the widest uniform slice within the budget
  probe       the knapsack start of `search --sensitivity probe` (one probe per layer)
  additive    every layer scored alone at every width, knapsack (the measured additive model)
  noise       ExLlamaV3's noise injection: two probes per layer, power law, knapsack
  error       llama.cpp's --target-bpw idea: imatrix-weighted weight error, no forward pass per candidate, knapsack
  gradient    first order at the uniform slice under the budget, knapsack above it (one backward pass per floor)
  random      random budget-filling mixes through the search's selection stages, as many scorings as the search
  written     the mix `matgptq search` writes with its default settings (--seed s): since 2026-11-28 its start is
              the additive table on one window (--sensitivity full), before it was the probe table; since
              2026-12-03 its children follow that table (--mutation-temperature 0.5), before they were uniform
Each mix is scored on held-out text (the first 40,000 tokens of the first 60%: KL to the fp32 model and perplexity)
and on the whole calibration pool (`calib KL`). `seconds`: what the allocation cost on this machine — a table's fill
(shared by every budget of a seed) or the search's own time for the budget (its first budget includes its tables).
A difference between `written` and the best baseline within the larger of their seed spreads is reported as a tie.

    python -m benchmarks.search_baselines [--seeds 0,1,2] [--budgets 2.5,2.75,3.0,3.25,3.5,4.0,5.0,6.0]
        [--out docs/results/search_baselines.json]        # ~30 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import torch

import matgptq
from benchmarks._harness import RESULTS, header, load_json, write_page
from benchmarks.search_results import MODEL, TEXT, held_out_and_calib, random_search, search_fitness
from matgptq.allocation import BudgetKind, EvoConfig, SearchRequest, run_search
from matgptq.allocation.allocators import Allocator, allocate, raise_floors, tables
from matgptq.evaluation.perplexity import Teacher
from matgptq.execution import format_table
from matgptq.models import eval_windows, load_tokenizer, read_text, tokenize

TABLES = (Allocator.PROBE, Allocator.ADDITIVE, Allocator.NOISE, Allocator.ERROR, Allocator.GRADIENT)
KINDS = ("uniform", *(a.value for a in TABLES), "random", "written")
SENSITIVITY_WINDOWS = 9  # ceil(2048 / 255): --sensitivity probe's default --sensitivity-tokens, 256-token windows


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2", help="calibration (and search) seeds")
    ap.add_argument("--budgets", default="2.5,2.75,3.0,3.25,3.5,4.0,5.0,6.0", help="code bits per weight")
    ap.add_argument("--out", default=str(RESULTS / "search_baselines.json"), help="the JSON; its page goes beside it")
    ap.add_argument("--from-json", action="store_true", help="only re-render the page from --out")
    ap.add_argument("--note", help="a remark on the run shown under its table (e.g. what shared the machine with "
                                   "it); with --from-json, recorded into --out's run")  # fmt: skip
    return ap


def main() -> None:
    a = build_parser().parse_args()
    out = Path(a.out)
    if not a.from_json:
        torch.set_num_threads(1)
        rows = []
        for seed in (int(s) for s in a.seeds.split(",")):
            rows += measure_seed(seed, tuple(a.budgets.split(",")))
        data = {"protocol": __doc__, "rows": rows, "threads": torch.get_num_threads()}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({**data, **({"note": a.note} if a.note else {})}, indent=1))
    elif a.note:
        out.write_text(json.dumps({**load_json(out), "note": a.note}, indent=1))
    text = page(load_json(out))
    write_page(out.with_suffix(".md"), text)
    print(text)


def measure_seed(seed: int, budgets: tuple[str, ...]) -> list[dict]:
    """Every row of one calibration seed: the parent, the allocators' tables, the search, random search, scores."""
    tok = load_tokenizer(MODEL)
    held_out = eval_windows(tokenize(tok, read_text(TEXT, (0.0, 0.6))), 256, 40_000)
    teacher = Teacher(matgptq.load(MODEL), held_out, 32)
    with tempfile.TemporaryDirectory() as tmp:
        parent = Path(tmp) / "parent"
        matgptq.quantize(MODEL, parent, calib=TEXT, calib_range=(0.6, 1.0), method="matgptq", bits=(2, 3, 4, 6, 8),
                         nsamples=128, seqlen=256, seed=seed, progress=False)  # fmt: skip
        fit, cost = search_fitness(parent, MODEL, TEXT, (0.6, 1.0), tok)
        floors = raise_floors(cost, [Fraction(b) for b in budgets], BudgetKind.CODE)
        filled = tables(fit, cost.levels, tuple(range(SENSITIVITY_WINDOWS)), TABLES, seed, floors=floors)
        req = SearchRequest(parent=parent, budgets=budgets, calib=TEXT, out=Path(tmp) / "mixes", calib_range=(0.6, 1.0),
                            evo=EvoConfig(seed=seed), progress=False)  # fmt: skip
        searched = {r["budget"]: r for r in run_search(req)}
        rows = []
        for label in budgets:
            mixes, seconds = budget_mixes(fit, cost, filled, searched[label], req, seed)
            for kind, mix in mixes.items():
                rows.append({"seed": seed, "budget": label, "kind": kind, "bits": cost.average(mix, BudgetKind.CODE),
                             "seconds": seconds[kind], **held_out_and_calib(fit, mix, held_out, teacher)})  # fmt: skip
            print(f"seed {seed} budget {label}: " + ", ".join(f"{r['kind']} {r['kl']:.4f}" for r in rows[-len(mixes):]),
                  flush=True)  # fmt: skip
        fit.teacher.close()
    teacher.close()
    return rows


def budget_mixes(fit, cost, filled: dict, row: dict, req: SearchRequest, seed: int) -> tuple[dict, dict]:
    """({kind: mix}, {kind: seconds}) at one budget: the allocators', random search's and the written mix."""
    budget = Fraction(row["budget"])
    mixes = {"uniform": allocate(cost, None, budget, BudgetKind.CODE)}
    seconds = {"uniform": 0.0}
    for a, (table, s, _) in filled.items():
        mixes[a.value], seconds[a.value] = allocate(cost, table, budget, BudgetKind.CODE), s
    t0 = time.perf_counter()
    mixes["random"] = random_search(fit, cost.levels, cost.table(BudgetKind.CODE), cost.limit(budget, BudgetKind.CODE),
                                    row["evaluations"], req.evo, seed)  # fmt: skip
    seconds["random"] = time.perf_counter() - t0
    written = json.loads((req.out / f"mix-{row['budget']}.json").read_text())["bits"]
    mixes["written"], seconds["written"] = tuple(written[n] for n in cost.names), row["seconds"]
    return mixes, seconds


def _stats(xs: list[float]) -> tuple[float, float]:
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def verdict(written: list[float], best: list[float]) -> str:
    """below / tie / above: the written mix's mean held-out KL against the best baseline's, a tie within the larger
    of the two seed spreads (sample standard deviations)."""
    (w, sw), (b, sb) = _stats(written), _stats(best)
    spread = max(sw, sb)
    return "tie" if abs(w - b) <= spread else ("below" if w < b else "above")


def page(data: dict) -> str:
    """docs/results/search_baselines.md from its JSON."""
    rows = data["rows"]
    seeds = sorted({r["seed"] for r in rows})
    budgets = sorted({r["budget"] for r in rows}, key=float)
    by = {(b, k): [r for r in rows if r["budget"] == b and r["kind"] == k] for b in budgets for k in KINDS}
    fmt = lambda xs, d=4: "{:.{d}f} ± {:.{d}f}".format(*_stats(xs), d=d)  # noqa: E731
    table, summary = [], []
    for b in budgets:
        for k in KINDS:
            sel = by[(b, k)]
            if sel:
                table.append([b, k, f"{statistics.mean(r['bits'] for r in sel):.3f}", fmt([r["kl"] for r in sel]),
                              fmt([r["ppl"] for r in sel], 3), fmt([r["calib_kl"] for r in sel]),
                              f"{statistics.mean(r['seconds'] for r in sel):.1f}"])  # fmt: skip
        baselines = [k for k in KINDS if k != "written" and by[(b, k)]]
        best = min(baselines, key=lambda k: statistics.mean(r["kl"] for r in by[(b, k)]))
        written = [r["kl"] for r in by[(b, "written")]]
        summary.append([b, best, fmt([r["kl"] for r in by[(b, best)]]), fmt(written),
                        verdict(written, [r["kl"] for r in by[(b, best)]])])  # fmt: skip
    return "\n".join([
        header("benchmarks/search_baselines.py", "search_baselines.json"), "# The search against one-shot allocators",
        "", "```", data["protocol"].strip(), "```", "",
        f"Mean ± sample standard deviation over seeds {seeds}; {data['threads']} thread(s).", "",
        *([f"Note: {data['note']}", ""] if data.get("note") else []),
        "Per budget, the written mix against the best baseline (lowest mean held-out KL):", "",
        format_table(["budget", "best baseline", "its held-out KL", "written held-out KL", "written vs best"], summary),
        "", "Every row:", "",
        format_table(["budget", "allocation", "code bits", "held-out KL", "held-out ppl", "calib KL", "seconds"], table),
    ])


if __name__ == "__main__":
    main()
