"""`matgptq search`: from a parent and calibration text to one mix file per budget, in six steps.

1. budget   the request checked and every input read (inputs.py): the budgets against the parent's widths, the
            outputs writable, the reference model, the calibration pool; bad input fails before anything is computed.
2. fitness  the teachers (pool.py) and the parent in memory: the KL every later step scores (fitness.py).
3. start    the one-shot tables, shared by the budgets (start.py; --resume reads them back), then per budget its
            one-shot allocations and the lowest of them on the pool as the first parent (choice.first_parent).
4. refine   the start re-measured where it is, a group of layers at a time (refine.py).
5. evolve   (1+λ) EvoPress from the refined start, its state written after every generation (evopress.py).
6. choose   the candidates on the pool, the lowest written with how it was made (choice.report, record.py).
Under --time-limit every step is priced and cut so that the run ends by the limit with a mix file for every budget
(timing.py). --resume keeps what a run before finished (resume.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from ..execution import init_from_env, resolve_device
from ..fsutil import clear_stale_in
from ..runtime import load
from .choice import first_parent, report
from .evopress import evolve
from .fitness import Fitness, Mix
from .inputs import Inputs, first_windows, read_inputs
from .plot import plot_mix
from .pool import REPORT_TEXT_MIXES, pool_teacher, text_teacher
from .record import sensitivity_of, settings_of, work_of, write_mix
from .refine import Refined, refine
from .request import SearchRequest, check_request, mix_path, state_path
from .resume import check_states, kept_rows
from .spread import from_rank0, is_writer
from .start import REPORT_MIXES, one_shot, own, shared_tables
from .timing import Schedule, Timebox


class _Search(NamedTuple):
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


def run_search(req: SearchRequest) -> list[dict]:
    """Search every budget of `req`; returns one summary row per budget (also written into its mix file)."""
    schedule = Schedule(req.time_limit, from_rank0)  # first: a limit counts from here
    device = resolve_device(req.device)  # then a missing device, the cheapest thing to name
    check_request(req)
    if req.resume:  # what a killed run left beside the mix files and states it wrote
        clear_stale_in(req.out)
    init_from_env(device)  # under torchrun: the scorings are dealt across the processes (spread.py)
    req = req if is_writer() else replace(req, progress=False)
    inputs = read_inputs(req)  # 1. budget
    dtype = req.score_dtype.resolve(device)
    settings = _settings(req, inputs, len(inputs.calib), dtype) if req.resume else None
    if req.resume:
        check_states(req, inputs.budgets, settings, len(inputs.cost_model.layers))
    rows = kept_rows(req, inputs.budgets, settings)
    todo = [(label, b) for label, b in inputs.budgets if label not in rows]
    if not todo:
        return [rows[label] for label, _ in inputs.budgets]
    reference = load(inputs.reference, packed=False).to(device)  # 2. fitness
    batch = req.pool.batch_size
    teacher, calib = pool_teacher(reference, inputs.calib, inputs.least, batch, req.progress, schedule, not req.resume)
    held_teacher, text = text_teacher(reference, inputs.text, batch, req.progress, schedule, len(todo))
    del reference
    cut = [f"calibration pool: {len(calib)} of {len(inputs.calib)} windows"] if len(calib) < len(inputs.calib) else []
    cut += ["held-out text"] if inputs.text is not None and text is None else []
    settings = settings or _settings(req, inputs, len(calib), dtype)
    model = load(req.parent, bits=inputs.levels[-1], packed=False).to(device)
    fitness = Fitness(model, teacher, calib, inputs.units.layers, batch, compute_dtype=dtype, units=inputs.units)
    windows = first_windows(req.start.tokens, req.pool.seqlen, len(calib))
    try:
        t0 = schedule.now()  # 3. start: the tables every budget shares
        filled, reused, left_out = shared_tables(
            req, fitness, inputs, windows, settings[todo[0][0]], schedule, len(todo), 0 if text is None else len(text)
        )
        schedule.seconds["tables"] = schedule.now() - t0
        s = _Search(
            req, inputs, fitness, filled, windows, settings, (text, held_teacher), schedule, cut + left_out, reused
        )
        for k, (label, budget) in enumerate(todo):
            rows[label] = _budget(s, label, budget, schedule.at(1 / (len(todo) - k)), t0 if k == 0 else None)
    finally:
        teacher.close()
        if held_teacher is not None:
            held_teacher.close()
    return [rows[label] for label, _ in inputs.budgets]


def _settings(req: SearchRequest, inputs: Inputs, windows: int, dtype) -> dict[str, dict]:
    return {
        label: settings_of(req, inputs.ckpt, inputs.levels, b, windows, dtype, inputs.reference)
        for label, b in inputs.budgets
    }


class _Start(NamedTuple):
    """A budget's step 3: its one-shot allocations and the lowest of them on the first `n` pool windows."""

    mixes: dict[str, Mix]  # {allocator: its mix}
    n: int  # the pool windows the choice scored
    box: Timebox | None  # the choice's time box, None without a limit
    mix: Mix  # the first parent
    kind: str  # the allocator it came from
    pooled: dict[Mix, list[float]]  # what the choice measured, for the report


def _budget(s: _Search, label: str, budget, end: float | None, shared_since: float | None) -> dict:
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


def _start(s: _Search, budget, end: float | None, closing: float) -> _Start:
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


def _improve(s: _Search, label: str, budget, start: Mix, deadline: float | None):
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


def _choose(s: _Search, label: str, start: _Start, state, table, end, closing: float, t0: float, shared: bool) -> dict:
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


def _report_price(s: _Search, windows: int) -> float:
    """Seconds a report takes at most: the evolved mix and the refined start on `windows`, and the held-out text."""
    text = s.held_out[0]
    return s.schedule.price(REPORT_MIXES * windows + (0 if text is None else REPORT_TEXT_MIXES * len(text)))


def _plot(s: _Search, label: str, end: float | None) -> None:
    """--plot: mix-<budget>.png beside the mix file, where its last drawing's seconds still fit by `end`."""
    schedule, path = s.schedule, mix_path(s.req.out, label)
    if not s.req.plot or not is_writer():
        return
    if end is not None and schedule.deadline(end).passes(schedule.seconds.get("plot", 0.0)):
        return
    t0 = schedule.now()
    plot_mix(path, path.with_suffix(".png"))
    schedule.seconds["plot"] = schedule.now() - t0
