"""How noisy the 10-minute search's fitness is (issue #44): what its evolution gained, on the calibration pool it
selected on, on fresh text of the same kind and on held-out text, against the standard error of the evaluations it
selected with.

Protocol: for each seed of benchmarks/search_ten_minutes.py's record (its parent, its seed's calibration range and
held-out text), per budget, two mixes of that run's mix file: `start` (the mix the evolution started from: the
one-shot allocation lowest on the pool, refined where steps were kept) and `written`. Both are scored per window,
float32 (`allocation.fitness.Fitness`, the search's own scoring), on the first 64 windows of 256 tokens of the seed's
calibration range: windows 0-7 are the search's pool (the 2,040 tokens every selection drew from; the written mix's
score there is checked against its mix file's), windows 8-63 are text the search never scored. With d_w the written
mix's KL minus the start's on window w, over the 56 fresh windows:
    gain ratio    Σ written / Σ start, on the pool, on the fresh windows, and on the held-out text (search_ten_minutes'
                  scoring, 4 × 1024 tokens)
    SE(k)         sd(d_w) / √k / mean start KL: the standard error, relative to the KL, of the difference two mixes
                  this far apart show on k windows (k = 1 and 2: the recipe's stages of 255 and 510 tokens; 8: its
                  pool); mixes one mutation apart differ less, in their mean and in d_w
    windows       (2 · sd(d_w) / mean d_w)²: the windows on which the fresh mean difference is two standard errors
                  (a normal approximation of the paired difference, the one `allocation.choice` uses)

    python -m benchmarks.search_noise [--seeds 0,1,2]     # ~10 minutes a seed on 2 cores, after search_ten_minutes
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import torch

import matgptq
from benchmarks._harness import load_json
from benchmarks._search_setup import (BUDGETS, LEVELS, MODEL, calib_windows, folder_suffix, page_top, score_named,
                                      seed_parser, seeds_named, stats)  # fmt: skip
from benchmarks.search_ten_minutes import TABLE, record_folder, record_on_record
from matgptq.allocation import CostModel
from matgptq.allocation.choice import paired_gap
from matgptq.allocation.fitness import Fitness
from matgptq.evaluation.teacher import Teacher
from matgptq.execution import format_table
from matgptq.formats import read_checkpoint

SEQLEN, WINDOWS, POOL = 256, 64, 8  # the recipe's windows and pool (--calib-tokens 2040 = 8 × 255)
STAGES = (1, 2, POOL)  # windows a stage of the recipe scores (255:2, 510:1), then the pool
RECIPE = ("--windows", str(WINDOWS), "--seqlen", str(SEQLEN), "--runs", f"ten-seed-S{folder_suffix(TABLE)}")
KINDS = ("start", "written")


def build_parser():
    return seed_parser(__doc__, "search_noise.json")


@torch.no_grad()
def per_window(parent: Path, seed: int, named: dict[str, dict[str, dict[str, int]]]) -> dict[str, dict]:
    """{budget: {kind: widths}} → {budget: {kind: KL per window}} on the first WINDOWS windows of seed's range."""
    windows = calib_windows(seed, WINDOWS, SEQLEN)
    names = CostModel.from_checkpoint(read_checkpoint(parent), LEVELS).names
    with Teacher(matgptq.load(MODEL), windows) as teacher:
        fitness = Fitness(matgptq.load(parent, bits=8, packed=False), teacher, windows, names)
        every = tuple(range(WINDOWS))
        return {bud: {k: fitness.window_kls(tuple(w[n] for n in names), every) for k, w in kinds.items()}
                for bud, kinds in named.items()}  # fmt: skip


