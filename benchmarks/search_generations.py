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

--generations and --search-options (appended to the command above; a later option replaces an earlier one, e.g.
--calib-tokens 4080) measure a variant, into its own --out and mix folders named after its options:

    python -m benchmarks.search_generations --generations 18 --out docs/results/search_generations_big_pool.json \
        --search-options '--sensitivity-wide 4:510 --sensitivity-top 5 --calib-tokens 4080 --stages 255:2,1020:1'
"""

from __future__ import annotations

import shlex
import statistics
from pathlib import Path

from benchmarks._harness import header, load_json
from benchmarks._search_setup import (folder_suffix, record_seeds, score_named, search_child, seed_parser,
                                      split_options, stats)
from benchmarks.search_ten_minutes import POOL
from matgptq.execution import format_table

BUDGETS = ("3.25", "3.5")
GENERATIONS = 12
STEP = 3  # the parent is scored after every STEP generations


def recipe(generations: int = GENERATIONS, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The search's options: the 10-minute pool, `generations` of them, no refinement, then `extra`."""
    return (*POOL, "--generations", str(generations), "--refine-steps", "0", *extra)


def main() -> None:
    ap = seed_parser(__doc__, "search_generations.json")
    ap.add_argument("--generations", type=int, default=GENERATIONS, help="generations per budget (a multiple of "
                    f"{STEP}: the parent is scored every {STEP}); default %(default)s")
    ap.add_argument("--search-options", default="", metavar="OPTIONS",
                    help="more search options after the recipe's, replacing its own where they repeat one")
    a = ap.parse_args()
    extra = split_options(ap, a.search_options)
    if a.generations < STEP or a.generations % STEP:
        ap.error(f"--generations: give a positive multiple of {STEP}, got {a.generations}")
    variant = (a.generations, extra) != (GENERATIONS, ())
    if variant and Path(a.out).resolve() == Path(ap.get_default("out")).resolve():
        ap.error("--generations or --search-options measure another recipe, which would replace the record at --out; "
                 "give it its own --out")  # fmt: skip
    name = "generations" + (folder_suffix([f"g{a.generations}", *extra]) if variant else "")
    measure = lambda parent, work, seed: measure_seed(parent, work, seed, recipe(a.generations, extra),  # noqa: E731
                                                      a.generations, name)  # fmt: skip
    record_seeds("search_generations", a, recipe(a.generations, extra), __doc__, measure,
                 lambda data: page(data, Path(a.out).name))  # fmt: skip


def page_big_pool(data: dict) -> str:
    """docs/results/search_generations_big_pool.md (the variant in this module's docstring) from its JSON."""
    return page(data, "search_generations_big_pool.json")


def measure_seed(parent: Path, work: Path, seed: int, options: tuple[str, ...] = recipe(),
                 generations: int = GENERATIONS, name: str = "generations") -> dict:  # fmt: skip
    """One child searching BUDGETS to `generations` generations with `options` (in --work/`name`-seed-S); its parents
    every STEP generations, its knapsack start, its written mix and, where made, the slow child's two-window knapsack,
    scored on the held-out text."""
    done = search_child(parent, work, seed, list(options), f"{name}-seed-{seed}", budgets=BUDGETS)
    slow = work / f"ten-seed-{seed}-slow"
    named, run = {}, {}
    for b, body in done["bodies"].items():
        names = list(body["bits"])
        history = {h["generation"]: h for h in body["history"]}
        named[b] = {"additive": body["dp_bits"], "g0": body["start_bits"],
                    **{f"g{g}": dict(zip(names, history[g]["parent"])) for g in range(STEP, generations + 1, STEP)},
                    "written": body["bits"]}  # fmt: skip
        if (slow / f"mix-{b}.json").is_file():
            named[b]["additive 510"] = load_json(slow / f"mix-{b}.json")["dp_bits"]
        run[b] = {"tables": body["summary"]["tables_seconds"], "evolution": body["history"][-1]["seconds"],
                  "generations": body["summary"]["generations"], "chosen": body["summary"]["chosen"]}  # fmt: skip
    scores = score_named(parent, named)
    return {"usage": done["usage"], "budgets": {b: {"scores": scores[b], **run[b]} for b in BUDGETS}}


def page(data: dict, source: str = "search_generations.json") -> str:
    """docs/results/search_generations.md from its JSON (a variant's page from its own, `source`)."""
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
    extra = data["recipe"][len(recipe()):]  # a variant's options after the record's (its generations replaced)
    generations = data["recipe"][data["recipe"].index("--generations") + 1]
    variant = [] if data["recipe"] == list(recipe()) else [
        f"A variant of search_generations.md's record: {generations} generations, and `{shlex.join(extra)}` after the "
        "record's options, replacing those they repeat (the command below); where the protocol's prose names the "
        "table or the pool, these options change it.", ""]  # fmt: skip
    return "\n".join([
        header("benchmarks/search_generations.py", source), "# What the generations buy", "", *variant,
        "```", protocol, "```", "",
        f"Seeds {', '.join(seeds)}; each cell: mean ± sample standard deviation over the seeds. `gN`: the parent "
        "after N generations (g0: the start); `vs start`: the mean KL against g0's:", "",
        format_table(["budget", "mix", "held-out KL", "vs start"], rows), "",
        "The mix each seed wrote (its seconds are in the JSON, not shown: the record's runs shared the machine with "
        "other work):", "", format_table(["budget", "chosen per seed"], chosen),
    ])  # fmt: skip


if __name__ == "__main__":
    main()
