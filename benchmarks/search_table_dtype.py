"""The table's precision (issue #44 item 2): on SmolLM2-135M-Instruct, is the measured additive table (every layer
alone at every width) better scored in float32 than in bfloat16? A one-layer change's KL at 6 bits and above is of
the order of bfloat16's rounding in the forward pass, so the knapsack of a bfloat16 table may pick its wide widths on
rounding.

Protocol (search_minutes.py's parent, calibration ranges, held-out text and scoring):
  tables    per seed s and precision D (float32, bfloat16), one measured child process that only fills the table:
              {RECIPE} --score-dtype D
            with --calib-range (0.5 + 0.15·s):1 --seed s: every layer scored alone at every width on the same one
            256-token window (the search's default table), then nothing else
  scoring   on the first 4 × 1024 tokens of the first half of WikiText-2 test (never calibrated on), float32, KL to
            the float32 model: each table's knapsack mix at every budget
--reuse takes a child's table from --work where a run before made it (`table-D-seed-S`, the same command).

    python -m benchmarks.search_table_dtype [--seeds 0,1,2] [--reuse]    # ~20 minutes a seed on 2 cores
"""

from __future__ import annotations

import statistics
from fractions import Fraction
from functools import partial
from pathlib import Path

from benchmarks._harness import header, load_json, machine
from benchmarks._search_setup import BUDGETS, LEVELS, record_seeds, score_named, search_child, seed_parser, stats
from benchmarks.search_ten_minutes import POOL
from matgptq.allocation import BudgetKind, CostModel
from matgptq.allocation.sensitivity import knapsack_mix
from matgptq.execution import format_table
from matgptq.formats import read_checkpoint

RECIPE = (*POOL, "--generations", "0", "--refine-steps", "0", "--baselines", "")
DTYPES = ("float32", "bfloat16")


def main() -> None:
    ap = seed_parser(__doc__, "search_table_dtype.json")
    ap.add_argument("--reuse", action="store_true", help="take the tables a run before left in --work")
    a = ap.parse_args()
    record_seeds("search_table_dtype", a, RECIPE, __doc__, partial(measure_seed, reuse=a.reuse), page)


def measure_seed(parent: Path, work: Path, seed: int, reuse: bool = False) -> dict:
    """Both children's tables (run, or with --reuse read back), their knapsack mixes scored on the held-out text."""
    cost = CostModel.from_checkpoint(read_checkpoint(parent), LEVELS)
    named, seconds, tables = {b: {} for b in BUDGETS}, {}, {}
    for dtype in DTYPES:
        name = f"table-{dtype}-seed-{seed}"
        if not (reuse and (work / name / ".tables.json").is_file()):
            search_child(parent, work, seed, [*RECIPE, "--score-dtype", dtype], name)
        saved = load_json(work / name / ".tables.json")
        if saved["settings"]["score_dtype"] != dtype:
            raise SystemExit(f"{work / name} holds a {saved['settings']['score_dtype']} table, not {dtype}")
        table = tables[dtype] = saved["tables"]["additive"]
        seconds[dtype] = round(table["seconds"], 1)
        for b in BUDGETS:
            named[b][dtype] = dict(zip(cost.names, knapsack_mix(cost, table["table"], Fraction(b), BudgetKind.CODE)))
    moved = rounding(tables["float32"]["table"], tables["bfloat16"]["table"])
    return {"machine": machine(), "table_seconds": seconds, "rounding": moved, "budgets": score_named(parent, named)}


def rounding(exact: list[list[float]], low: list[list[float]]) -> dict[str, dict[str, float]]:
    """Per width below the top, over the layers: the mean one-layer increment s_l(r) − s_l(top) of the float32 table,
    and the RMS of what bfloat16 changes in it (both tables score the same window, so that is its rounding alone)."""
    out = {}
    for i, r in enumerate(LEVELS[:-1]):
        inc = [row[i] - row[-1] for row in exact]
        moved = [(b[i] - b[-1]) - (a[i] - a[-1]) for a, b in zip(exact, low)]
        rms = statistics.fmean(x * x for x in moved) ** 0.5
        out[str(r)] = {"mean_increment": statistics.fmean(inc), "rms_change": rms}
    return out


def page(data: dict) -> str:
    """docs/results/search_table_dtype.md from its JSON."""
    seeds = sorted(data["seeds"], key=int)
    runs = [data["seeds"][s] for s in seeds]
    rows = []
    for b in BUDGETS:
        kl = {d: [r["budgets"][b][d]["kl"] for r in runs] for d in DTYPES}
        per_seed = " ".join(f"{x / y:.3f}" for x, y in zip(*kl.values()))
        ratio = statistics.mean(kl["float32"]) / statistics.mean(kl["bfloat16"])
        rows.append([b, *(stats(kl[d]) for d in DTYPES), f"{ratio:.3f}×", per_seed])
    times = [[s, *(f"{r['table_seconds'][d]:.0f}" for d in DTYPES),
              f"{r['table_seconds']['float32'] / r['table_seconds']['bfloat16']:.2f}×"] for s, r in zip(seeds, runs)]
    noise = [[r, f"{statistics.mean(x['rounding'][r]['mean_increment'] for x in runs):.2e}",
              f"{statistics.mean(x['rounding'][r]['rms_change'] for x in runs):.2e}"] for r in runs[0]["rounding"]]
    hosts = "; ".join(sorted({f"{r['machine']['cpu']}, {r['machine']['cores']} cores" for r in runs}))
    recipe = " ".join(x or "''" for x in data["recipe"])  # '' : the empty --baselines, as a shell spells it
    protocol = data["protocol"].strip().replace(
        "{RECIPE}", f"matgptq search PARENT --budget {','.join(BUDGETS)} --calib wiki.test {recipe}")
    return "\n".join([
        header("benchmarks/search_table_dtype.py", "search_table_dtype.json"), "# The table's precision", "",
        "```", protocol, "```", "",
        f"Seeds {', '.join(seeds)}; each cell: mean ± sample standard deviation over the seeds. Held-out KL of each "
        "table's knapsack mix; `ratio`: float32's mean against bfloat16's, then per seed:", "",
        format_table(["budget", "float32 table", "bfloat16 table", "ratio", "per seed"], rows), "",
        f"The table's seconds (every layer at widths 2-7 on one window; {hosts}):", "",
        format_table(["seed", "float32 s", "bfloat16 s", "ratio"], times), "",
        "What bfloat16 does to the table (means over the seeds): per width, the float32 table's mean one-layer "
        "increment s_l(r) − s_l(top) over the layers, and the RMS over the layers of what bfloat16 changes in it "
        "(the same window: its rounding alone):", "",
        format_table(["width", "mean increment", "bfloat16 RMS change"], noise),
    ])  # fmt: skip


if __name__ == "__main__":
    main()
