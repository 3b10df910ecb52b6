"""`matgptq search`: from a parent and calibration text to one mix file per budget, in six steps.

1. budget   the request checked and every input read (inputs.py): the budgets against the parent's widths, the
            outputs writable, the reference model, the calibration pool; bad input fails before anything is computed.
2. fitness  the teachers (pool.py) and the parent in memory: the KL every later step scores (fitness.py).
3. start    the one-shot tables, shared by the budgets (start.py; --resume reads them back); then, per budget
            (steps.py), its one-shot allocations and the lowest of them on the pool as the first parent,
4. refine   that start re-measured where it is, a group of layers at a time,
5. evolve   (1+λ) EvoPress from the refined start,
6. choose   the candidates on the pool, the lowest written in the budget's mix file with how it was made.
Under --time-limit every step is priced and cut so that the run ends by the limit with a mix file for every budget
(timing.py). --resume keeps what a run before finished (resume.py).
"""

from __future__ import annotations

from dataclasses import replace

from ..execution import init_from_env, resolve_device
from ..fsutil import clear_stale_in
from ..runtime import load
from .fitness import Fitness
from .inputs import Inputs, first_windows, read_inputs
from .pool import pool_teacher, text_teacher
from .record import settings_of
from .request import SearchRequest, check_request
from .resume import check_states, kept_rows
from .spread import from_rank0, is_writer
from .start import shared_tables
from .steps import Search, search_budget
from .timing import Schedule


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
        s = Search(
            req, inputs, fitness, filled, windows, settings, (text, held_teacher), schedule, cut + left_out, reused
        )
        for k, (label, budget) in enumerate(todo):
            rows[label] = search_budget(s, label, budget, schedule.at(1 / (len(todo) - k)), t0 if k == 0 else None)
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
