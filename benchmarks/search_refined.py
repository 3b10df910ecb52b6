"""The refined start (issue #44 items 1-2): on SmolLM2-135M-Instruct, does the measured refinement of the search's
start (allocation/refine.py) go below the best one-shot allocation, and what does it cost?

Protocol (search_long.py's parent, calibration ranges, held-out text and scoring; every allocation made in one child
per seed, on the same parent and calibration):
  search    per seed s, one measured child process (wall, CPU, peak RSS):
              {RECIPE}
            with --calib-range (0.5 + 0.15·s):1 --seed s, i.e. search_long's one-shot tables on the same 256-token
            window (every layer scored at every width: the additive model, the knapsack start), the same baselines,
            then each budget's start refined with the defaults (at most 12 steps, the layers in 3 groups; each step
            measures one group a level up and down on that window and is kept only if the pool's other 7 windows
            agree), no evolution; the written mix chosen on the 8-window pool (allocation/choice.py)
  scoring   on the first 4 × 1024 tokens of the first half of WikiText-2 test (never calibrated on), float32, KL to
            the float32 model and perplexity: the one-shot allocations (uniform, additive, probe, noise, error,
            gradient; search_long.py's list), the refined start, the written mix; the written mix against the best
            one-shot allocation, a tie within the larger of the two seed spreads (search_baselines.verdict)

    python -m benchmarks.search_refined [--seeds 0,1,2] [--budgets 2.5,2.75,3.25,3.5]   # ~25 minutes a seed
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from benchmarks._harness import header, write_results
from benchmarks._search_setup import score_named, search_child, start
from benchmarks.search_long import ONE_SHOT, cost_rows, kl_rows, one_shot_mixes, usage_rows
from benchmarks.search_long import build_parser as long_parser
from benchmarks.search_long import per_budget as long_per_budget
from benchmarks.search_long import RECIPE_BEFORE as LONG_TABLES
from matgptq.execution import format_table

RECIPE = (*LONG_TABLES, "--calib-tokens", "2040", "--generations", "0")  # search_long's tables, refined, no evolution
KINDS = (*ONE_SHOT, "refined", "written")


def build_parser() -> argparse.ArgumentParser:
    return long_parser(__doc__, "search_refined.json")


def main() -> None:
    a = build_parser().parse_args()
    out, budgets = Path(a.out), [f"{b:g}" for b in a.budgets]
    parent, data = start(Path(a.work), out, RECIPE, __doc__)
    for seed in a.seeds:
        data["seeds"][str(seed)] = measure_seed(parent, Path(a.work), seed, budgets)
        write_results(out.with_suffix(".md"), data, page(data))  # after every seed: a stopped run keeps the rest


def measure_seed(parent: Path, work: Path, seed: int, budgets: list[str]) -> dict:
    """One child making every allocation of `budgets`, each scored on the held-out text."""
    done = search_child(parent, work, seed, list(RECIPE), f"refined-seed-{seed}", budgets=tuple(budgets))
    scores = score_named(parent, one_shot_mixes(parent, done["bodies"], refined="start_bits", written="bits"))
    keys = ("chosen", "refine_steps", "refine_accepted", "refine_seconds", "tables_seconds")
    return {"usage": done["usage"], "budgets": {b: {"scores": scores[b], **{k: body["summary"][k] for k in keys}}
                                                for b, body in done["bodies"].items()}}  # fmt: skip


def per_budget(data: dict):
    return long_per_budget(data, KINDS)


def page(data: dict) -> str:
    """docs/results/search_refined.md from its JSON."""
    seeds, runs, rows = per_budget(data)
    budgets = [b for b, _, _ in rows]
    quality, perplexity = kl_rows(runs, rows, KINDS)
    cost = cost_rows(runs, rows, " ", lambda rec: f"{rec['refine_accepted']}/{rec['refine_steps']}", "refine_seconds")
    usage = usage_rows(seeds, runs, budgets)
    protocol = data["protocol"].strip().replace("{RECIPE}", "matgptq search PARENT --budget " + ",".join(budgets)
                                                + " --calib wiki.test " + " ".join(data["recipe"]))  # fmt: skip
    return "\n".join([
        header("benchmarks/search_refined.py", "search_refined.json"), "# The refined start", "",
        "```", protocol, "```", "",
        f"Seeds {', '.join(seeds)}; each cell: mean ± sample standard deviation over the seeds (one seed: its value).",
        "", "Held-out KL to the float32 model; `written vs best`: the written mix against the best one-shot allocation:",
        "", format_table(["budget", *KINDS, "best one-shot", "written vs best", "written / best"], quality), "",
        "Held-out perplexity of the same mixes:", "", format_table(["budget", *KINDS], perplexity), "",
        "What each budget's refinement cost (steps kept/made, per seed):", "",
        format_table(["budget", "steps kept/made per seed", "refinement s (mean)", "chosen per seed"], cost), "",
        "Each child (one per seed, all budgets; tables: the shared tables' seconds):", "",
        format_table(["seed", "wall s", "CPU s", "peak RSS GB", "tables s", "load"], usage),
        *notes(seeds, runs),
    ])  # fmt: skip


def notes(seeds: list[str], runs: list[dict]) -> list[str]:
    """A remark per seed on what its numbers do not say (e.g. a machine shared with other work), under the tables."""
    lines = [f"- seed {s}: {r['note']}" for s, r in zip(seeds, runs) if r.get("note")]
    return [""] + lines if lines else []


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(2)
    main()
