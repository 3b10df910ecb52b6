"""One-shot allocations: a mix per budget from a per-layer loss table and the exact knapsack, no search.

Each allocator predicts v_l(r), the loss of the parent with layer l at width r, and takes the mix minimising
Σ_l v_l(r_l) under the budget (knapsack.py) — the additive model every shipped allocator uses. They differ in how
the table is filled, and in what it costs:

- UNIFORM   the widest uniform slice under the budget. Free.
- PROBE     the start of `search --sensitivity probe` (sensitivity.py): each layer scored at the lowest width, the others
            linear in the layer's relative squared weight error. Layers × 1 scorings.
- ADDITIVE  each layer scored alone at every width (sensitivity.py, FULL): the measured additive model.
            Layers × (widths − 1) scorings.
- NOISE     ExLlamaV3's idea (its `sc_*` optimizer): inject Gaussian noise into one layer of the top mix at two
            relative Frobenius norms ρ_a > ρ_b (those of the layer's two lowest slices), score both, and fit
            ΔKL_l(ρ) = S_l · ρ^α_l through them (α_l clamped to [ALPHA_MIN, ALPHA_MAX]; ALPHA_DEFAULT, ExLlamaV3's
            α ≈ 2, when a probe does not raise the loss); then v_l(r) = base + S_l · rfn_l(r)^α_l with
            rfn_l(r) = ‖W_l(r) − W_l(top)‖ / ‖W_l(top)‖. The noise is unshaped (i.i.d.), where ExLlamaV3 shapes it
            like its quantizer's error. Layers × 2 scorings.
- ERROR     llama.cpp's `--target-bpw` idea: no forward pass per candidate. The importance of input column j is the
            mean square of the layer's input on the calibration windows (llama.cpp's imatrix), and
            v_l(r) = Σ_ij imatrix_l,j · (W_l(r) − W_l(top))_ij² — the layer's output error with the columns' cross
            terms dropped, summed across layers without weighting them. One forward pass of the top mix.

Costs are scorings of the windows given (fitness.py); `tables` returns each table with its seconds (GRADIENT's:
one table per floor width, `FloorTables`) and, for PROBE and ADDITIVE, the widths it scored.
"""

from __future__ import annotations

import math
import time
from enum import Enum
from fractions import Fraction
from typing import NamedTuple

import torch
from tqdm.auto import tqdm

from ..models import layer_weight
from ..models.experts import experts_as_layers
from .budget import BudgetKind, CostModel
from .fitness import Fitness, Mix
from .gradient import FloorTables, first_order_table, floor_mix
from .sensitivity import Sensitivity, Table, Wide, knapsack_mix, measure_table, probe_of, relative_errors
from .timing import Deadline, OutOfTime

ALPHA_MIN, ALPHA_MAX, ALPHA_DEFAULT = 0.5, 4.0, 2.0


class Allocator(str, Enum):
    UNIFORM = "uniform"
    PROBE = "probe"
    ADDITIVE = "additive"
    NOISE = "noise"
    ERROR = "error"
    GRADIENT = "gradient"


def uniform_mix(cost_model: CostModel, budget: Fraction, kind: BudgetKind) -> Mix:
    """The widest uniform mix within the budget (check_budget guarantees the lowest fits)."""
    n = len(cost_model.names)
    fitting = [r for r in cost_model.levels if cost_model.fits(tuple(r for _ in range(n)), budget, kind)]
    return tuple(fitting[-1] for _ in range(n))


def raise_floors(cost_model: CostModel, budgets, kind: BudgetKind) -> tuple[int, ...]:
    """The uniform widths of `budgets` that leave room to raise at least one layer a level (GRADIENT's floors)."""
    out = set()
    for budget in budgets:
        mix = uniform_mix(cost_model, budget, kind)
        if mix[0] == cost_model.levels[-1]:
            continue
        up = cost_model.levels[cost_model.levels.index(mix[0]) + 1]
        if any(cost_model.fits(mix[:l] + (up,) + mix[l + 1 :], budget, kind) for l in range(len(mix))):
            out.add(mix[0])
    return tuple(sorted(out))


def power_law(rho_a: float, d_a: float, rho_b: float, d_b: float) -> tuple[float, float]:
    """(S, α) of d = S · ρ^α through (ρ_a, d_a) and (ρ_b, d_b), ρ_a > ρ_b > 0; α clamped to [ALPHA_MIN, ALPHA_MAX],
    ALPHA_DEFAULT where either increase is not positive. S is fitted at the larger probe (a loss below the base
    gives S = 0: the layer is free)."""
    if d_a > 0 and d_b > 0 and rho_a > rho_b > 0:
        alpha = min(ALPHA_MAX, max(ALPHA_MIN, math.log(d_a / d_b) / math.log(rho_a / rho_b)))
    else:
        alpha = ALPHA_DEFAULT
    return (max(d_a, 0.0) / rho_a**alpha if rho_a > 0 else 0.0), alpha


