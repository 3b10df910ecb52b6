"""One budget's steps 3-6 of `matgptq search` (runner.py: the run, steps 1-2 and the loop over budgets).

3. start    its one-shot allocations from the shared tables, and the lowest of them on as many pool windows as the
            time left affords (choice.first_parent).
4. refine   the start re-measured where it is, a group of layers at a time (refine.py).
5. evolve   (1+λ) EvoPress from the refined start, its state written after every generation (evopress.py).
6. choose   the candidates on the pool, the lowest written with how it was made (choice.report, record.py).
Under --time-limit each step gets what is left by the budget's end, less what the report and the mix file need.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from .choice import first_parent, report
from .evopress import evolve
from .fitness import Fitness, Mix
from .inputs import Inputs
from .plot import plot_mix
from .pool import REPORT_TEXT_MIXES
from .record import sensitivity_of, work_of, write_mix
from .refine import Refined, refine
from .request import SearchRequest, mix_path, state_path
from .spread import is_writer
from .start import REPORT_MIXES, one_shot, own
from .timing import Schedule, Timebox


class Search(NamedTuple):
    """What the budgets' steps share."""

    req: SearchRequest
    inputs: Inputs
    fitness: Fitness
    filled: dict  # the one-shot tables, {allocator: allocators.Filled}
    windows: tuple[int, ...]  # the sensitivity windows
    settings: dict[str, dict]  # per budget (record.settings_of)
    held_out: tuple  # (windows, teacher) of --text, or (None, None)
    schedule: Schedule
    cut: list[str]  # what the time limit left out of every budget
    reused: bool  # the tables were all read back (--resume)


class _Start(NamedTuple):
    """A budget's step 3: its one-shot allocations and the lowest of them on the first `n` pool windows."""

    mixes: dict[str, Mix]  # {allocator: its mix}
    n: int  # the pool windows the choice scored
    box: Timebox | None  # the choice's time box, None without a limit
    mix: Mix  # the first parent
    kind: str  # the allocator it came from
    pooled: dict[Mix, list[float]]  # what the choice measured, for the report


def search_budget(s: Search, label: str, budget, end: float | None, shared_since: float | None) -> dict:
    """One budget's steps 3-6 (module docstring) by `end` (None: no limit), its mix file written; its summary row.
    The first budget's row carries the shared steps' seconds, counted from `shared_since`."""
    t0 = s.schedule.now() if shared_since is None else shared_since
    closing = s.schedule.closing() / len(s.settings)  # what the mix file needs after the report
    start = _start(s, budget, end, closing)  # 3. start
    deadline = None if end is None else end - closing - _report_price(s, start.n)
    state, table = _improve(s, label, budget, start.mix, deadline)  # 4. refine, 5. evolve
    row = _choose(s, label, start, state, table, end, closing, t0, shared_since is not None)  # 6. choose
    _plot(s, label, end)
    return row


def _start(s: Search, budget, end: float | None, closing: float) -> _Start:
    """Step 3 of one budget: its one-shot allocations, and the lowest of them on as many pool windows as the time
    left affords (all of them without a limit)."""
    req, schedule = s.req, s.schedule
    mixes = one_shot(req, s.inputs.cost_model, s.filled, budget)
    n, box = schedule.choice(
        len(s.fitness.windows),
        len(set(mixes.values())),
        req.pool.batch_size,
        end,
        closing + _report_price(s, 0),
        REPORT_MIXES,
    )
    t_choice = schedule.now()
    mix, kind, pooled = first_parent(s.fitness, mixes, tuple(range(n)), box)
    if box is not None and pooled:
        schedule.timed(schedule.now() - t_choice, len(pooled) * len(next(iter(pooled.values()))))
    return _Start(mixes, n, box, mix, kind, pooled)


def _improve(s: Search, label: str, budget, start: Mix, deadline: float | None):
    """Steps 4-5 of one budget: `start` refined (not where a resumed search continues from its saved state, which
    holds its refined start), then evolved by `deadline`; the evolution's last state and the search's own table."""
    req, schedule, cost_model, levels = s.req, s.schedule, s.inputs.cost_model, s.inputs.levels
    costs, bits = cost_model.table(req.kind), cost_model.limit(budget, req.kind)
    refined = Refined(start)
    if not (req.resume and state_path(req.out, label).exists()):
        refine_cfg = replace(req.refine, seed=req.evo.seed)
        refined = refine(
            s.fitness, levels, costs, bits, start, s.windows, refine_cfg, deadline, schedule.pace, schedule.clock
        )
    table = s.filled.get(own(req))
    state = evolve(
        s.fitness,
        levels,
        costs,
        bits,
        refined.mix,
        req.evo,
        state_path(req.out, label),
        s.settings[label],
        req.resume,
        req.progress,
        weights=cost_model.total_weights,
        deadline=deadline,
        refined=refined.record(),
        table=table and table.table,
        per_window=schedule.pace,
        clock=schedule.clock,
    )
    return state, table


def _choose(s: Search, label: str, start: _Start, state, table, end, closing: float, t0: float, shared: bool) -> dict:
    """Step 6 of one budget: the candidates on the pool (and the held-out text), the lowest written in its mix file
    with how it was made and what the time limit cut; its summary row."""
    req, schedule, fitness = s.req, s.schedule, s.fitness
    t_report = schedule.now()
    box = start.box and start.box._replace(deadline=schedule.deadline(end - closing))
    row, mix = report(
        fitness,
        s.inputs.cost_model,
        req.kind,
        label,
        start.mixes,
        state,
        start.kind,
        tuple(range(start.n)),
        s.held_out,
        req.pool.batch_size,
        start.pooled,
        box,
    )
    now = schedule.now()
    seconds = {
        "total": now - t0,
        "report": now - t_report,
        **{k: schedule.seconds[k] if shared else 0.0 for k in ("teacher", "tables")},
    }
    row.update(work_of(state, seconds, s.reused, req.time_limit, table, fitness.units))
    row["cut"] = [*s.cut, *row["cut"]]
    if row["choice_windows"] < len(fitness.windows):
        row["cut"].append(f"choice on {row['choice_windows']} of {len(fitness.windows)} pool windows")
    if end is not None and state.generation < req.evo.generations:
        row["cut"].append(f"generations: {state.generation} of {req.evo.generations}")
    sensitivity = sensitivity_of(fitness.units, s.inputs.levels, table and table.table)
    write_mix(req, label, row, fitness.units, state, start.mixes, mix, s.settings[label], sensitivity)
    return row


def _report_price(s: Search, windows: int) -> float:
    """Seconds a report takes at most: the evolved mix and the refined start on `windows`, and the held-out text."""
    text = s.held_out[0]
    return s.schedule.price(REPORT_MIXES * windows + (0 if text is None else REPORT_TEXT_MIXES * len(text)))


def _plot(s: Search, label: str, end: float | None) -> None:
    """--plot: mix-<budget>.png beside the mix file, where its last drawing's seconds still fit by `end`."""
    schedule, path = s.schedule, mix_path(s.req.out, label)
    if not s.req.plot or not is_writer():
        return
    if end is not None and schedule.deadline(end).passes(schedule.seconds.get("plot", 0.0)):
        return
    t0 = schedule.now()
    plot_mix(path, path.with_suffix(".png"))
    schedule.seconds["plot"] = schedule.now() - t0
