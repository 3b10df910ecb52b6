"""`matgptq search`: from a parent and calibration text to one mix file per budget, plus the summary rows.

Order of work, so that bad input fails before anything is computed or written: settings and budgets are checked,
the parent and its reference model are opened, the calibration text is cut into windows (too little text is an
error), existing mix files and resume states are checked — only then are the teacher, the sensitivities, the knapsack
start, its refinement (refine.py) and the evolution run. Each budget's mix file is written atomically when its search
ends; its search state is written atomically after every generation (evopress.py); --resume keeps what a run before
finished (resume.py).

The mix file is what `matgptq.load(parent, bits=FILE)`, `matgptq eval --bits FILE` and `matgptq export
--bits-config FILE` read (runtime.loader.resolve_bits takes the `bits` object of a JSON file): {"bits": {layer:
width}, ...} with the budget, the bit counts, the scores and the search settings alongside. `bits` is the lowest-KL
of the evolved mix, the refined start and the one-shot allocations on the whole calibration pool, or the uniform
slice where that lowest is not shown better window by window (choice.py; `summary.uniform_gap`); all of them stay in
the file (`dp_bits`, `start_bits` the refined start, `search_bits`, and every one-shot allocation in
`baseline_bits`) with their scores in `summary`, the refinement's steps in `refine_history`.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from contextlib import nullcontext
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import torch

from ..errors import UserError
from ..evaluation.teacher import Teacher
from ..execution import init_from_env, resolve_device
from ..formats import read_checkpoint
from ..fsutil import atomic_output, check_output
from ..models import eval_windows, file_sha256, load_tokenizer, read_text, require_model_dir, resolve_model, tokenize
from ..models.fused import fused_groups
from ..runtime import load
from .allocators import Allocator, baseline_mixes, lacking, raise_floors, tables
from .budget import BudgetKind, CostModel, parse_budget
from .choice import first_parent, report
from .evopress import evolve, format_stages, window_count
from .fitness import Fitness, Mix
from .plot import plot_mix
from .refine import Refined, refine
from .request import SearchRequest, check_request, mix_path, state_path
from .resume import finished_row, read_tables, tables_path, tables_settings, write_tables
from .sensitivity import Sensitivity, Wide
from .spread import from_rank0, is_writer
from .timing import REPORT_MIXES, Clock, report_guess, tables_deadline, text_windows
from .units import Units

MIX_FORMAT = "matgptq-mix"


def _levels(ckpt, requested: tuple[int, ...] | None) -> tuple[int, ...]:
    master = max(q.master_bits for q in ckpt.layers.values())
    if any(q.shift for q in ckpt.layers.values()):
        raise UserError(f"{ckpt.path} is a slice and holds only one width; search needs the parent checkpoint")
    if master < 3:
        raise UserError(f"{ckpt.path} stores {master}-bit codes, so it has no widths to choose between; use a parent "
                        "with a master width of 3 or more")  # fmt: skip
    levels = tuple(sorted(set(requested))) if requested else tuple(range(2, master + 1))
    bad = [r for r in levels if not 2 <= r <= master]
    if bad:
        raise UserError(f"--levels {bad[0]} is not a width of this parent; it can slice 2..{master}")
    if len(levels) < 2:
        raise UserError(f"--levels {levels[0]} leaves nothing to choose; give at least two widths")
    return levels


def _reference(ckpt, requested: str | Path | None) -> Path:
    """The unquantized model: --kl-to, else the one the parent records (a directory, or a Hugging Face id pinned to
    the commit it was quantized from, resolved through the cache)."""
    ref = requested or ckpt.meta.get("source_model")
    if not isinstance(ref, (str, Path)):
        raise UserError(f"{ckpt.path} does not record its unquantized model; pass --kl-to MODEL")
    path = resolve_model(ref).path
    if not path.is_dir():
        raise UserError(f"the unquantized model of {ckpt.path} ({ref}) is not available; pass --kl-to MODEL")
    return require_model_dir(path)


def _windows(tokens: torch.Tensor, seqlen: int, needed_tokens: int, what: str, by: str) -> torch.Tensor:
    needed = math.ceil(needed_tokens / (seqlen - 1))
    if tokens.numel() < needed * seqlen:
        raise UserError(f"{what} has {tokens.numel():,} tokens, fewer than the {needed * seqlen:,} the search needs "
                        f"for {by} ({needed} windows of --seqlen {seqlen}, {seqlen - 1} scored tokens each); give more "
                        f"text (or a wider --calib-range) or lower {by.split(' ')[0]}")  # fmt: skip
    return tokens[: needed * seqlen].view(needed, seqlen)


def _calib_pool(req: SearchRequest, tokenizer) -> torch.Tensor:
    """The windows every scoring draws from: enough for --calib-tokens, --sensitivity-tokens and the last stage."""
    tokens = tokenize(tokenizer, read_text(req.calib, req.calib_range))
    # the option that asks for the most tokens (a tie names --calib-tokens, the pool's own option)
    needed, by = max((req.calib_tokens, f"--calib-tokens {req.calib_tokens}"),
                     (req.sensitivity_tokens, f"--sensitivity-tokens {req.sensitivity_tokens}"),
                     *([] if req.sensitivity_wide is None else [(req.sensitivity_wide[1], "--sensitivity-wide "
                                                                 "{}:{}".format(*req.sensitivity_wide))]),
                     (req.evo.stages[-1].tokens, f"--stages {format_stages(req.evo.stages)}"),
                     key=lambda option: option[0])  # fmt: skip
    a, b = req.calib_range
    return _windows(tokens, req.seqlen, needed, f"the calibration text ({req.calib}, --calib-range {a:g}:{b:g})", by)


def _first_windows(tokens: int, seqlen: int, pool: int) -> tuple[int, ...]:
    """The first windows of the pool that hold `tokens` scored tokens (all of them where it has fewer)."""
    return tuple(range(window_count(pool, seqlen, tokens)))


def _wide(req: SearchRequest, pool: int) -> Wide | None:
    """--sensitivity-wide LEVEL:TOKENS as the table's wide levels: LEVEL and up on the pool's first windows."""
    if req.sensitivity_wide is None:
        return None
    level, tokens = req.sensitivity_wide
    return Wide(level, _first_windows(tokens, req.seqlen, pool))


def _settings(req: SearchRequest, ckpt, levels, budget: Fraction, calib_windows: torch.Tensor,
              score_dtype: torch.dtype, reference: Path) -> dict:  # fmt: skip
    """Everything a search result depends on (JSON types); a resume state must carry the same. The teacher: the
    parent's own unquantized model (named by its metadata), or with --kl-to the directory it resolved to."""
    meta_hash = hashlib.sha256(json.dumps(ckpt.meta, sort_keys=True, default=str).encode()).hexdigest()
    settings = {"parent": str(Path(req.parent).resolve()), "parent_meta_sha256": meta_hash,
                "calib_sha256": file_sha256(req.calib), "calib_range": list(req.calib_range), "seqlen": req.seqlen,
                "calib_windows": int(calib_windows.shape[0]), "sensitivity_tokens": req.sensitivity_tokens,
                "sensitivity": req.sensitivity.value, "baselines": [a.value for a in req.baselines],
                **({} if req.sensitivity_top is None else {"sensitivity_top": req.sensitivity_top}),
                **({} if req.sensitivity_wide is None else {"sensitivity_wide": list(req.sensitivity_wide)}),
                "score_dtype": str(score_dtype).removeprefix("torch."), **_table_setting(req, score_dtype),
                "budget": str(budget), "budget_kind": req.kind.value, "levels": list(levels), **req.evo.settings(),
                "refine_steps": req.refine.steps, "refine_groups": req.refine.groups, "tie": req.tie,
                **({"reference": str(reference.resolve())} if req.reference is not None else {})}  # fmt: skip
    return json.loads(json.dumps(settings))


