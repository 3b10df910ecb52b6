"""The search in minutes (issue #44 item 3): all eight budgets of SmolLM2-135M-Instruct under `--time-limit`, timed,
and every mix it writes or could have written scored on held-out text.

Protocol:
  parent    `matgptq quantize --method matgptq --bits 3,4,8 --group-size 128` (c = 8), 64 × 512 tokens of the second
            half of WikiText-2 test, seed 0, as search_real_model.py makes it; made once in --work and reused
  search    per seed s, one measured child process (wall, CPU, peak RSS):
              matgptq search PARENT --budget 2.5,2.75,3.0,3.25,3.5,4.0,5.0,6.0 --time-limit MINUTES --seed s
                --calib wiki.test --calib-range (0.5 + 0.15·s):1 {RECIPE}
            i.e. the calibration pool and the sensitivity windows start at another place of the text for each seed,
            and the search's own draws (windows, mutations) follow --seed s
  scoring   each budget's mixes on the first 4 × 1024 tokens of the first half of WikiText-2 test (never calibrated
            on): KL to the float32 model and perplexity, float32:
              uniform    the widest uniform slice within the budget
              knapsack   the probe table's knapsack mix (one probe per layer; the default start until 2026-11-28)
              error      llama.cpp's --target-bpw idea: imatrix-weighted weight error, knapsack (a default baseline)
              gradient   first order at the uniform slice under the budget, the knapsack above it (one backward
                         pass per floor width, block by block; allocation/gradient.py; a default baseline)
              evolved    where the generations the time allowed ended
              written    what the mix file says to use: the lowest calibration KL among the above, or the uniform
                         slice where that lowest is not shown better window by window (allocation/choice.py; the
                         `search` runs on this page were measured before that rule, the `full` runs with it)
  slow      --slow-baselines adds, per seed and apart from the timed search (they do not fit its 10 minutes), on
            the same parent, calibration pool and sensitivity windows:
              additive   every layer scored alone at every width, knapsack (the measured additive model): a
                         `matgptq search --baselines additive,noise --generations 0` child with the recipe above
              noise      ExLlamaV3's noise injection (two probes per layer, power law, knapsack), in that child
              random     random budget-filling mixes through the search's selection stages, as many scorings as
                         the search made at that budget (search_results.random_search)
            scored on the same held-out text; the written mix is then held against these too
  full      --full-start adds, per seed, a second timed search of all budgets, the same command with
              {FULL}
            (its knapsack start from every layer scored at every width on one window, the measured additive model at
            a sixth of the additive baseline's tokens per scoring); its knapsack mix (`full knapsack`, a one-shot
            allocation), the probe table's knapsack read off that table's lowest width (`full probe`, another) and
            written mix (`full written`) scored on the same held-out text

    python -m benchmarks.search_minutes [--seeds 0,1,2] [--minutes 10] [--work runs/search-minutes]
        [--out docs/results/search_minutes.json] [--from-json]      # ~15 minutes a seed on 2 cores
    python -m benchmarks.search_minutes --slow-baselines [--seeds 0,1,2]   # after it; ~25 minutes a seed
    python -m benchmarks.search_minutes --full-start [--seeds 0,1,2]       # after it; ~12 minutes a seed
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from fractions import Fraction
from pathlib import Path

import torch

import matgptq
from benchmarks._harness import RESULTS, ROOT, header, load_json, write_page, write_results
from benchmarks._search_setup import (BUDGETS, LEVELS, MODEL, calib_windows, score_named, search_child, start,
                                      stats)
from benchmarks.search_baselines import verdict
from matgptq.allocation import BudgetKind, CostModel
from matgptq.allocation.allocators import uniform_mix
from matgptq.evaluation.teacher import Teacher
from matgptq.execution import format_table
from matgptq.formats import read_checkpoint

RECIPE_UNREFINED = ("--sensitivity", "probe", "--sensitivity-tokens", "510", "--calib-tokens", "2040", "--stages",
                    "255:2,510:1", "--offspring", "8", "--generations", "100")  # fmt: skip
# The seeds were measured before the search refined its start (allocation/refine.py), so RECIPE says --refine-steps 0;
# those recorded before `full` became the default table ran it without its first two words (probe was the default
# then): the same command.
RECIPE = (*RECIPE_UNREFINED, "--refine-steps", "0")
RECIPE_BEFORE = RECIPE_UNREFINED[2:]
FULL = ("--sensitivity", "full", "--sensitivity-tokens", "255")  # --full-start: these replace RECIPE's
SLOW = ("additive", "noise", "random")  # --slow-baselines
KINDS = ("uniform", "knapsack", "error", "gradient", *SLOW, "full knapsack", "full probe", "evolved", "written",
         "full written")  # fmt: skip
ONE_SHOT = ("uniform", "knapsack", "error", "gradient", *SLOW, "full knapsack", "full probe")  # what a written mix is held against
WRITTEN = ("written", "full written")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2", help="search seeds (each also moves the calibration text)")
    ap.add_argument("--minutes", type=float, default=10.0, help="--time-limit of each search")
    ap.add_argument("--work", default=str(ROOT / "runs" / "search-minutes"), help="the parent and the mix files")
    ap.add_argument("--out", default=str(RESULTS / "search_minutes.json"), help="the JSON; its page goes beside it")
    ap.add_argument("--from-json", action="store_true", help="only re-render the page from --out")
    ap.add_argument("--slow-baselines", action="store_true",
                    help="add additive, noise and random search to the seeds --out already holds (not timed with them)")
    ap.add_argument("--full-start", action="store_true",
                    help="add the timed search with the FULL settings to the seeds --out already holds")
    return ap


def main() -> None:
    a = build_parser().parse_args()
    out = Path(a.out)
    if not a.from_json:
        work = Path(a.work)
        parent, data = start(work, out, RECIPE, __doc__, same=(RECIPE_BEFORE, RECIPE_UNREFINED))
        for seed in (int(s) for s in a.seeds.split(",")):
            if a.slow_baselines or a.full_start:
                if str(seed) not in data["seeds"]:
                    raise SystemExit(f"seed {seed} has no timed search in {out}: run it without options first")
                (add_slow if a.slow_baselines else add_full)(parent, work, seed, data["seeds"][str(seed)], a.minutes)
            else:
                data["seeds"][str(seed)] = measure_seed(parent, work, seed, a.minutes)
            write_results(out.with_suffix(".md"), data, page(data))  # after every seed: a stopped run keeps the rest
    text = page(load_json(out))
    write_page(out.with_suffix(".md"), text)
    print(text)


def measure_seed(parent: Path, work: Path, seed: int, minutes: float) -> dict:
    """One timed search of all budgets, then every budget's mixes scored on the held-out text."""
    done = search_child(parent, work, seed, list(RECIPE), f"seed-{seed}", minutes)
    cost = CostModel.from_checkpoint(read_checkpoint(parent), LEVELS)
    bodies = done["bodies"]
    named = {b: {"uniform": dict(zip(cost.names, uniform_mix(cost, Fraction(b), BudgetKind.CODE))),
                 "knapsack": body["dp_bits"], **{k: body["baseline_bits"][k] for k in ("error", "gradient")},
                 "evolved": body["search_bits"], "written": body["bits"]} for b, body in bodies.items()}  # fmt: skip
    scores = score_named(parent, named)
    return {"usage": done["usage"], "budgets": {b: {"scores": scores[b], **timing(body)}
                                                for b, body in bodies.items()}}  # fmt: skip


