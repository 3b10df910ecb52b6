"""The search's start: the one-shot tables, made once and shared by the budgets, and each budget's one-shot
allocations from them: the knapsack mix of the start's own table first (--sensitivity full: the measured additive
table; probe: the probe table), then those of --baselines (none unless asked for; allocators.py).

Under a time limit (timing.py) the lowest width of the own table is scored until CLOSING_SHARE of the limit is left;
a baseline's table is made only where its price (its window scorings at the measured pace) fits before the tables'
deadline, and the own table's wider widths stop there too. A budget without the own table starts from its uniform
slice; what was left out is in each budget's `cut`."""

from __future__ import annotations

from contextlib import nullcontext
from fractions import Fraction

import torch

from .allocators import Allocator, baseline_mixes, lacking, raise_floors, tables
from .fitness import Fitness, Mix
from .inputs import Inputs, wide_of
from .pool import REPORT_TEXT_MIXES
from .request import SearchRequest
from .resume import read_tables, tables_path, tables_settings, write_tables
from .sensitivity import Sensitivity, relative_errors
from .spread import from_rank0, is_writer
from .timing import TABLES_SHARE, Schedule

REPORT_MIXES = 2  # the mixes a budget's report scores on the pool besides its one-shot ones: evolved, refined start
GRADIENT_SCORINGS = 4  # a first-order table's passes, in scorings of its windows (gradient.py)


def own(req: SearchRequest) -> Allocator:
    """The table of the search's knapsack start: --sensitivity probe or full (the measured additive model)."""
    return Allocator.ADDITIVE if req.start.sensitivity is Sensitivity.FULL else Allocator.PROBE


def others(req: SearchRequest) -> tuple[Allocator, ...]:
    """The one-shot allocations weighed beside the knapsack start: the --baselines and, with --sensitivity full,
    PROBE's, which the full table holds for free (its lowest width, the rest extrapolated)."""
    baselines = req.start.baselines
    free = req.start.sensitivity is Sensitivity.FULL and Allocator.PROBE not in baselines
    return (*baselines, Allocator.PROBE) if free else baselines


def shared_tables(
    req: SearchRequest,
    fitness: Fitness,
    inputs: Inputs,
    windows: tuple[int, ...],
    settings: dict,
    schedule: Schedule,
    to_search: int,
    text_windows: int,
) -> tuple[dict, bool, list[str]]:
    """({allocator: Filled} shared by the budgets, whether they were all read back, what a time limit left out).
    With --resume, the tables the run before made with the same settings are read back (resume.py) and only the
    rest scored; then all are saved. `windows`: the sensitivity windows; `to_search` budgets each keep the price of
    their choice and report on the pool (and on `text_windows` held-out windows) where the limit allows."""
    levels, cost_model = inputs.levels, inputs.cost_model
    floors = raise_floors(cost_model, [b for _, b in inputs.budgets], req.kind)
    asked = (own(req), *others(req))
    saved, path = tables_settings(settings), tables_path(req.out)
    have = from_rank0(read_tables(path, saved, len(cost_model.names)) if req.resume and is_writer() else None) or {}
    if have and not lacking(asked, floors, have)[0]:
        return have, True, []
    deadline = cutoff = None
    if schedule.end is not None:
        relative_errors(fitness, levels)  # every table extrapolates from them: made now, before the deadlines
        pool = fitness.windows.shape[0]
        per_budget = schedule.price((len(asked) + REPORT_MIXES) * pool + REPORT_TEXT_MIXES * text_windows)
        deadline = max(
            schedule.end - schedule.closing() - to_search * per_budget, schedule.at(TABLES_SHARE, schedule.closing())
        )
        cutoff = schedule.deadline(schedule.end - schedule.closing())
        sizes = (len(windows), len(cost_model.names), len(levels) - 1, len(floors))
        asked = schedule.agree(_priced(asked, own(req), sizes, schedule, deadline))
    exact = req.score_dtype.tables(fitness.compute_dtype, schedule.end is not None) == torch.float32
    with fitness.exact() if exact else nullcontext():
        filled = tables(
            fitness,
            levels,
            windows,
            asked,
            req.evo.seed,
            req.progress,
            floors,
            deadline,
            req.start.top,
            have,
            wide_of(req, fitness.windows.shape[0]),
            cutoff,
        )
    if is_writer():
        write_tables(path, saved, filled)
    return filled, False, _left_out(req, levels, filled)


def _priced(
    asked, first: Allocator, sizes: tuple[int, int, int, int], schedule: Schedule, deadline: float
) -> tuple[Allocator, ...]:
    """`first` and, in order, each other allocator of `asked` whose table's scorings still fit before `deadline`;
    `sizes`: the tables' windows, the units, the widths below the top and the gradient's floors."""
    windows, units, widths, floors = sizes
    price = {
        Allocator.UNIFORM: 0,
        Allocator.ERROR: windows,
        Allocator.NOISE: (1 + 2 * units) * windows,
        Allocator.GRADIENT: GRADIENT_SCORINGS * windows * floors,
        Allocator.PROBE: units * windows,
        Allocator.ADDITIVE: units * windows * widths,
    }
    out, spent = [first], 0.0
    for a in asked[1:]:
        if (a is Allocator.PROBE and first is Allocator.ADDITIVE) or a is Allocator.UNIFORM:
            out.append(a)  # read off the additive table, or no table at all
        elif schedule.now() + spent + schedule.price(price[a]) <= deadline:
            out.append(a)
            spent += schedule.price(price[a])
    return tuple(out)


def _left_out(req: SearchRequest, levels, filled: dict) -> list[str]:
    """What the tables lack that was asked for: a baseline's table, the own table or widths it did not score."""
    cut = [f"baseline {a.value}" for a in req.start.baselines if a is not Allocator.UNIFORM and a not in filled]
    if own(req) not in filled:
        return [*cut, "the start's table (the uniform slice instead)"]
    measured = filled[own(req)].measured or ()
    if req.start.sensitivity is Sensitivity.FULL:
        wanted = [r for r in levels[1:-1] if req.start.top is None or r <= req.start.top]
        if missing := [r for r in wanted if r not in measured]:
            cut.append(f"table widths {','.join(map(str, missing))} (extrapolated)")
    return cut


def one_shot(req: SearchRequest, cost_model, filled: dict, budget: Fraction) -> dict[str, Mix]:
    """{label: mix} of one budget: the knapsack start first ("knapsack"; without its table the budget's uniform slice,
    "uniform R"), then each other allocation with a table (allocators.baseline_mixes)."""
    return baseline_mixes(cost_model, filled, own(req), others(req), budget, req.kind)
