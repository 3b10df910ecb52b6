"""Which levels the search's loss table should score (issue #44): the additive tables the 10-minute runs measured,
scored up to a level and extrapolated above it (`search --sensitivity-top`), against the tables scored at every level.

Protocol: for each seed of benchmarks/search_ten_minutes.py (its parent, calibration pool and held-out text), the
additive table its timed search measured with `--search-options ''` (every layer alone at each level 2-7, one
255-token window: the record's table until 2026-12-05, now a variant) and the one its slow child measured (the same
on two windows, the first the same window). Each variant keeps that table's levels up to `top` and takes the wider
ones from level `top` by the linearity theorem (sensitivity.extrapolate, the layers' relative weight errors from the
parent), as `matgptq search --sensitivity-top top` does; its knapsack mix per budget is scored on the held-out text
(search_ten_minutes' scoring: KL to the float model and perplexity, 4 × 1024 tokens). No table is measured again:
the variants differ only in which of the same scorings they keep, so a variant's cost is its count of level scorings
per layer (windows × levels scored), the time a table takes being about proportional to it (on this page's host one
level on one window took the timed runs ~42 s for SmolLM2's 210 layers).

    python -m benchmarks.search_table_top [--seeds 0,1,2]     # ~15 minutes on 2 cores, after the variant above
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from fractions import Fraction
from pathlib import Path

from benchmarks._harness import RESULTS, header, load_json, write_atomic, write_page
from benchmarks._search_setup import BUDGETS, LEVELS, score_named, stats
from matgptq.allocation import BudgetKind, CostModel
from matgptq.allocation.allocators import allocate
from matgptq.allocation.sensitivity import extrapolate, weight_errors
from matgptq.execution import format_table
from matgptq.formats import read_checkpoint

ROOT = Path(__file__).resolve().parents[1]
OUT = RESULTS / "search_table_top.json"
# (label, which measured table, highest level kept): None keeps every level
VARIANTS = (("1 window", "search", None), ("1 window, top 5", "search", 5), ("1 window, top 4", "search", 4),
            ("2 windows", "slow", None), ("2 windows, top 5", "slow", 5))  # fmt: skip
REFERENCE = "1 window"  # the timed search's own table


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2", help="seeds of search_ten_minutes' runs")
    ap.add_argument("--work", default=str(ROOT / "runs" / "search-minutes"), help="search_ten_minutes' --work")
    ap.add_argument("--from-json", action="store_true", help="only re-render the page from the JSON")
    return ap


def kept(values: list[list[float]], top: int | None, errors: list[list[float]]) -> list[list[float]]:
    """The table with its levels above `top` extrapolated from `top` (the product's formula); `values` as measured."""
    if top is None:
        return values
    measured = {r: [row[i] for row in values] for i, r in enumerate(LEVELS[:-1]) if r <= top}
    return extrapolate(LEVELS, values[0][-1], measured, errors)


def full_tables(work: Path, seed: int) -> dict[str, dict]:
    """{"search": the timed run's additive table, "slow": the slow child's}; exits where either is not scored at every
    level on one window set (a recipe that cut it, by a deadline, --sensitivity-top or --sensitivity-wide): the page's
    variants are cuts of a full table."""
    saved = {k: load_json(work / f"ten-seed-{seed}{suffix}" / ".tables.json")
             for k, suffix in (("search", ""), ("slow", "-slow"))}  # fmt: skip
    for k, body in saved.items():
        measured, wide = body["tables"]["additive"]["measured"], "sensitivity_wide" in body["settings"]
        if measured != list(LEVELS[:-1]) or wide:
            sys.exit(f"search_table_top: error: seed {seed}'s {k} table scored widths {measured}"
                     f"{' on two window sets' if wide else ''}, not every width {LEVELS[0]}-{LEVELS[-2]} on one: "
                     "its cuts are not this page's variants")  # fmt: skip
    return {k: body["tables"]["additive"] for k, body in saved.items()}


def measure(work: Path, seeds: list[int]) -> dict:
    import matgptq

    measured = {seed: full_tables(work, seed) for seed in seeds}  # every seed checked before any is scored
    parent = work / "parent"
    cost = CostModel.from_checkpoint(read_checkpoint(parent), LEVELS)
    errors = weight_errors(matgptq.load(parent, bits=LEVELS[-1], packed=False).matgptq.layers, cost.names, LEVELS)
    runs = {}
    for seed in seeds:
        tables = measured[seed]
        named = {b: {label: dict(zip(cost.names, allocate(cost, kept(tables[k]["table"], top, errors), Fraction(b),
                                                          BudgetKind.CODE)))
                     for label, k, top in VARIANTS} for b in BUDGETS}  # fmt: skip
        runs[str(seed)] = score_named(parent, named)
    return {"protocol": __doc__, "seeds": runs,
            "cost": {label: (2 if k == "slow" else 1) * sum(1 for r in LEVELS[:-1] if top is None or r <= top)
                     for label, k, top in VARIANTS}}  # fmt: skip


def page(data: dict) -> str:
    seeds = sorted(data["seeds"])
    runs = [data["seeds"][s] for s in seeds]
    labels = [label for label, _, _ in VARIANTS]
    rows = []
    for b in BUDGETS:
        kl = {k: [r[b][k]["kl"] for r in runs] for k in labels}
        ref = statistics.mean(kl[REFERENCE])
        rows.append([b, *(f"{stats(kl[k])} ({statistics.mean(kl[k]) / ref:.3f}×)" for k in labels)])
    return "\n".join([
        header("benchmarks/search_table_top.py", "search_table_top.json"),
        "# The search's table: which levels to score", "", "```", data["protocol"].strip(),
        "```", "", f"Held-out KL of each table's knapsack mix, mean ± standard deviation over seeds {', '.join(seeds)}, "
        f"and its ratio to `{REFERENCE}` (the timed one-window table). Level scorings per layer: "
        + ", ".join(f"{k} {data['cost'][k]}" for k in labels) + ".", "",
        format_table(["budget", *labels], rows), ""])  # fmt: skip


def main() -> None:
    a = build_parser().parse_args()
    if not a.from_json:
        seeds = [int(s) for s in a.seeds.split(",")]
        missing = [s for s in seeds for suffix in ("", "-slow")
                   if not (Path(a.work) / f"ten-seed-{s}{suffix}" / ".tables.json").is_file()]  # fmt: skip
        if missing:
            sys.exit(f"search_table_top: error: no tables of seed {missing[0]} in {a.work}; run `python -m "
                     f"benchmarks.search_ten_minutes --seeds {missing[0]} --search-options '' --out "
                     "docs/results/search_ten_minutes_variants/every-level-one-window.json` first")  # fmt: skip
        write_atomic(OUT, json.dumps(measure(Path(a.work), seeds), indent=1))
    text = page(load_json(OUT))
    write_page(OUT.with_suffix(".md"), text)
    print(text)


if __name__ == "__main__":
    main()
