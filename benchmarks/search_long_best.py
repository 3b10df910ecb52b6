"""The default evolution from the best one-shot start (issue #44 item 2): on SmolLM2-135M-Instruct at 3.25 and 3.5
bits, where the 10-minute search ties the best one-shot allocation, does compute alone get clearly below it when the
evolution starts from the best measured table's allocation?

Protocol: per seed of benchmarks/search_ten_minutes.py's record (its parent and seed s's calibration range, its
held-out text and its held-out scores of every one-shot allocation), the record's slow child's table (every layer
alone at every width on two windows; its knapsack is `additive 510`) and, in this process:
  evolved       evopress.evolve from `additive 510`, guided by that table, at the command's defaults (25 generations,
                16 offspring, stages 512:4,2048:2,4096:1, mutation temperature 0.5, bfloat16 scoring, seed s) on the
                default pool: the first 16,384 tokens (64 windows of 256) of seed s's calibration range; its state
                in --work (long-best-B-seed-S.state.json), so a stopped run resumes where it stopped
  scoring       on the first 4 × 1024 tokens of the first half of WikiText-2 test (never calibrated on), float32, KL to
                the float32 model: `evolved`, and `additive 510` again, which must give the record's score (the same
                parent and text); against the record's best one-shot allocation at that budget (the lowest mean over
                these seeds of its uniform, additive, additive 510, probe, noise, error, gradient and random mixes), a
                tie within the larger seed spread (search_baselines.verdict), and seed by seed (paired: the same
                calibration text); the record's written mix (the 10-minute search) beside them

    python -m benchmarks.search_long_best [--seeds 0,1,2]   # ~25 minutes a seed on 2 cores, after search_ten_minutes
"""

from __future__ import annotations

import statistics
from fractions import Fraction
from pathlib import Path

import torch

import matgptq
from benchmarks._harness import RESULTS, load_json
from benchmarks._search_setup import (LEVELS, MODEL, calib_windows, page_top, score_named, seed_parser, seeds_named,
                                      stats)
from benchmarks.search_baselines import verdict
from benchmarks.search_ten_minutes import ONE_SHOT, record_on_record
from matgptq.allocation import BudgetKind, CostModel
from matgptq.allocation.evopress import EvoConfig, evolve
from matgptq.allocation.fitness import Fitness
from matgptq.allocation.sensitivity import knapsack_mix
from matgptq.evaluation.teacher import Teacher
from matgptq.execution import format_table
from matgptq.formats import read_checkpoint

BUDGETS = ("3.25", "3.5")
POOL = 64  # the command's default --calib-tokens 16384: 64 windows of 256
RECIPE = ("--record", "search_ten_minutes", "--start", "additive 510", "--budgets", *BUDGETS, "--evolution",
          "defaults")  # fmt: skip


def build_parser():
    return seed_parser(__doc__, "search_long_best.json")


def slow_body(work: Path, seed: int, budget: str) -> dict:
    """The record's slow child's mix file of `budget`; exits, naming the command that makes it, where it is missing."""
    path = work / f"ten-seed-{seed}-slow" / f"mix-{budget}.json"
    if not path.is_file():
        raise SystemExit(f"search_long_best: error: no {path}; run `python -m benchmarks.search_ten_minutes --seeds "
                         f"{seed}` first (or give its --work)")  # fmt: skip
    return load_json(path)


def record_scores(seed: int) -> dict:
    """The record's held-out scores of seed `seed` by budget; exits, naming the command that makes them, where the
    record lacks that seed."""
    path = RESULTS / "search_ten_minutes.json"
    seeds = load_json(path)["seeds"] if path.is_file() else {}
    if str(seed) not in seeds:
        raise SystemExit(f"search_long_best: error: {path} has no seed {seed}; run `python -m "
                         f"benchmarks.search_ten_minutes --seeds {seed}` first")  # fmt: skip
    return seeds[str(seed)]["budgets"]