def timing(body: dict) -> dict:
    """A mix file's choice and where its seconds went."""
    return {"chosen": body["summary"]["chosen"], "sensitivity_levels": body["summary"].get("sensitivity_levels"),
            "uniform_gap": body["summary"].get("uniform_gap"),
            **{k: body["summary"][k] for k in ("generations", "evaluations", "seconds", "teacher_seconds",
                                               "tables_seconds", "search_seconds")}}  # fmt: skip


def full_recipe() -> list[str]:
    recipe = list(RECIPE)
    for option in ("--sensitivity", "--sensitivity-tokens"):
        recipe[recipe.index(option) + 1] = FULL[FULL.index(option) + 1]
    return recipe


def add_full(parent: Path, work: Path, seed: int, run: dict, minutes: float) -> None:
    """The docstring's `full`: a second timed search of one seed, its knapsack and written mixes scored into `run`."""
    recipe = full_recipe()
    done = search_child(parent, work, seed, recipe, f"seed-{seed}-full", minutes)
    named = {b: {"full knapsack": body["dp_bits"], "full probe": body["baseline_bits"]["probe"],
                 "full written": body["bits"]} for b, body in done["bodies"].items()}  # fmt: skip
    for b, scores in score_named(parent, named).items():
        run["budgets"][b]["scores"].update(scores)
    run["full"] = {"usage": done["usage"], "recipe": recipe,
                   "budgets": {b: timing(body) for b, body in done["bodies"].items()}}  # fmt: skip


