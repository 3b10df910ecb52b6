"""All eight budgets in ten minutes (issue #44 items 1-3): on SmolLM2-135M-Instruct, one `matgptq search` of every
budget under --time-limit 10 on 2 cores, with its mutations guided by its own table, against every one-shot
allocation and random search made on the same parent and calibration.

Protocol (_setup.py's parent, calibration ranges, held-out text and scoring):
  search    per seed s, one measured child process (wall, CPU, peak RSS), the defaults but for the pool, the
            generations' size and the table:
              {RECIPE}
            with --calib-range (0.5 + 0.15·s):1 --seed s: every layer scored alone at widths 2 and 3 on one window
            of 255 scored tokens, at 4 and 5 on two (a middle width's small loss on one window is mostly its noise),
            6 and 7 extrapolated from 5 by its weight error (the measured additive model, its knapsack the search's
            start; widths dropped from the top where time is short), the default baselines, the start's refinement
            where a budget's share of time allows a step, then EvoPress whose children lower and raise the layers
            the start's table calls cheapest to lower and most useful to raise (--mutation-temperature 0.5, the
            default; mutation.py), and the written mix chosen on the 8-window pool
  slow      per seed, one more child, not timed with the search (it does not fit in it), on the same parent and pool:
              {SLOW}
            its knapsack is the additive allocation measured on two windows (`additive 510`: every layer alone at
            every width, twice the search's tokens per scoring), and ExLlamaV3's noise injection (`noise`)
            --reuse-slow takes its mixes and measured usage from its files still in --work (same command):
            they do not depend on the timed search, so a change to the search alone is re-measured in a third of
            the time; the usage table marks them `reused`, with the commit they were made at where their usage
            file records it (it has since 2026-12-05)
  random    random budget-filling mixes through the search's selection stages, as many scorings as the search's
            evolution made at that budget, at least one generation's (_setup.random_mixes)
  uniform   with --uniform-draws, per seed, the timed search again with --mutation-temperature 0 (EvoPress' uniform
            draws), its written mix as `uniform draws`
  scoring   on the first 4 × 1024 tokens of the first half of WikiText-2 test (never calibrated on), float32, KL to
            the float32 model and perplexity, every mix above; the written mix against the best one-shot allocation
            (uniform, additive, additive 510, probe, noise, error, gradient, random), a tie within the larger of the
            two seed spreads (_setup.verdict)

    python -m benchmarks.search.ten_minutes [--seeds 0,1,2] [--uniform-draws] [--reuse-slow]    # ~30 min a seed
--search-options replaces the table's options above (TABLE): another value measures a variant of the recipe ('' the
table of every width on one window, the record until 2026-12-05), its mix folders named after its options as the
record's are; give it its own --out, as a record of another recipe replaces the one at --out.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
from fractions import Fraction
from pathlib import Path

from benchmarks._harness import format_table, header, load_json, machine, machine_lines
from benchmarks.search._setup import (
    BUDGETS,
    LEVELS,
    folder_suffix,
    random_mixes,
    record_seeds,
    score_named,
    search_child,
    seed_parser,
    split_options,
    stats,
    verdict,
)

MINUTES = 10
POOL = ("--calib-tokens", "2040", "--stages", "255:2,510:1", "--offspring", "8")  # random_mixes' stages too
# the baselines: the search's default when the record was made (they became opt-in since)
RECIPE = (*POOL, "--generations", "100", "--baselines", "uniform,error,gradient")
# the record's table: 2 and 3 on --sensitivity-tokens, 4 and 5 on twice as many, 6 and 7 extrapolated from 5
TABLE = ("--sensitivity-wide", "4:510", "--sensitivity-top", "5")
SLOW = (*POOL, "--sensitivity-tokens", "510", "--baselines", "noise", "--generations", "0", "--refine-steps", "0")
ONE_SHOT = ("uniform", "additive", "additive 510", "probe", "noise", "error", "gradient", "random")
KINDS = (*ONE_SHOT, "evolved", "written", "uniform draws")
TIMES = ("teacher_seconds", "tables_seconds", "search_seconds", "seconds")
REPORT = ("report_seconds", "report_guess_seconds")  # the guess: in the record's mix files, not in today's


def build_parser() -> argparse.ArgumentParser:
    ap = seed_parser(__doc__, "search_ten_minutes.json")
    ap.add_argument("--uniform-draws", action="store_true", help="also the timed search with uniform draws")
    ap.add_argument(
        "--reuse-slow",
        action="store_true",
        help="the slow baselines' mixes and usage from their files "
        "in --work, not run again (for a change to the timed search alone)",
    )
    ap.add_argument(
        "--search-options",
        default=shlex.join(TABLE),
        metavar="OPTIONS",
        help="the timed search's table options, after the pool and generations (default: the record's, "
        "%(default)r); another value measures a variant, e.g. '' (every width on one window)",
    )
    return ap


def main() -> None:
    ap = build_parser()
    a = ap.parse_args()
    extra = list(split_options(ap, a.search_options))
    if extra != list(TABLE) and Path(a.out).resolve() == Path(ap.get_default("out")).resolve():
        raise SystemExit(
            "search_ten_minutes: error: --search-options measures another recipe, which would replace "
            "the record at --out; give it its own --out"
        )
    recipe, variant = (*RECIPE, *extra), folder_suffix(extra)

    def measure(parent, work, seed):
        return measure_seed(parent, work, seed, a.uniform_draws, a.reuse_slow, recipe, variant)

    record_seeds("search_ten_minutes", a, recipe, __doc__, measure, page)


def measure_seed(
    parent: Path, work: Path, seed: int, uniform_draws: bool, reuse_slow: bool, recipe: tuple[str, ...], variant: str
) -> dict:
    """The timed search of `recipe` (its folder's name ending in `variant`), the slow baselines (the run before's,
    with `reuse_slow`) and random search of one seed, every mix scored on the held-out text."""
    from matgptq.allocation import BudgetKind, CostModel
    from matgptq.allocation.allocators import uniform_mix
    from matgptq.formats import read_checkpoint

    done = search_child(parent, work, seed, list(recipe), f"ten-seed-{seed}{variant}", MINUTES)
    # --no-tie: noise probes layers alone, and the record's slow run (made before `search --tie`) was layer-wise
    slow = (
        reused_slow(work, seed)
        if reuse_slow
        else search_child(parent, work, seed, [*SLOW, "--no-tie"], f"ten-seed-{seed}-slow")
    )
    cost = CostModel.from_checkpoint(read_checkpoint(parent), LEVELS)
    named = {
        b: {
            "uniform": dict(zip(cost.names, uniform_mix(cost, Fraction(b), BudgetKind.CODE))),
            "additive": body["dp_bits"],
            "additive 510": slow["bodies"][b]["dp_bits"],
            "noise": slow["bodies"][b]["baseline_bits"]["noise"],
            **{k: body["baseline_bits"][k] for k in ("probe", "error", "gradient")},
            "evolved": body["search_bits"],
            "written": body["bits"],
        }
        for b, body in done["bodies"].items()
    }
    random_seconds: dict[str, float] = {}
    evaluations = {b: body["summary"]["evaluations"] for b, body in done["bodies"].items()}
    for b, mix in random_mixes(parent, seed, evaluations, random_seconds).items():
        named[b]["random"] = mix
    record = {
        "usage": done["usage"],
        "slow_usage": slow["usage"],
        "random_seconds": random_seconds,
        "slow_reused": reuse_slow,
        "machine": machine(),
    }
    if uniform_draws:
        plain = search_child(
            parent, work, seed, [*recipe, "--mutation-temperature", "0"], f"ten-seed-{seed}{variant}-uniform", MINUTES
        )
        for b, body in plain["bodies"].items():
            named[b]["uniform draws"] = body["bits"]
        record["uniform_usage"] = plain["usage"]
    scores = score_named(parent, named)
    record["budgets"] = {
        b: {
            "scores": scores[b],
            "chosen": body["summary"]["chosen"],
            "sensitivity_levels": body["summary"]["sensitivity_levels"],
            **{k: body["summary"].get(k) for k in ("generations", "evaluations", "refine_steps", *TIMES, *REPORT)},
        }
        for b, body in done["bodies"].items()
    }
    return record


def record_folder(work: Path, seed: int, script: str) -> Path:
    """The record's mix folder of `seed` in `work`, for `script`, a script that reads it; exits, naming the command
    that makes it, where it lacks a budget."""
    folder = work / f"ten-seed-{seed}{folder_suffix(TABLE)}"
    missing = [b for b in BUDGETS if not (folder / f"mix-{b}.json").is_file()]
    if missing:
        raise SystemExit(
            f"{script}: error: no mix-{missing[0]}.json in {folder}; run `python -m "
            f"benchmarks.search.ten_minutes --seeds {seed}` first (or give its --work)"
        )
    return folder


def record_on_record(script: str, a, recipe: tuple[str, ...], protocol: str, measure, page) -> None:
    """record_seeds for `script`, which measures on the record's mixes: every seed's folder checked before anything is
    measured (the parent is made in --work where it is missing)."""
    if not a.from_json:
        for seed in a.seeds:
            record_folder(Path(a.work), seed, script)
    record_seeds(script, a, recipe, protocol, measure, page)


def reused_slow(work: Path, seed: int) -> dict:
    """The slow child run before: its mixes and the usage its launcher measured (no load average), from `work`."""
    mixes, usage = work / f"ten-seed-{seed}-slow", work / f"ten-seed-{seed}-slow.usage.json"
    missing = [b for b in BUDGETS if not (mixes / f"mix-{b}.json").is_file()]
    if missing or not usage.is_file() or not load_json(usage).get("ok"):
        raise SystemExit(
            f"search_ten_minutes: error: --reuse-slow: seed {seed} has no finished slow run in {mixes}; run without it"
        )
    return {"usage": load_json(usage), "bodies": {b: load_json(mixes / f"mix-{b}.json") for b in BUDGETS}}


def quality_rows(runs: list[dict], kinds: list[str]) -> tuple[list[list], list[list]]:
    """Held-out KL per budget with the written mix against the best one-shot allocation, and held-out perplexity."""
    quality, perplexity = [], []
    for b in BUDGETS:
        kl = {k: [r["budgets"][b]["scores"][k]["kl"] for r in runs] for k in kinds}
        best = min((k for k in ONE_SHOT if k in kl), key=lambda k: statistics.mean(kl[k]))
        ratio = statistics.mean(kl["written"]) / statistics.mean(kl[best])
        one = " (1 seed)" * (len(runs) == 1)
        paired = " ".join(f"{w / o:.3f}" for w, o in zip(kl["written"], kl[best]))  # the same seed's text
        quality.append(
            [b, *(stats(kl[k]) for k in kinds), best, verdict(kl["written"], kl[best]) + one, f"{ratio:.3f}×", paired]
        )
        perplexity.append([b, *(stats([r["budgets"][b]["scores"][k]["ppl"] for r in runs], 2) for k in kinds)])
    return quality, perplexity


def time_rows(runs: list[dict]) -> list[list]:
    """Per budget: the timed search's mean seconds (teacher and tables carried by the first budget; its report's and
    their guess, "-" in records made before they were), its generations and refinement steps, and the chosen mix,
    per seed."""

    def mean(b: str, k: str) -> str:
        values = [r["budgets"][b][k] for r in runs if k in r["budgets"][b]]
        return f"{statistics.mean(values):.1f}" if len(values) == len(runs) else "-"

    return [
        [
            b,
            *(mean(b, k) for k in (*TIMES, *REPORT)),
            "/".join(str(r["budgets"][b]["generations"]) for r in runs),
            "/".join(str(r["budgets"][b]["refine_steps"]) for r in runs),
            ", ".join(r["budgets"][b]["chosen"] for r in runs),
        ]
        for b in BUDGETS
    ]


def usage_rows(seeds: list[str], runs: list[dict]) -> list[list]:
    rows = []
    for s, r in zip(seeds, runs):
        made = r.get("slow_usage", {}).get("commit")  # the commit a reused slow run was made at, where recorded
        slow = "slow baselines" + (f" (reused, made at {made})" if made else " (reused)") * r.get("slow_reused", False)
        for name, key in (("search", "usage"), (slow, "slow_usage"), ("uniform draws", "uniform_usage")):
            if key in r:
                u = r[key]
                load = f"{u['load_average']:.1f}" if "load_average" in u else "-"  # older usage files lack it
                rows.append([s, name, f"{u['wall']:.0f}", f"{u['cpu']:.0f}", f"{u['rss_gb']:.2f}", load])
        rows.append([s, "random", f"{sum(r['random_seconds'].values()):.0f}", "-", "-", "-"])
    return rows


def page(data: dict) -> str:
    """docs/results/search_ten_minutes.md from its JSON."""
    seeds = sorted(data["seeds"], key=int)
    runs = [data["seeds"][s] for s in seeds]
    kinds = [k for k in KINDS if all(k in r["budgets"][b]["scores"] for r in runs for b in BUDGETS)]
    quality, perplexity = quality_rows(runs, kinds)
    protocol = (
        data["protocol"]
        .strip()
        .replace(
            "{RECIPE}",
            f"matgptq search PARENT --budget {','.join(BUDGETS)} --calib wiki.test --time-limit {MINUTES} "
            + " ".join(data["recipe"]),
        )
        .replace("{SLOW}", "matgptq search PARENT ... " + " ".join(SLOW))
    )
    levels = sorted({tuple(r["budgets"][BUDGETS[0]]["sensitivity_levels"]) for r in runs})
    return "\n".join(
        [
            header("benchmarks/search/ten_minutes.py", "search_ten_minutes.json"),
            "# All eight budgets in ten minutes",
            "",
            "```",
            protocol,
            "```",
            "",
            f"Seeds {', '.join(seeds)}; each cell: mean ± sample standard deviation over the seeds.",
            "",
            "Held-out KL to the float32 model; `written vs best`: the written mix against the best one-shot allocation, "
            "a tie within the larger spread; `ratio`: their mean KLs; `per seed`: their KLs seed by seed (each seed's "
            "calibration text, the spread's main source, is the same for both):",
            "",
            format_table(["budget", *kinds, "best one-shot", "written vs best", "ratio", "per seed"], quality),
            "",
            "Held-out perplexity of the same mixes:",
            "",
            format_table(["budget", *kinds], perplexity),
            "",
            "Where the timed search's seconds went per budget (means over the seeds; the first budget carries the teacher "
            "and the shared tables; `search`: the start's choice, refinement, evolution and the choice on the pool; "
            "`report`: that choice, and the time the search set aside for it), "
            "its generations and refinement steps per seed, and the mix each seed wrote. Widths its table scored: "
            + "; ".join(", ".join(map(str, lv)) for lv in levels)
            + ":",
            "",
            format_table(
                [
                    "budget",
                    "teacher s",
                    "tables s",
                    "search s",
                    "budget s",
                    "report s",
                    "report guessed s",
                    "generations",
                    "refine steps",
                    "chosen",
                ],
                time_rows(runs),
            ),
            "",
            "Each child process (wall and CPU seconds, peak RSS; load: the 1-minute load average when it ended; random: "
            "its seconds in the scoring process):",
            "",
            format_table(["seed", "run", "wall s", "CPU s", "peak RSS GB", "load"], usage_rows(seeds, runs)),
            *(["", *lines] if (lines := machine_lines(seeds, runs)) else []),
        ]
    )


if __name__ == "__main__":
    main()
