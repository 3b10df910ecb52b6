"""The 10-minute search with other tables (issue #44 item 2): the record's recipe (search_ten_minutes.json) against
variants of it, each measured by search_ten_minutes itself on the same parent, calibration seeds and held-out text:

    python -m benchmarks.search_ten_minutes --seeds 0,1,2 --reuse-slow --search-options 'OPTIONS' \\
        --out docs/results/search_ten_minutes_variants/NAME.json

(OPTIONS replace the record's table options, '' the table of every width on one window; --reuse-slow: the untimed
baselines, `additive 510` and `noise`, are the record's own mixes). A variant's `additive` is its own table's knapsack
(the start it searched from), so its best one-shot allocation is judged among its own run's baselines, as
search_ten_minutes' page does. `vs record`: the variant's written mix against the record's, seed by seed (each seed's
calibration text is the same for both, so the ratio is paired). A column is named by its table options.

    python -m benchmarks.search_ten_minutes_variants     # renders only: the runs above wrote the JSONs
"""

from __future__ import annotations

import statistics

from benchmarks._harness import RESULTS, header, load_json, machine_lines, write_page
from benchmarks._search_setup import BUDGETS
from benchmarks.search_ten_minutes import KINDS, RECIPE, quality_rows
from matgptq.execution import format_table


def options(data: dict, record: dict) -> str:
    """A recipe's table options: what follows the pool and generations (search_ten_minutes.RECIPE), or its whole
    recipe where it does not start with them; the record's marked."""
    recipe, base = data["recipe"], list(RECIPE)
    label = " ".join(recipe[len(base):] if recipe[: len(base)] == base else recipe) or "every width on one window"
    return f"the record: {label}" if data is record else label


def judged(data: dict) -> dict[str, list]:
    """Per budget: [written KL, best one-shot, verdict, ratio] of one record (search_ten_minutes.quality_rows)."""
    _, runs = seeded(data)
    kinds = [k for k in KINDS if all(k in r["budgets"][b]["scores"] for r in runs for b in BUDGETS)]
    rows, _ = quality_rows(runs, kinds)
    return {row[0]: [row[1 + kinds.index("written")], *row[-4:-1]] for row in rows}


def paired(record: dict, data: dict, budget: str) -> str:
    """The variant's written KL over the record's, seed by seed, on the seeds both measured."""
    seeds = sorted(set(record["seeds"]) & set(data["seeds"]), key=int)
    kl = lambda d, s: d["seeds"][s]["budgets"][budget]["scores"]["written"]["kl"]  # noqa: E731
    return " ".join(f"{kl(data, s) / kl(record, s):.3f}" for s in seeds)


def cost_row(data: dict, record: dict) -> list:
    """Seeds, mean table seconds, generations per budget (mean over budgets and seeds) and the timed runs' walls."""
    seeds, runs = seeded(data)
    walls = [r["usage"]["wall"] for r in runs]
    return [options(data, record), ", ".join(seeds),
            f"{statistics.mean(r['budgets'][BUDGETS[0]]['tables_seconds'] for r in runs):.0f}",
            f"{statistics.mean(r['budgets'][b]['generations'] for r in runs for b in BUDGETS):.1f}",
            "-".join(dict.fromkeys(f"{w:.0f}" for w in (min(walls), max(walls))))]  # fmt: skip


def page(record: dict, variants: dict[str, dict]) -> str:
    """docs/results/search_ten_minutes_variants.md from the record and the variants' JSONs."""
    records = [record, *(variants[k] for k in sorted(variants))]
    verdicts = [judged(d) for d in records]
    quality = [[b, *(f"{v[b][0]} ({v[b][1]}: {v[b][2]}, {v[b][3]})" for v in verdicts)] for b in BUDGETS]
    versus = [[b, *(paired(record, d, b) for d in records[1:])] for b in BUDGETS]
    names = [options(d, record) for d in records]
    return "\n".join([
        header("benchmarks/search_ten_minutes_variants.py", "search_ten_minutes.json",
               "search_ten_minutes_variants/*.json"), "# The 10-minute search with other tables", "",
        "```", __doc__.strip(), "```", "",
        "Held-out KL of the written mix (mean ± standard deviation over the recipe's seeds, one seed: its value), its "
        "verdict against its run's best one-shot allocation (a tie within the larger spread; with one seed "
        "below/above say only which is smaller) and their ratio:", "",
        format_table(["budget", *names], quality), "",
        "Each variant's written mix against the record's, per seed (paired):", "",
        format_table(["budget", *names[1:]], versus), "",
        "What each recipe's time went to: the table's seconds (mean over its seeds) and the generations a budget "
        "(mean over budgets and seeds), with the timed runs' wall seconds:", "",
        format_table(["recipe", "seeds", "table s", "generations", "wall s"], [cost_row(d, record) for d in records]),
        *(line for d in records[1:] for line in ["", f"{options(d, record)}:", *machine_lines(*seeded(d))]),
    ])  # fmt: skip


def seeded(data: dict) -> tuple[list[str], list[dict]]:
    """A record's seeds in order and their runs."""
    seeds = sorted(data["seeds"], key=int)
    return seeds, [data["seeds"][s] for s in seeds]


def main() -> None:
    variants = {p.name: load_json(p) for p in sorted((RESULTS / "search_ten_minutes_variants").glob("*.json"))}
    if not variants:
        raise SystemExit("search_ten_minutes_variants: error: no docs/results/search_ten_minutes_variants/*.json; "
                         "measure a variant first (the command above)")
    text = page(load_json(RESULTS / "search_ten_minutes.json"), variants)
    write_page(RESULTS / "search_ten_minutes_variants.md", text)
    print(text)


if __name__ == "__main__":
    main()
