"""The search given time (issue #44 item 2): on SmolLM2-135M-Instruct, does the evolution, run at its default size from
the measured additive start, go below the best one-shot allocation at the fractional budgets?

ten_minutes.py shows the 10-minute runs tying the best one-shot allocation: they have time for the tables and
almost no generation. This script gives the evolution its default size instead and no time limit.

Protocol (_setup.py's parent, calibration ranges, held-out text and scoring; every baseline made in the same
child, on the same parent and calibration):
  search    per seed s, one measured child process (wall, CPU, peak RSS):
              matgptq search PARENT --budget {BUDGETS} --calib wiki.test --calib-range (0.5 + 0.15·s):1
                --seed s {RECIPE}
            i.e. every layer scored at every width on one 256-token window (the measured additive model: the
            knapsack start), the one-shot baselines below, then EvoPress with its defaults (25 generations,
            16 offspring, stages 512:4,2048:2,4096:1) on the default 16,384-token calibration pool, and the written
            mix chosen on that pool (allocation/choice.py)
  scoring   on the first 4 × 1024 tokens of the first half of WikiText-2 test (never calibrated on), float32, KL to
            the float32 model and perplexity:
              uniform    the widest uniform slice within the budget
              additive   the knapsack start: every layer scored alone at every width, knapsack
              probe      the probe table read off the additive table's lowest width, knapsack
              noise      ExLlamaV3's noise injection (two probes per layer, power law, knapsack)
              error      llama.cpp's --target-bpw idea: imatrix-weighted weight error, knapsack
              gradient   first order at the uniform slice under the budget, the knapsack above it
              evolved    where the 25 generations ended
              written    what the mix file says to use
            the written mix against the best one-shot allocation (the lowest mean held-out KL of the first six), a tie
            within the larger of the two seed spreads (_setup.verdict)
Resumable: each budget's search state stays in --work/long-seed-S (the child runs with --resume), the JSON is written
after each seed.

    python -m benchmarks.search.long [--seeds 0,1,2] [--budgets 2.5,2.75,3.25,3.5]
        # on 2 cores: ~9 minutes of tables a seed, then ~25 minutes a budget
    python -m benchmarks.search.long --budgets 3.5,4,5,6 --out docs/results/search_long_wide.json
        # the budgets the first record lacks, in a record of their own (a section of search_long.md)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from fractions import Fraction
from pathlib import Path

from benchmarks._harness import (
    RESULTS,
    ROOT,
    format_table,
    header,
    load_json,
    machine,
    machine_lines,
    write_atomic,
    write_page,
)
from benchmarks.search._setup import LEVELS, comma_list, score_named, search_child, start, stats, verdict

BUDGETS = ("2.5", "2.75", "3.25", "3.5")
WIDE = "search_long_wide.json"  # the budgets the first record lacks, measured later (a section of the page)
WIDE_COMMAND = f"python -m benchmarks.search.long --budgets 3.5,4,5,6 --out docs/results/{WIDE}"
# The seeds were measured before the search refined its start (allocation/refine.py): spelled out so that the
# command still means what was measured; RECIPE_BEFORE, the same command then, is recorded as RECIPE from now on
RECIPE_BEFORE = (
    "--sensitivity",
    "full",
    "--sensitivity-tokens",
    "255",
    "--baselines",
    "uniform,probe,noise,error,gradient",
)
RECIPE = (*RECIPE_BEFORE, "--refine-steps", "0")
ONE_SHOT = ("uniform", "additive", "probe", "noise", "error", "gradient")
KINDS = (*ONE_SHOT, "evolved", "written")


def build_parser(doc: str = __doc__, out: str = "search_long.json") -> argparse.ArgumentParser:
    """The options of this script (`doc` and the JSON `out`: its defaults)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--seeds", type=comma_list(int), default="0,1,2", help="search seeds (each also moves the calibration text)"
    )
    ap.add_argument(
        "--budgets", type=comma_list(float), default=",".join(BUDGETS), help="budgets searched, in one child per seed"
    )
    ap.add_argument(
        "--work",
        default=str(ROOT / "runs" / "search-minutes"),
        help="where the parent and the searches go (ten_minutes.py's parent is reused)",
    )
    ap.add_argument("--out", default=str(RESULTS / out), help="the JSON; its page goes beside it")
    return ap


def main() -> None:
    a = build_parser().parse_args()
    out, budgets = Path(a.out), [f"{b:g}" for b in a.budgets]
    work = Path(a.work)
    parent, data = start(work, out, RECIPE, __doc__, same=(RECIPE_BEFORE,))
    for seed in a.seeds:
        data["seeds"][str(seed)] = measure_seed(parent, work, seed, budgets)
        publish(out, data)  # after every seed: a stopped run keeps the rest