def _table_setting(req: SearchRequest, score_dtype: torch.dtype) -> dict:
    """{"table_dtype": ...} where the tables are scored in another precision than the candidates (ScoreDtype.tables),
    else nothing (the settings of such runs are what they were before the tables had a precision of their own)."""
    table = req.score_dtype.tables(score_dtype, req.time_limit is not None)
    return {} if table == score_dtype else {"table_dtype": str(table).removeprefix("torch.")}


def _units(req: SearchRequest, ckpt) -> Units:
    """The search's units (units.py): with --tie, the groups an engine fuses (models/fused.py, from the parent's
    config), else every layer alone."""
    names = tuple(ckpt.layers)
    return Units.grouped(names, fused_groups(ckpt.config, names)) if req.tie else Units.each(names)


def _budgets(req: SearchRequest, ckpt,
             units: Units) -> tuple[tuple[int, ...], CostModel, list[tuple[str, Fraction]]]:  # fmt: skip
    """(levels, cost model of `units`, [(label, budget)]) of the request, every budget checked against the parent and
    every output checked writable, before any model is loaded."""
    levels = _levels(ckpt, req.levels)
    named = [(req.sensitivity_top, f"--sensitivity-top {req.sensitivity_top}")]  # the options that name a level
    if (wide := req.sensitivity_wide) is not None:
        named.append((wide[0], f"--sensitivity-wide {wide[0]}:{wide[1]}: {wide[0]}"))
    for level, said in named:
        if level is not None and level not in levels[:-1]:
            raise UserError(f"{said} is not a level below the top one; this search's levels are "
                            f"{', '.join(map(str, levels))}")  # fmt: skip
    cost_model = CostModel.from_checkpoint(ckpt, levels, gguf=req.kind is BudgetKind.GGUF).grouped(units)
    budgets = [(label, parse_budget(label)) for label in req.budgets]
    for _, b in budgets:
        cost_model.check_budget(b, req.kind)
    if len({b for _, b in budgets}) != len(budgets):
        raise UserError("--budget lists the same budget twice")
    for label, _ in budgets:
        if not req.resume:
            check_output(mix_path(req.out, label), req.overwrite)
    return levels, cost_model, budgets