def noise(weight: torch.Tensor, rho: float, seed: int) -> torch.Tensor:
    """`weight` plus i.i.d. Gaussian noise of relative Frobenius norm `rho` (deterministic in `seed`)."""
    g = torch.randn(weight.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    w = weight.double().cpu()
    return (w + g * (rho * w.norm() / g.norm())).to(weight.dtype)


def noise_table(
    fitness: Fitness, levels: tuple[int, ...], windows: tuple[int, ...], seed: int = 0, progress: bool = False
) -> list[list[float]]:
    """v_l(r) of NOISE (module docstring) for every layer of `fitness.names` (untied units only: a tied unit would
    need its noise shared among its layers)."""
    if fitness.units.tied:
        raise ValueError("the noise table is made layer by layer; it has no tied form")
    top = fitness.uniform(levels[-1])
    cache = fitness.prefix_cache(top, windows)
    base = fitness.kl(top, windows, cache)
    rfn = [[math.sqrt(t) for t in row] for row in relative_errors(fitness, levels)]
    table = []
    for layer in tqdm(range(len(top)), desc="noise probes", unit="layer", disable=not progress, leave=False):
        weight = layer_weight(fitness.model, fitness.names[layer], fitness.spec)
        rho_a, rho_b = rfn[layer][0], rfn[layer][1]
        d = [
            fitness.kl(top, windows, cache, (layer, noise(weight, rho, seed + 2 * layer + i))) - base
            if rho > 0
            else 0.0
            for i, rho in enumerate((rho_a, rho_b))
        ]
        s, alpha = power_law(rho_a, d[0], rho_b, d[1])
        table.append([base + s * x**alpha for x in rfn[layer]])
    return table


@torch.no_grad()
def input_importance(fitness: Fitness, top: int, windows: tuple[int, ...]) -> list[torch.Tensor]:
    """Per layer of `fitness.names`: the mean square of each input column over the windows' tokens, every layer at
    width `top` (llama.cpp's imatrix)."""
    fitness.apply(fitness.uniform(top))
    sums: list[torch.Tensor | None] = [None] * len(fitness.names)
    counts = [0] * len(fitness.names)

    def hook(i):
        def record(module, args):
            x = args[0].reshape(-1, args[0].shape[-1]).double()
            sums[i] = x.square().sum(0) if sums[i] is None else sums[i] + x.square().sum(0)
            counts[i] += x.shape[0]

        return record

    with experts_as_layers(fitness.blocks, fitness.spec.experts):  # fused experts: each sees its routed tokens
        handles = [
            fitness.model.get_submodule(n).register_forward_pre_hook(hook(i)) for i, n in enumerate(fitness.names)
        ]
        try:
            fitness.run(windows)
        finally:
            for h in handles:
                h.remove()
    width = [layer_weight(fitness.model, n, fitness.spec).shape[1] for n in fitness.names]
    # an expert the router sent no token to has no input, hence no importance
    return [s.cpu() / c if c else torch.zeros(k, dtype=torch.float64) for s, c, k in zip(sums, counts, width)]


def error_table(fitness: Fitness, levels: tuple[int, ...], windows: tuple[int, ...]) -> list[list[float]]:
    """v_l(r) of ERROR (module docstring) for every unit of `fitness.units` (its layers' errors added)."""
    layers = fitness.model.matgptq.layers
    table = []
    for name, imatrix in zip(fitness.names, input_importance(fitness, levels[-1], windows)):
        top = layers[name].slice(levels[-1]).dequantize(torch.float64)
        imatrix = imatrix.to(top.device)
        table.append(
            [float(((layers[name].slice(r).dequantize(torch.float64) - top).square() * imatrix).sum()) for r in levels]
        )
    return fitness.units.sum_rows(table)


class Filled(NamedTuple):
    """One allocator's loss table, the seconds it took and, for PROBE and ADDITIVE, the widths actually scored."""

    table: list | FloorTables
    seconds: float
    measured: tuple[int, ...] | None = None


TABLED = tuple(a for a in Allocator if a is not Allocator.UNIFORM)  # every allocator but UNIFORM fills a table


def lacking(allocators, floors: tuple[int, ...], have: dict) -> tuple[tuple[Allocator, ...], tuple[int, ...]]:
    """(the table-based allocators among `allocators` with no table in `have` ({allocator: Filled}), the widths of
    `floors` whose GRADIENT table `have` lacks): what `tables` scores given the tables of the run before."""
    grad = have.get(Allocator.GRADIENT)
    new_floors = tuple(u for u in floors if grad is None or u not in grad.table)
    todo = tuple(a for a in allocators if a in TABLED and (a not in have or (a is Allocator.GRADIENT and new_floors)))
    return todo, new_floors


def tables(
    fitness: Fitness,
    levels: tuple[int, ...],
    windows: tuple[int, ...],
    allocators,
    seed: int = 0,
    progress: bool = False,
    floors: tuple[int, ...] = (),
    deadline: float | None = None,
    highest: int | None = None,
    have: dict[Allocator, Filled] | None = None,
    wide: Wide | None = None,
    cutoff: Deadline | None = None,
) -> dict[Allocator, Filled]:
    """{allocator: Filled} for the table-based allocators among `allocators`; GRADIENT's table is one table per width
    of `floors` (raise_floors of the budgets). ADDITIVE is filled last, and stops at `deadline` (time.perf_counter();
    sensitivity.measure_table) or after the level `highest`: the other tables are cheap and fixed, its widths can be
    traded for time; the levels of `wide` it scores on that one's windows. PROBE, asked for beside ADDITIVE, is read
    off ADDITIVE's lowest width (sensitivity.probe_of: no scoring of its own). `have`: tables made before on the same
    windows (resume.py), kept as they are and returned with the rest; only what they lack is scored (`lacking`), a
    GRADIENT floor they lack added to theirs. `cutoff` (timing.Deadline): PROBE's and ADDITIVE's scorings stop there
    (measure_table); where that leaves no table, it is not among those returned."""
    out = dict(have or {})
    todo, new_floors = lacking(allocators, floors, out)
    fill = {
        Allocator.PROBE: lambda: measure_table(fitness, levels, windows, Sensitivity.PROBE, progress, cutoff=cutoff),
        Allocator.ADDITIVE: lambda: measure_table(
            fitness, levels, windows, Sensitivity.FULL, progress, deadline, highest, wide, cutoff
        ),
        Allocator.NOISE: lambda: noise_table(fitness, levels, windows, seed, progress),
        Allocator.ERROR: lambda: error_table(fitness, levels, windows),
        Allocator.GRADIENT: lambda: {u: first_order_table(fitness, levels, windows, u) for u in new_floors},
    }
    derived = Allocator.PROBE in todo and Allocator.ADDITIVE in (*todo, *out)
    for a in sorted(todo, key=lambda a: a is Allocator.ADDITIVE):
        if derived and a is Allocator.PROBE:
            continue
        t0 = time.perf_counter()
        try:
            table = fill[a]()
        except OutOfTime:  # not even its lowest width in time
            derived = False
            continue
        seconds = time.perf_counter() - t0
        if a is Allocator.GRADIENT and a in out:  # the floors of the run before, and the new ones
            table, seconds = {**out[a].table, **table}, out[a].seconds + seconds
        out[a] = Filled(table.values, seconds, table.measured) if isinstance(table, Table) else Filled(table, seconds)
    if derived:
        full = out[Allocator.ADDITIVE]
        probe = probe_of(fitness, levels, Table(full.table, full.measured))
        out[Allocator.PROBE] = Filled(probe.values, 0.0, probe.measured)
    return out


def allocate(
    cost_model: CostModel, table: list[list[float]] | FloorTables | None, budget: Fraction, kind: BudgetKind
) -> Mix:
    """The mix of a table (the knapsack under the budget), the uniform mix for table None; for GRADIENT's tables, the
    knapsack above the budget's uniform width (the uniform mix where no table was made for it: no room to raise)."""
    if table is None or isinstance(table, dict):
        uniform = uniform_mix(cost_model, budget, kind)
        if table is None or uniform[0] not in table:
            return uniform
        return floor_mix(cost_model, table[uniform[0]], budget, kind, uniform[0])
    return knapsack_mix(cost_model, table, budget, kind)


def baseline_mixes(
    cost_model: CostModel,
    filled: dict,
    own: Allocator,
    others: tuple[Allocator, ...],
    budget: Fraction,
    kind: BudgetKind,
) -> dict[str, Mix]:
    """{label: mix} of the allocations at one budget: the search's own knapsack start first ("knapsack", from the
    `own` table; where `filled` lacks it, the uniform slice in its place), then each of `others` ("uniform R" for
    UNIFORM, else the allocator's name) that `filled` holds a table of."""
    if own in filled:
        mixes = {"knapsack": allocate(cost_model, filled[own][0], budget, kind)}
    else:
        uniform = uniform_mix(cost_model, budget, kind)
        mixes = {f"uniform {uniform[0]}": uniform}
    for a in others:
        if a is Allocator.UNIFORM:
            mix = uniform_mix(cost_model, budget, kind)
            mixes[f"uniform {mix[0]}"] = mix
        elif a is not own and a in filled:
            mixes[a.value] = allocate(cost_model, filled[a][0], budget, kind)
    return mixes