def measure_seed(parent: Path, work: Path, seed: int, budgets: list[str]) -> dict:
    """One child searching `budgets` without a time limit, every mix it made scored on the held-out text."""
    # a child that finds search states continues a run before: its wall and CPU then cover its own part only
    resumed = any((work / f"long-seed-{seed}").glob(".state-*.json"))
    done = search_child(parent, work, seed, [*RECIPE, "--resume"], f"long-seed-{seed}", budgets=tuple(budgets))
    named = one_shot_mixes(parent, done["bodies"], evolved="search_bits", written="bits")
    scores = score_named(parent, named)
    return {
        "usage": done["usage"],
        "resumed": resumed,
        "machine": machine(),
        "budgets": {
            b: {
                "scores": scores[b],
                "chosen": body["summary"]["chosen"],
                "evolution_seconds": body["history"][-1]["seconds"] if body["history"] else 0.0,
                "tables_seconds": tables_seconds(body, work / f"long-seed-{seed}"),
                **{k: body["summary"][k] for k in ("generations", "evaluations")},
            }
            for b, body in done["bodies"].items()
        },
    }


def one_shot_mixes(parent: Path, bodies: dict[str, dict], **more: str) -> dict[str, dict[str, dict[str, int]]]:
    """{budget: {kind: widths}} of ONE_SHOT from each budget's mix file in `bodies`, and {kind: the file's key} of
    `more` (e.g. evolved="search_bits")."""
    from matgptq.allocation import BudgetKind, CostModel
    from matgptq.allocation.allocators import uniform_mix
    from matgptq.formats import read_checkpoint

    cost = CostModel.from_checkpoint(read_checkpoint(parent), LEVELS)
    return {
        b: {
            "uniform": dict(zip(cost.names, uniform_mix(cost, Fraction(b), BudgetKind.CODE))),
            "additive": body["dp_bits"],
            **{k: body["baseline_bits"][k] for k in ONE_SHOT[2:]},
            **{kind: body[key] for kind, key in more.items()},
        }
        for b, body in bodies.items()
    }


def tables_seconds(body: dict, mixes: Path) -> float:
    """The seconds the shared tables took when they were measured: the mix file's, or, where the child read them
    back (--resume), what the run that measured them recorded in its .tables.json."""
    if not body["summary"].get("tables_reused"):
        return body["summary"]["tables_seconds"]
    return round(sum(t["seconds"] for t in json.loads((mixes / ".tables.json").read_text())["tables"].values()), 1)


def per_budget(data: dict, kinds: tuple[str, ...] = KINDS) -> tuple[list[str], list[dict], list[tuple]]:
    """(seeds, their runs, [(budget, {kind of `kinds`: held-out KL per seed}, best one-shot kind)]) for the budgets
    every seed has."""
    seeds = sorted(data["seeds"], key=int)
    runs = [data["seeds"][s] for s in seeds]
    out = []
    for b in (b for b in runs[0]["budgets"] if all(b in r["budgets"] for r in runs)):
        kl = {k: [r["budgets"][b]["scores"][k]["kl"] for r in runs] for k in kinds}
        out.append((b, kl, min(ONE_SHOT, key=lambda k: statistics.mean(kl[k]))))
    return seeds, runs, out


def written_ratio(kl: dict[str, list[float]], best: str) -> str:
    """The written mix's mean held-out KL over the best one-shot allocation's."""
    return f"{statistics.mean(kl['written']) / statistics.mean(kl[best]):.2f}×"


def kl_rows(runs: list[dict], rows: list[tuple], kinds: tuple[str, ...]) -> tuple[list[list], list[list]]:
    """The pages' two tables of `per_budget`'s rows: held-out KL of each kind with the written mix's verdict against
    the best one-shot allocation, and held-out perplexity."""
    one = " (1 seed, no spread)" * (len(runs) == 1)
    quality = [
        [b, *(stats(kl[k]) for k in kinds), best, verdict(kl["written"], kl[best]) + one, written_ratio(kl, best)]
        for b, kl, best in rows
    ]
    perplexity = [
        [b, *(stats([r["budgets"][b]["scores"][k]["ppl"] for r in runs], 2) for k in kinds)] for b, _, _ in rows
    ]
    return quality, perplexity


def cost_rows(runs: list[dict], rows, sep: str, cell, seconds: str) -> list[list[str]]:
    """Per budget: `cell` of each seed's budget record joined by `sep`, the mean of its `seconds`, the chosen mixes."""
    return [
        [
            b,
            sep.join(cell(r["budgets"][b]) for r in runs),
            f"{statistics.mean(r['budgets'][b][seconds] for r in runs):.0f}",
            ", ".join(r["budgets"][b]["chosen"] for r in runs),
        ]
        for b, _, _ in rows
    ]