def _check_states(req: SearchRequest, budgets, settings: dict, layers: int) -> None:
    """With --resume, a saved state made with other settings fails now, not after the teacher and sensitivities."""
    from .evopress import read_state

    for label, _ in budgets:
        if state_path(req.out, label).exists():
            read_state(state_path(req.out, label), settings[label], layers)


def _own(req: SearchRequest) -> Allocator:
    """The table of the search's knapsack start: --sensitivity probe or full (the measured additive model)."""
    return Allocator.ADDITIVE if req.sensitivity is Sensitivity.FULL else Allocator.PROBE


def _others(req: SearchRequest) -> tuple[Allocator, ...]:
    """The one-shot allocations weighed beside the knapsack start: the --baselines and, with --sensitivity full,
    PROBE's, which the full table holds for free (its lowest width, the rest extrapolated: at high budgets the
    one-window table's upper widths can be noisier than that extrapolation)."""
    free = req.sensitivity is Sensitivity.FULL and Allocator.PROBE not in req.baselines
    return (*req.baselines, Allocator.PROBE) if free else req.baselines


def _search_budget(req: SearchRequest, budget: tuple[str, Fraction], levels, cost_model: CostModel, fitness: Fitness,
                   filled: dict, sens_windows, settings: dict, held_out, t0: float, clock: Clock,
                   end: float | None) -> dict:  # fmt: skip
    """One budget: the one-shot allocations (the knapsack mix first), the search's start (the best of them on the
    whole calibration pool, in float32), EvoPress (stopped in time for the report to end by `end`, when given), the
    choice among all of them on that pool (the one-shot allocations' scores reused); its mix file written; the
    summary row (seconds counted from `t0`)."""
    label, limit = budget
    mixes = baseline_mixes(cost_model, filled, _own(req), _others(req), limit, req.kind)
    all_windows = tuple(range(fitness.windows.shape[0]))
    t_start = time.perf_counter()
    start, start_kind, pooled = first_parent(fitness, mixes, all_windows)
    clock.per_window = (time.perf_counter() - t_start) / (len(pooled) * len(all_windows))
    guess = report_guess(clock, REPORT_MIXES, all_windows, held_out)
    deadline = None if end is None else end - guess
    costs, bits = cost_model.table(req.kind), cost_model.limit(limit, req.kind)
    refined = Refined(start)  # a resumed search continues from its state: its start, refined, and the record of it
    if not (req.resume and state_path(req.out, label).exists()):
        refined = refine(fitness, levels, costs, bits, start, sens_windows, replace(req.refine, seed=req.evo.seed),
                         deadline, clock.per_window or 0.0)  # fmt: skip
    state = evolve(fitness, levels, costs, bits, refined.mix, req.evo, state_path(req.out, label), settings,
                   req.resume, req.progress, weights=cost_model.total_weights, deadline=deadline,
                   refined=refined.record(), table=filled[_own(req)].table,
                   per_window=clock.per_window or 0.0)  # fmt: skip
    t_report = time.perf_counter()
    row, mix = report(fitness, cost_model, req.kind, label, mixes, state, start_kind, all_windows, held_out,
                      req.batch_size, pooled)
    scorings = len({state.parent, state.start} - set(pooled))  # the report's own: the rest were scored for the start
    report_seconds = time.perf_counter() - t_report
    if scorings or text_windows(held_out):
        clock.per_window = report_seconds / (scorings * len(all_windows) + text_windows(held_out))
    seconds = time.perf_counter() - t0
    row.update(evaluations=state.evaluations, generations=state.generation, seconds=round(seconds, 1),
               time_limit=req.time_limit, teacher_seconds=round(clock.teacher, 1), tables_seconds=round(clock.tables, 1),
               tables_reused=clock.tables_reused,
               search_seconds=round(seconds - clock.tables, 1), report_seconds=round(report_seconds, 1),
               report_guess_seconds=round(guess, 1),
               **{f"refine_{k}": state.refine.get(k, 0) for k in ("steps", "accepted", "seconds")},
               sensitivity_levels=list(filled[_own(req)].measured),
               tied_groups=sum(len(unit) > 1 for unit in fitness.units.members))  # fmt: skip
    units = fitness.units
    sensitivity = {units.layers[i]: dict(zip(map(str, levels), values))
                   for unit, values in zip(units.members, filled[_own(req)][0]) for i in unit}  # fmt: skip
    _write_mix(req, label, row, units, state, mixes, mix, settings, sensitivity)
    if req.plot and is_writer():
        plot_mix(mix_path(req.out, label), mix_path(req.out, label).with_suffix(".png"))
    return row


