"""Two corrections of the 10-minute search's table (issue #44 item 2): on SmolLM2-135M-Instruct, at 3.25 and 3.5 bits,
where the search ties the additive allocation, does a model of the table's errors give a better knapsack mix?

Protocol: per seed of benchmarks/search_ten_minutes.py's record (its parent, its seed's calibration range and pool,
its held-out text), the record's shared table s_l(r) (a mix file's `sensitivity`: every layer alone, widths 2-3 on
one window, 4-5 on two, 6-7 extrapolated; increments Δ_l(r) = s_l(r) − s_l(top)), and at each budget the knapsack
mix of (allocation/sensitivity.knapsack_mix):
  additive      the table as measured: the record's start and `additive` baseline
  error model   the noise of one window pooled across widths: Δ_l(r) ← a_l · g(r) · e_l(r) at r = 3, 4, 5, with
                e_l(r) llama.cpp's imatrix-weighted error of the slice (allocators.error_table, the pool's 8 windows),
                g(r) one factor per width for all layers (the median over layers of (Δ_l(r)/e_l(r)) / (Δ_l(3)/e_l(3))),
                a_l the geometric mean over those widths of Δ_l(r) / (g(r) e_l(r))
  half model    the geometric mean of measured and modelled increments, at r = 2-5 (g(2) fitted as the others)
  block κ       the context the table misses (the other layers quantized, the layers of a block together): with M the
                additive mix, per block b, κ_b = [F(M) − F(M, block b at the top width)] / Σ_{l∈b} Δ_l(M_l) on the
                pool (bfloat16, the search's scoring), clipped to [1/4, 4]; the block's increments scaled by κ_b
  block √κ      the same with κ_b^½ (half the correction: κ is one measurement of a difference of two pool scores)
  type κ, √κ    the same per kind of layer (q_proj, k_proj, ..., down_proj: every block's layer of that name at once),
                7 groups of 30 layers whose raising moves the pool's KL far more than its noise
  scoring       on the first 4 × 1024 tokens of the first half of WikiText-2 test (never calibrated on), float32, KL to
                the float32 model; each mix's KL against `additive`'s, per seed (paired: the same table and text)

    python -m benchmarks.search_table_models [--seeds 0,1,2]    # ~4 minutes a seed on 2 cores, after search_ten_minutes
"""

from __future__ import annotations

import statistics
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

import matgptq
from benchmarks._harness import load_json
from benchmarks._search_setup import (LEVELS, MODEL, calib_windows, page_top, score_named, seed_parser, seeds_named,
                                      stats)
from benchmarks.search_baselines import verdict
from benchmarks.search_ten_minutes import record_folder, record_on_record
from matgptq.allocation import BudgetKind, CostModel
from matgptq.allocation.allocators import error_table
from matgptq.allocation.fitness import Fitness
from matgptq.allocation.sensitivity import knapsack_mix
from matgptq.evaluation.teacher import Teacher
from matgptq.execution import format_table
from matgptq.formats import read_checkpoint

BUDGETS = ("3.25", "3.5")
POOL = 8  # the record's pool: --calib-tokens 2040 = 8 windows of 256
# κ is a difference of two pool scores over a predicted increment: where the pool's noise is of the group's size it
# can come out negative (block 4 of seed 2 at 3.25 bits), which would make lowering a layer look like a gain
KAPPA_CLIP = (0.25, 4.0)
KINDS = ("additive", "error model", "half model", "block κ", "block √κ", "type κ", "type √κ")
RECIPE = ("--record", "search_ten_minutes", "--budgets", *BUDGETS, "--groups", "block,type")


def build_parser():
    return seed_parser(__doc__, "search_table_models.json")


def error_model(table: np.ndarray, errors: np.ndarray, widths: tuple[int, ...], weight: float) -> np.ndarray:
    """The table with its increments at `widths` replaced by exp(w·log(a_l g(r) e_l(r)) + (1 − w)·log Δ_l(r))
    (module docstring; w = `weight`); increments at or below zero are floored at 1e-9 for the logarithms."""
    base = table[:, -1:]
    inc = np.maximum(table - base, 1e-9)
    idx = [LEVELS.index(r) for r in widths]
    ratio = inc[:, idx] / errors[:, idx]
    g = np.exp(np.median(np.log(ratio / ratio[:, [widths.index(3)]]), axis=0))
    a = np.exp(np.mean(np.log(ratio / g), axis=1))
    out = inc.copy()
    for j, i in enumerate(idx):
        out[:, i] = np.exp(weight * np.log(a * g[j] * errors[:, i]) + (1 - weight) * np.log(inc[:, i]))
    return base + out