def measure(parent: Path, work: Path, seed: int) -> dict:
    cost = CostModel.from_checkpoint(read_checkpoint(parent), LEVELS)
    names, config = cost.names, EvoConfig(seed=seed)
    recorded = record_scores(seed)
    tables = {b: [[body["sensitivity"][n][str(r)] for r in LEVELS] for n in names]
              for b in BUDGETS for body in [slow_body(work, seed, b)]}  # fmt: skip
    windows = calib_windows(seed, POOL)
    named, runs = {}, {}
    with Teacher(matgptq.load(MODEL), windows) as teacher:
        fitness = Fitness(matgptq.load(parent, bits=8, packed=False), teacher, windows, names,
                          compute_dtype=torch.bfloat16)  # fmt: skip
        for b, table in tables.items():
            start = knapsack_mix(cost, table, Fraction(b), BudgetKind.CODE)
            state = evolve(fitness, LEVELS, cost.table(BudgetKind.CODE), cost.limit(Fraction(b), BudgetKind.CODE),
                           start, config, work / f"long-best-{b}-seed-{seed}.state.json", config.settings(),
                           resume=True, table=table)  # fmt: skip
            named[b] = {"additive 510": dict(zip(names, start)), "evolved": dict(zip(names, state.parent))}
            runs[b] = {"generations": state.generation, "evolution_seconds": round(state.seconds, 1),
                       "pool_kl": [h["kl"] for h in state.history]}  # fmt: skip
    held = score_named(parent, named)
    out = {}
    for b in BUDGETS:
        record = {k: v["kl"] for k, v in recorded[b]["scores"].items() if k in (*ONE_SHOT, "written")}
        if abs(held[b]["additive 510"]["kl"] - record["additive 510"]) > 1e-6:  # the same arithmetic on the same mix
            raise SystemExit(f"search_long_best: error: seed {seed}'s `additive 510` at {b} bits scores "
                             f"{held[b]['additive 510']['kl']:.6f} here, {record['additive 510']:.6f} in the record: "
                             "another parent or text; re-run search_ten_minutes in this --work first")  # fmt: skip
        out[b] = {"held_out": {**record, "evolved": held[b]["evolved"]["kl"]}, **runs[b]}
    return out


def page(data: dict) -> str:
    seeds = sorted(data["seeds"])
    runs = [data["seeds"][s] for s in seeds]
    rows, cost = [], []
    for b in BUDGETS:
        kl = {k: [r[b]["held_out"][k] for r in runs] for k in (*ONE_SHOT, "written", "evolved")}
        best = min(ONE_SHOT, key=lambda k: statistics.fmean(kl[k]))
        for k in (best, "written", "evolved"):
            rows.append([b, k if k != best else f"{k} (best one-shot)", stats(kl[k]),
                         "—" if k == best else verdict(kl[k], kl[best]) + " (1 seed)" * (len(runs) == 1),
                         f"{statistics.fmean(kl[k]) / statistics.fmean(kl[best]):.3f}×",
                         " ".join(f"{x / y:.3f}" for x, y in zip(kl[k], kl[best]))])  # fmt: skip
        cost += [[b, s, r[b]["generations"], f"{r[b]['evolution_seconds']:.0f}"] for s, r in zip(seeds, runs)]
    return "\n".join([
        *page_top("search_long_best", "The default evolution from the best one-shot start", data),
        f"{seeds_named(seeds)}. Held-out KL (mean ± sample standard deviation over the "
        "seeds), the verdict against the record's best one-shot allocation (a tie within the larger seed spread), "
        "their mean KLs' ratio, and the ratio seed by seed:", "",
        format_table(["budget", "mix", "held-out KL", "vs best one-shot", "ratio", "per seed"], rows), "",
        "The evolution's generations and seconds on 2 cores (kept across a resume):", "",
        format_table(["budget", "seed", "generations", "evolution s"], cost), ""])  # fmt: skip


def main() -> None:
    record_on_record("search_long_best", build_parser().parse_args(), RECIPE, __doc__, measure, page)


if __name__ == "__main__":
    main()