def run_search(req: SearchRequest) -> list[dict]:
    """Search every budget of `req`; returns one summary row per budget (also written into its mix file).

    With `req.time_limit` (minutes, counted from `req.time_spent` seconds before here): the teacher and the tables run
    first (a FULL table stops adding widths in time for the reports, timing.tables_deadline), then each budget gets an
    equal share of the time left (what one budget leaves unused goes to the next), and its generations stop so that
    its report (the choice on the whole pool, priced at the latest measured time per scored window) ends within the
    share; `--generations` stays the cap. Which generations run then depends on the machine's speed: the row records
    how many did, and `--generations` that number on the same settings gives the same mix."""
    device = resolve_device(req.device)  # first: a missing device is the cheapest thing to name
    check_request(req)
    init_from_env(device)  # under torchrun: the scorings are dealt across the processes (spread.py)
    if not is_writer():
        req = replace(req, progress=False)
    ckpt = read_checkpoint(req.parent)
    units = _units(req, ckpt)
    levels, cost_model, budgets = _budgets(req, ckpt, units)
    reference = _reference(ckpt, req.reference)
    tokenizer = load_tokenizer(req.parent)
    calib = _calib_pool(req, tokenizer)
    text = None
    if req.text is not None:
        text = eval_windows(tokenize(tokenizer, read_text(req.text, req.text_range)), req.seqlen, req.text_tokens)
    score_dtype = req.score_dtype.resolve(device)
    settings = {label: _settings(req, ckpt, levels, b, calib, score_dtype, reference) for label, b in budgets}
    if req.resume:
        _check_states(req, budgets, settings, len(cost_model.layers))
    finished = _finished(req, budgets, settings)
    todo = [(label, b) for label, b in budgets if label not in finished]
    if not todo:
        return [finished[label] for label, _ in budgets]
    clock = Clock(time.perf_counter() - req.time_spent)
    t_teacher = time.perf_counter()
    ref_model = load(reference, packed=False).to(device)
    teacher = Teacher(ref_model, calib, req.batch_size, progress=req.progress)
    text_teacher = Teacher(ref_model, text, req.batch_size, progress=req.progress) if text is not None else None
    del ref_model
    clock.teacher = time.perf_counter() - t_teacher
    model = load(req.parent, bits=levels[-1], packed=False).to(device)
    fitness = Fitness(model, teacher, calib, units.layers, req.batch_size, compute_dtype=score_dtype, units=units)
    sens_windows = _first_windows(req.sensitivity_tokens, req.seqlen, calib.shape[0])
    filled = None  # the allocators' loss tables, measured once for every budget
    rows = dict(finished)
    try:
        for k, (label, budget) in enumerate(todo):
            t0 = time.perf_counter()
            if filled is None:  # the teacher and the tables are shared: the first budget carries their seconds
                t_tables = time.perf_counter()
                filled = _tables(req, fitness, levels, cost_model, budgets, len(todo), sens_windows, settings[label],
                                 clock, (text, text_teacher))  # fmt: skip
                clock.tables = time.perf_counter() - t_tables
            else:
                clock.teacher = clock.tables = 0.0
            rows[label] = _search_budget(req, (label, budget), levels, cost_model, fitness, filled, sens_windows,
                                         settings[label], (text, text_teacher), t0, clock,
                                         clock.budget_end(req.time_limit, len(todo) - k))  # fmt: skip
    finally:
        teacher.close()
        if text_teacher is not None:
            text_teacher.close()
    return [rows[label] for label, _ in budgets]