def add_slow(parent: Path, work: Path, seed: int, run: dict, minutes: float) -> None:
    """The slow one-shot allocations of one seed (the docstring's `slow`), scored into `run` beside the timed search's."""
    recipe = list(RECIPE)
    recipe[recipe.index("--generations") + 1] = "0"  # the tables and their knapsack mixes, no evolution
    done = search_child(parent, work, seed, [*recipe, "--baselines", "additive,noise", "--no-tie"], f"seed-{seed}-slow")
    usage, bodies = done["usage"], done["bodies"]
    named = {b: {k: bodies[b]["baseline_bits"][k] for k in ("additive", "noise")} for b in BUDGETS}
    searched = {b: json.loads((work / f"seed-{seed}" / f"mix-{b}.json").read_text())["summary"] for b in BUDGETS}
    if any(searched[b]["generations"] != run["budgets"][b]["generations"] for b in BUDGETS):
        raise SystemExit(f"{work / f'seed-{seed}'} holds another search than {seed}'s recorded one: run it again")
    seconds = {}
    for b, mix in random_mixes(parent, seed, {b: searched[b]["evaluations"] for b in BUDGETS}, seconds).items():
        named[b]["random"] = mix
    for b, scores in score_named(parent, named).items():
        run["budgets"][b]["scores"].update(scores)
    run["slow"] = {"usage": usage, "tables_seconds": bodies[BUDGETS[0]]["summary"]["tables_seconds"],
                   "random_seconds": seconds}  # fmt: skip


@torch.no_grad()
def random_mixes(parent: Path, seed: int, evaluations: dict[str, int], seconds: dict) -> dict[str, dict[str, int]]:
    """Per budget, random search with as many scorings as the search's evolution made there, at least one
    generation's (a budget whose share went to refinement may run none; the refinement's layer-by-layer scorings are
    not counted), on the search's own calibration pool and stages (the runner's: --calib-tokens 2040 as 8 windows of
    256, the recipe's stages); its seconds into `seconds`."""
    from benchmarks.search_results import random_search
    from matgptq.allocation import EvoConfig
    from matgptq.allocation.evopress import parse_stages, stage_pools
    from matgptq.allocation.fitness import Fitness
    from matgptq.allocation import ScoreDtype

    pool = calib_windows(seed, 8)
    cost = CostModel.from_checkpoint(read_checkpoint(parent), LEVELS)
    teacher = Teacher(matgptq.load(MODEL), pool)
    fit = Fitness(matgptq.load(parent, bits=8, packed=False), teacher, pool, cost.names,
                  compute_dtype=ScoreDtype.AUTO.resolve(torch.device("cpu")))  # fmt: skip
    config = EvoConfig(offspring=8, stages=parse_stages(RECIPE[RECIPE.index("--stages") + 1]), seed=seed)
    generation = sum(stage_pools(config))  # one generation's evaluations
    out = {}
    try:
        for b in BUDGETS:
            t0 = time.perf_counter()
            mix = random_search(fit, LEVELS, cost.table(BudgetKind.CODE), cost.limit(Fraction(b), BudgetKind.CODE),
                                max(evaluations[b], generation), config, seed)  # fmt: skip
            seconds[b] = round(time.perf_counter() - t0, 1)
            out[b] = dict(zip(cost.names, mix))
    finally:
        teacher.close()
    return out


def page(data: dict) -> str:
    """docs/results/search_minutes.md from its JSON."""
    seeds = sorted(data["seeds"], key=int)
    runs = [data["seeds"][s] for s in seeds]
    quality, perplexity = [], []
    kinds = [k for k in KINDS if all(k in r["budgets"][b]["scores"] for r in runs for b in BUDGETS)]
    written = [k for k in WRITTEN if k in kinds]
    for b in BUDGETS:
        kl = {k: [r["budgets"][b]["scores"][k]["kl"] for r in runs] for k in kinds}
        best = min((k for k in ONE_SHOT if k in kl), key=lambda k: statistics.mean(kl[k]))
        quality.append([b, *(stats(kl[k]) for k in kinds), best, *(verdict(kl[w], kl[best]) for w in written)])
        perplexity.append([b, *(stats([r["budgets"][b]["scores"][k]["ppl"] for r in runs], 2) for k in kinds)])
    recipe = RECIPE if data["recipe"] in (list(RECIPE_BEFORE), list(RECIPE_UNREFINED)) else data["recipe"]  # repeats it now
    protocol = data["protocol"].strip().replace("{RECIPE}", " ".join(recipe)).replace("{FULL}", " ".join(FULL))
    return "\n".join([
        header("benchmarks/search_minutes.py", "search_minutes.json"), "# All eight budgets in minutes",
        "", "```", protocol, "```", "",
        f"Seeds {', '.join(seeds)}; each cell: mean ± sample standard deviation over the seeds.", "",
        "Each timed search, per seed (a measured child process; load: the 1-minute load average when it ended):", "",
        format_table(["seed", "search", "wall s", "CPU s", "peak RSS GB", "load", "widths scored in its table"],
                     _usage(seeds, runs)), "",
        "Held-out KL to the float32 model per budget; `vs best`: a written mix against the best one-shot allocation "
        f"({', '.join(k for k in ONE_SHOT if k in kinds)}), a tie within the larger spread:", "",
        format_table(["budget", *kinds, "best baseline", *(f"{w} vs best" for w in written)], quality), "",
        "Held-out perplexity of the same mixes:", "",
        format_table(["budget", *kinds], perplexity),
        *_timing(seeds, runs), *_slow_quality(seeds, runs), *_slow_usage(seeds, runs),
    ])  # fmt: skip