@torch.no_grad()
def group_kappas(fitness: Fitness, table: np.ndarray, mix: tuple[int, ...], group_of: list[int]) -> list[float]:
    """κ_g of every group g = 0, 1, ... of layers (`group_of[l]`: layer l's; module docstring), on all of `fitness`'s
    windows."""
    windows = tuple(range(len(fitness.windows)))
    cache = fitness.prefix_cache(mix, windows)
    at_mix = fitness.kl(mix, windows, cache)
    top = LEVELS[-1]
    kappas = []
    for group in range(max(group_of) + 1):
        layers = [l for l, g in enumerate(group_of) if g == group]
        raised = tuple(top if l in layers else r for l, r in enumerate(mix))
        predicted = sum(table[l, LEVELS.index(mix[l])] - table[l, -1] for l in layers)
        measured = at_mix - fitness.kl(raised, windows, cache)
        kappas.append(measured / predicted if predicted > 0 else 1.0)
    return kappas


def scaled(table: np.ndarray, group_of: list[int], kappas: list[float], power: float) -> np.ndarray:
    """The table with group g's increments times clip(κ_g)^power."""
    k = np.clip(np.array(kappas), *KAPPA_CLIP) ** power
    base = table[:, -1:]
    return base + (table - base) * k[group_of][:, None]


def layer_kinds(names: tuple[str, ...]) -> list[int]:
    """Each layer's kind (the last part of its name: q_proj, ..., down_proj) as an index, in order of appearance."""
    kinds = list(dict.fromkeys(n.rsplit(".", 1)[-1] for n in names))
    return [kinds.index(n.rsplit(".", 1)[-1]) for n in names]


def measure(parent: Path, work: Path, seed: int) -> dict:
    cost = CostModel.from_checkpoint(read_checkpoint(parent), LEVELS)
    names = cost.names
    body = load_json(record_folder(work, seed, "search_table_models") / f"mix-{BUDGETS[0]}.json")
    table = np.array([[body["sensitivity"][n][str(r)] for r in LEVELS] for n in names])
    mix_of = lambda t, b: knapsack_mix(cost, t.tolist(), Fraction(b), BudgetKind.CODE)  # noqa: E731
    windows = calib_windows(seed, POOL)
    with Teacher(matgptq.load(MODEL), windows) as teacher:
        model = matgptq.load(parent, bits=8, packed=False)
        errors = np.array(error_table(Fitness(model, teacher, windows, names), LEVELS, tuple(range(POOL))))
        fitness = Fitness(model, teacher, windows, names, compute_dtype=torch.bfloat16)
        groups = {"block": list(fitness.block_of), "type": layer_kinds(names)}
        named, kappas = {}, {}
        for b in BUDGETS:
            start = mix_of(table, b)
            kappas[b] = {g: group_kappas(fitness, table, start, of) for g, of in groups.items()}
            tables = {"additive": table, "error model": error_model(table, errors, (3, 4, 5), 1.0),
                      "half model": error_model(table, errors, (2, 3, 4, 5), 0.5),
                      **{f"{g} {sign}": scaled(table, of, kappas[b][g], power) for g, of in groups.items()
                         for sign, power in (("κ", 1.0), ("√κ", 0.5))}}  # fmt: skip
            named[b] = {k: dict(zip(names, mix_of(t, b))) for k, t in tables.items()}
    held = score_named(parent, named)
    return {b: {"held_out": {k: held[b][k]["kl"] for k in KINDS}, "kappas": kappas[b]} for b in BUDGETS}


def page(data: dict) -> str:
    seeds = sorted(data["seeds"])
    runs = [data["seeds"][s] for s in seeds]
    rows = []
    for b in BUDGETS:
        additive = [r[b]["held_out"]["additive"] for r in runs]
        for k in KINDS:
            kl = [r[b]["held_out"][k] for r in runs]
            rows.append([b, k, stats(kl), "—" if k == "additive" else verdict(kl, additive),
                         f"{statistics.fmean(kl) / statistics.fmean(additive):.3f}×",
                         " ".join(f"{x / y:.3f}" for x, y in zip(kl, additive))])  # fmt: skip
    spread = [[b, g, s, f"{min(k):.2f}", f"{statistics.median(k):.2f}", f"{max(k):.2f}",
               str(sum(not KAPPA_CLIP[0] <= x <= KAPPA_CLIP[1] for x in k))]
              for b in BUDGETS for g in ("block", "type") for s, r in zip(seeds, runs)
              for k in [r[b]["kappas"][g]]]  # fmt: skip
    return "\n".join([
        *page_top("search_table_models", "Two corrections of the 10-minute search's table", data),
        f"{seeds_named(seeds)}. Held-out KL of each knapsack mix (mean ± sample standard "
        "deviation over the seeds), its verdict against `additive` (a tie within the larger seed spread, "
        "search_baselines.verdict), their mean KLs' ratio, and the ratio seed by seed:", "",
        format_table(["budget", "table", "held-out KL", "vs additive", "ratio", "per seed"], rows), "",
        "The factors κ per seed (30 blocks, 7 kinds of layer): their range, median, and how many the clip changed:",
        "", format_table(["budget", "groups", "seed", "min κ", "median κ", "max κ", "clipped"], spread),
        ""])  # fmt: skip


def main() -> None:
    record_on_record("search_table_models", build_parser().parse_args(), RECIPE, __doc__, measure, page)


if __name__ == "__main__":
    main()