def measure(parent: Path, work: Path, seed: int) -> dict:
    folder = record_folder(work, seed, "search_noise")
    bodies = {b: load_json(folder / f"mix-{b}.json") for b in BUDGETS}
    named = {b: {"start": body["start_bits"], "written": body["bits"]} for b, body in bodies.items()}
    held = score_named(parent, named)
    kls = per_window(parent, seed, named)
    return {b: {"windows": kls[b], "held_out": {k: held[b][k]["kl"] for k in KINDS},
                "pool_in_file": bodies[b]["summary"]["kl"], "generations": bodies[b]["summary"]["generations"]}
            for b in BUDGETS}  # fmt: skip


def summary(run: dict) -> dict:
    """One seed's budget: the gain ratios, SE(k) and the windows needed (module docstring)."""
    s, w = run["windows"]["start"], run["windows"]["written"]
    d = [x - y for x, y in zip(w[POOL:], s[POOL:])]
    base = statistics.fmean(s[POOL:])
    sd, mean = statistics.stdev(d), statistics.fmean(d)
    return {"pool": sum(w[:POOL]) / sum(s[:POOL]), "fresh": sum(w[POOL:]) / sum(s[POOL:]),
            "held": run["held_out"]["written"] / run["held_out"]["start"],
            "se": {k: sd / math.sqrt(k) / base for k in STAGES},
            "windows": math.inf if mean == 0 else (2 * sd / mean) ** 2,
            "pool_test": None if mean == 0 else paired_gap(w[:POOL], s[:POOL], "start").shown,
            "check": abs(statistics.fmean(w[:POOL]) / run["pool_in_file"] - 1)}  # fmt: skip


def needed_windows(p: dict) -> str:
    """One seed's windows for 2 SE, "above" where the written mix scored worse than the start on the fresh windows."""
    if math.isinf(p["windows"]):
        return "—"
    return f"{p['windows']:.0f}" + (" above" if p["fresh"] > 1 else "")


def page(data: dict) -> str:
    seeds = sorted(data["seeds"])
    rows, worst, kept = [], 0.0, []
    for b in BUDGETS:
        per = [summary(data["seeds"][s][b]) for s in seeds]
        kept += [p["held"] for p in per if p["pool_test"] is False]
        worst = max(worst, *(p["check"] for p in per))
        ratio = lambda k: stats([p[k] for p in per], 3) + "×"  # noqa: E731
        needed = " ".join(needed_windows(p) for p in per)
        rows.append([b, ratio("pool"), ratio("fresh"), ratio("held"),
                     *(f"{100 * statistics.fmean(p['se'][k] for p in per):.1f}%" for k in STAGES), needed])
    intro = (f"{seeds_named(seeds)}: ratios mean ± standard deviation over the seeds "
             "(written / start; below 1 the evolution gained); SE(k) their mean, in % of the start's KL; windows seed "
             "by seed (`above`: those that show the written mix worse than the start on fresh text; — where it is "
             f"the start). The written mix's pool score matches its mix file's to {worst:.1e} (relative).")
    return "\n".join([
        *page_top("search_noise", "How noisy the 10-minute search's fitness is", data), intro, "",
        format_table(["budget", "pool (8 windows)", "fresh (56)", "held-out", "SE(1)", "SE(2)", "SE(8)",
                      "windows for 2 SE"], rows), "", pool_test(kept, len(seeds) * len(BUDGETS)), ""])  # fmt: skip


def pool_test(kept: list[float], cells: int) -> str:
    """What a test of the written mix against the start on the pool would do (the uniform slice's, choice.py)."""
    if not kept:
        return "A paired test of the written mix against the start on the pool would keep the written mix everywhere."
    return (f"A paired test of the written mix against the start on the pool, as `choice.py` tests the uniform slice "
            f"(mean + 2 SE < 0 on the 8 windows), would keep the start at {len(kept)} of the {cells} budgets × seeds; "
            f"there the written mix's held-out KL is {min(kept):.3f}-{max(kept):.3f}× the start's, "
            f"{statistics.fmean(kept):.3f}× on the mean: the pool cannot tell them apart either.")


def main() -> None:
    record_on_record("search_noise", build_parser().parse_args(), RECIPE, __doc__, measure, page)


if __name__ == "__main__":
    main()