def _usage(seeds: list[str], runs: list[dict]) -> list[list]:
    rows = []
    for s, r in zip(seeds, runs):
        for name, run in (("search", r), ("full", r.get("full"))):
            if run:
                u, scored = run["usage"], run["budgets"][BUDGETS[0]].get("sensitivity_levels")
                rows.append([s, name, f"{u['wall']:.0f}", f"{u['cpu']:.0f}", f"{u['rss_gb']:.2f}",
                             f"{u['load_average']:.1f}",
                             ", ".join(map(str, scored)) if scored else "2 (probe)" if name == "search" else "-"])  # fmt: skip
    return rows


def _timing(seeds: list[str], runs: list[dict]) -> list[str]:
    """Where each timed search's seconds went, per budget (means over the seeds that ran it)."""
    out = []
    for name, of in (("search", lambda r: r), ("full", lambda r: r.get("full"))):
        have = [of(r) for r in runs if of(r)]
        if not have:
            continue
        rows = [[b, *(f"{statistics.mean(h['budgets'][b][k] for h in have):.1f}"
                      for k in ("teacher_seconds", "tables_seconds", "search_seconds", "seconds")),
                 "/".join(str(h["budgets"][b]["generations"]) for h in have),
                 ", ".join(h["budgets"][b]["chosen"] for h in have)] for b in BUDGETS]  # fmt: skip
        out += ["", f"Where the `{name}` run's seconds went (means over {len(have)} seeds; the first budget carries the "
                "shared teacher and tables):", "",
                format_table(["budget", "teacher s", "tables s", "search s", "budget s", "generations per seed",
                              "chosen per seed"], rows)]  # fmt: skip
    return out


def _slow_quality(seeds: list[str], runs: list[dict]) -> list[str]:
    """Where only some seeds have the slow baselines: the written mix against every one-shot allocation on those."""
    have = [(s, r) for s, r in zip(seeds, runs) if "slow" in r]
    if not have or len(have) == len(runs):  # none, or all: the table above holds them
        return []
    rows = []
    for b in BUDGETS:
        kl = {k: [r["budgets"][b]["scores"][k]["kl"] for _, r in have] for k in (*ONE_SHOT, "written")}
        best = min(ONE_SHOT, key=lambda k: statistics.mean(kl[k]))
        rows.append([b, *(stats(kl[k]) for k in (*SLOW, "written")), f"{best} {stats(kl[best])}",
                     verdict(kl["written"], kl[best]) + " (1 seed, no spread)" * (len(have) == 1)])  # fmt: skip
    return ["", f"The slow baselines, measured for seed{'s' * (len(have) > 1)} {', '.join(s for s, _ in have)} so "
            "far; the written mix of the same seeds against them and the baselines above:", "",
            format_table(["budget", *SLOW, "written", "best one-shot", "written vs best"], rows)]  # fmt: skip


def _slow_usage(seeds: list[str], runs: list[dict]) -> list[str]:
    """The --slow-baselines' cost per seed, where measured."""
    rows = [[s, f"{u['wall']:.0f}", f"{u['cpu']:.0f}", f"{u['rss_gb']:.2f}", f"{r['slow']['tables_seconds']:.0f}",
             f"{sum(r['slow']['random_seconds'].values()):.0f}", f"{u['load_average']:.1f}"]
            for s, r in zip(seeds, runs) if "slow" in r and (u := r["slow"]["usage"])]  # fmt: skip
    if not rows:
        return []
    notes = [f"- seed {s}: {r['slow']['note']}" for s, r in zip(seeds, runs) if r.get("slow", {}).get("note")]
    return ["", "What the slow baselines cost, per seed (not part of the search above: the tables child of "
            "`--generations 0 --baselines additive,noise`, which also fills the probe table, and random search "
            "over all eight budgets in this process; load: the 1-minute load average when the child ended):", "",
            format_table(["seed", "tables child wall s", "CPU s", "peak RSS GB", "tables s", "random s", "load"],
                         rows), *([""] + notes if notes else [])]  # fmt: skip


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
