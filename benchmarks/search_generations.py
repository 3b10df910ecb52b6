"""What the generations buy (issue #44 items 2-3): on SmolLM2-135M-Instruct, the 10-minute recipe's evolution
(search_ten_minutes.py's pool and generation size) run to a fixed number of generations at the fractional budgets,
its parent scored on held-out text every few generations. A 10-minute run on 2 cores of an AMX host had time for
about 6 generations a budget with equal shares; this says what twice that many buy, whatever the host's speed.

Protocol (search_minutes.py's parent, calibration ranges, held-out text and scoring):
  search    per seed s, one measured child process, no time limit:
              {RECIPE}
            with --calib-range (0.5 + 0.15·s):1 --seed s: the search's own table (every layer alone at every width on
            one 256-token window), its knapsack start (the best one-shot allocation on that window), no refinement,
            then the guided EvoPress generations; the mix file keeps the parent after every generation
  scoring   on the first 4 × 1024 tokens of the first half of WikiText-2 test (never calibrated on), float32, KL to
            the float32 model: the knapsack mix of the search's table (`additive`), the parent after g generations
            (g = 0: the start) and the written mix; `additive 510` (the knapsack of the same table on two windows)
            where --work holds search_ten_minutes' slow child of that seed, made on this host

    python -m benchmarks.search_generations [--seeds 0,1,2]      # ~12 minutes a seed on 2 cores
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks._harness import header, load_json
from benchmarks._search_setup import record_seeds, score_named, search_child, seed_parser, stats
from benchmarks.search_ten_minutes import POOL
from matgptq.execution import format_table

BUDGETS = ("3.25", "3.5")
GENERATIONS = 12
STEP = 3  # the parent is scored after every STEP generations
RECIPE = (*POOL, "--generations", str(GENERATIONS), "--refine-steps", "0")


def main() -> None:
    a = seed_parser(__doc__, "search_generations.json").parse_args()
    record_seeds("search_generations", a, RECIPE, __doc__, measure_seed, page)


def measure_seed(parent: Path, work: Path, seed: int) -> dict:
    """One child searching BUDGETS to GENERATIONS generations; its parents every STEP generations, its knapsack start,
    its written mix and, where made, the slow child's two-window knapsack, scored on the held-out text."""
    done = search_child(parent, work, seed, list(RECIPE), f"generations-seed-{seed}", budgets=BUDGETS)
    slow = work / f"ten-seed-{seed}-slow"
    named, run = {}, {}
    for b, body in done["bodies"].items():
        names = list(body["bits"])
        history = {h["generation"]: h for h in body["history"]}
        named[b] = {"additive": body["dp_bits"], "g0": body["start_bits"],
                    **{f"g{g}": dict(zip(names, history[g]["parent"])) for g in range(STEP, GENERATIONS + 1, STEP)},
                    "written": body["bits"]}  # fmt: skip
        if (slow / f"mix-{b}.json").is_file():
            named[b]["additive 510"] = load_json(slow / f"mix-{b}.json")["dp_bits"]
        run[b] = {"tables": body["summary"]["tables_seconds"], "evolution": body["history"][-1]["seconds"],
                  "generations": body["summary"]["generations"], "chosen": body["summary"]["chosen"]}  # fmt: skip
    scores = score_named(parent, named)
    return {"usage": done["usage"], "budgets": {b: {"scores": scores[b], **run[b]} for b in BUDGETS}}


def page(data: dict) -> str:
    """docs/results/search_generations.md from its JSON."""
    seeds = sorted(data["seeds"], key=int)
    runs = [data["seeds"][s] for s in seeds]
    rows = []
    for b in BUDGETS:
        kinds = [k for k in runs[0]["budgets"][b]["scores"] if all(k in r["budgets"][b]["scores"] for r in runs)]
        kl = {k: [r["budgets"][b]["scores"][k]["kl"] for r in runs] for k in kinds}
        start_kl = statistics.mean(kl["g0"])
        for k in kinds:
            rows.append([b, k, stats(kl[k]), f"{statistics.mean(kl[k]) / start_kl:.3f}×"])
    chosen = [[b, ", ".join(r["budgets"][b]["chosen"] for r in runs)] for b in BUDGETS]
    protocol = data["protocol"].strip().replace(
        "{RECIPE}", f"matgptq search PARENT --budget {','.join(BUDGETS)} --calib wiki.test " + " ".join(data["recipe"]))
    return "\n".join([
        header("benchmarks/search_generations.py", "search_generations.json"), "# What the generations buy", "",
        "```", protocol, "```", "",
        f"Seeds {', '.join(seeds)}; each cell: mean ± sample standard deviation over the seeds. `gN`: the parent "
        "after N generations (g0: the start); `vs start`: the mean KL against g0's:", "",
        format_table(["budget", "mix", "held-out KL", "vs start"], rows), "",
        "The mix each seed wrote (its seconds are in the JSON, not shown: the runs shared the machine with other "
        "work):", "", format_table(["budget", "chosen per seed"], chosen),
    ])  # fmt: skip


if __name__ == "__main__":
    main()