def usage_rows(seeds: list[str], runs: list[dict], budgets: list[str]) -> list[list[str]]:
    """Per seed's child: wall, CPU, peak RSS, the shared tables' seconds (in the first budget) and the load."""
    return [
        [
            s,
            f"{r['usage']['wall']:.0f}",
            f"{r['usage']['cpu']:.0f}",
            f"{r['usage']['rss_gb']:.2f}",
            f"{r['budgets'][budgets[0]]['tables_seconds']:.0f}",
            f"{r['usage']['load_average']:.1f}",
        ]
        for s, r in zip(seeds, runs)
    ]


def record_lines(data: dict) -> list[str]:
    """A record's lines: its protocol, the held-out KL and perplexity of every mix, the evolution's cost, the children."""
    seeds, runs, rows = per_budget(data)
    budgets = [b for b, _, _ in rows]
    quality, perplexity = kl_rows(runs, rows, KINDS)
    cost = cost_rows(runs, rows, "/", lambda rec: str(rec["generations"]), "evolution_seconds")
    usage = [row + ["yes" if r.get("resumed") else "no"] for row, r in zip(usage_rows(seeds, runs, budgets), runs)]
    notes = [f"- seed {s}: {r['note']}" for s, r in zip(seeds, runs) if r.get("note")]  # what the numbers do not say
    notes += machine_lines(seeds, runs)
    protocol = data["protocol"].strip().replace("{BUDGETS}", ",".join(budgets))
    recipe = RECIPE if data["recipe"] == list(RECIPE_BEFORE) else data["recipe"]  # the command that repeats it now
    protocol = protocol.replace("{RECIPE}", " ".join(recipe))
    return [
        "```",
        protocol,
        "```",
        "",
        f"Seeds {', '.join(seeds)}; each cell: mean ± sample standard deviation over the seeds (one seed: its value)."
        " More seeds: `--seeds 1,2` adds them to the JSON.",
        "",
        "Held-out KL to the float32 model; `written vs best`: the written mix against the best one-shot allocation:",
        "",
        format_table(["budget", *KINDS, "best one-shot", "written vs best", "written / best"], quality),
        "",
        "Held-out perplexity of the same mixes:",
        "",
        format_table(["budget", *KINDS], perplexity),
        "",
        "What each budget's evolution cost (its generations' seconds, kept across a resume):",
        "",
        format_table(["budget", "generations per seed", "evolution s (mean)", "chosen per seed"], cost),
        "",
        "Each child (one per seed, all budgets; tables: the shared tables' seconds, in the first budget):",
        "",
        format_table(["seed", "wall s", "CPU s", "peak RSS GB", "tables s", "load", "resumed"], usage),
        "",
        "A resumed child (`search --resume` after a kill: finished budgets kept, tables read back) reports the wall "
        "and CPU of its own part only; the evolution seconds come from the search states, kept across resumes, and "
        "the tables' from the run that measured them.",
        *([""] + notes if notes else []),
    ]


def page(data: dict, wide: dict | None = None) -> str:
    """docs/results/search_long.md from search_long.json and, where there is one, the record of the budgets it lacks
    (search_long_wide.json, WIDE_COMMAND), measured later with that day's defaults."""
    lines = [
        header("benchmarks/search/long.py", "search_long.json", *([WIDE] if wide else [])),
        "# The search given time",
        "",
        *record_lines(data),
    ]
    if wide:
        commits = sorted({r["machine"]["commit"] for r in wide["seeds"].values()})
        lines += [
            "",
            "## The budgets the first record lacks",
            "",
            f"In a record of their own ({WIDE}, `{WIDE_COMMAND}`), measured at commit {', '.join(commits)}: "
            "the same command, whose defaults then scored the one-shot tables in float32 (since 1524422) and "
            "drew the mutations from the start's table (`--mutation-temperature 0.5`, since 2026-12-03), where "
            "the first record's tables were bfloat16 and its mutations uniform draws.",
            "",
            *record_lines(wide),
        ]
    return "\n".join(lines)


def publish(out: Path, data: dict) -> None:
    """`data` as the JSON `out`, then the page: docs/results/search_long.md from both records where `out` is one of
    them, else a page beside `out` from it alone."""
    write_atomic(out, json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    record, wide = RESULTS / "search_long.json", RESULTS / WIDE
    if out.resolve() in (record.resolve(), wide.resolve()) and record.is_file():
        write_page(record.with_suffix(".md"), page(load_json(record), load_json(wide) if wide.is_file() else None))
    else:
        write_page(out.with_suffix(".md"), page(data))


if __name__ == "__main__":
    import torch

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(2)
    main()