def _finished(req: SearchRequest, budgets, settings: dict) -> dict[str, dict]:
    """With --resume, the budgets a run before finished with these settings and --generations (resume.py): their
    summary rows as rank 0 reads them, marked `kept`, their plots redrawn with --plot. Not with --text: the held-out
    scores are not among the settings, so every budget is scored on the text given now."""
    if not req.resume or req.text is not None:
        return {}
    rows = {}
    for label, _ in budgets:
        row = finished_row(mix_path(req.out, label), settings[label], req.evo.generations) if is_writer() else None
        if row is not None:
            rows[label] = {**row, "kept": True}
            if req.plot:
                plot_mix(mix_path(req.out, label), mix_path(req.out, label).with_suffix(".png"))
    return from_rank0(rows)


def _tables(req: SearchRequest, fitness: Fitness, levels, cost_model: CostModel, budgets, to_search: int,
            sens_windows, settings: dict, clock: Clock, held_out) -> dict:  # fmt: skip
    """Every allocator's table, shared by the budgets (the floors of all of them, searched again or not): with
    --resume, those the run before made with the same settings read back (resume.py) and only the rest scored, else
    all scored; then saved. A FULL table under --time-limit stops in time for the scorings of the `to_search` budgets
    (timing.tables_deadline: the knapsack start, the evolved mix, each baseline)."""
    floors = raise_floors(cost_model, [b for _, b in budgets], req.kind)
    allocators = (_own(req), *_others(req))
    saved, path = tables_settings(settings), tables_path(req.out)
    have = from_rank0(read_tables(path, saved, len(cost_model.names)) if req.resume and is_writer() else None) or {}
    clock.tables_reused = bool(have) and not lacking(allocators, floors, have)[0]
    if clock.tables_reused:
        return have
    deadline = None if req.sensitivity is not Sensitivity.FULL else tables_deadline(
        clock, req.time_limit, fitness, levels[-1], len(_others(req)) + 1, to_search, held_out)
    exact = req.score_dtype.tables(fitness.compute_dtype, req.time_limit is not None) == torch.float32
    with fitness.exact() if exact else nullcontext():
        filled = tables(fitness, levels, sens_windows, allocators, req.evo.seed, req.progress, floors, deadline,
                        req.sensitivity_top, have, _wide(req, fitness.windows.shape[0]))  # fmt: skip
    if is_writer():
        write_tables(path, saved, filled)
    return filled


def _write_mix(req, label, row, units: Units, state, mixes: dict[str, Mix], mix: Mix, settings,
               sensitivity: dict) -> None:  # fmt: skip
    """The mix file; `sensitivity` is the knapsack start's table, {layer: {width: predicted KL}} (a tied unit's
    value under each of its layers), so that each layer's chosen width can be read against what lowering it was
    measured to cost; `baseline_bits` holds every one-shot allocation the search weighed (its `summary.baseline_kl`
    scores them); `tied`, the groups that were given one width each (none with --no-tie)."""
    if not is_writer():  # under torchrun every rank holds the result; rank 0 writes it
        return
    named = units.widths
    tied = [[units.layers[i] for i in unit] for unit in units.members if len(unit) > 1]
    body = {"format": MIX_FORMAT, "bits": named(mix), "tied": tied, "summary": row, "dp_bits": named(mixes["knapsack"]),
            "start_bits": named(state.start), "search_bits": named(state.parent),
            "refine_history": state.refine.get("history", []),
            "baseline_bits": {k: named(m) for k, m in mixes.items()}, "sensitivity": sensitivity,
            "settings": settings, "history": state.history}  # fmt: skip
    with atomic_output(mix_path(req.out, label), overwrite=True, directory=False) as f:
        f.write_text(json.dumps(body, indent=1))
