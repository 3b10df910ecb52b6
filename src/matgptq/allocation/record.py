"""The mix file, `mix-<budget>.json`: the mix and how it was made.

    {"format": "matgptq-mix", "bits": {layer: width}, "tied": [[layer, ...], ...], "summary": {...},
     "dp_bits", "start_bits", "search_bits", "baseline_bits": {allocation: {layer: width}}, "refine_history",
     "sensitivity": {layer: {width: predicted KL}}, "settings": {...}, "history": [...]}

`bits` is what `matgptq.load(parent, bits=FILE)`, `eval --bits FILE` and `export --bits-config FILE` read
(formats/mix.py); every other field is for the reader who asks how. `settings`: everything the result depends on
(the parent, the calibration text and pool, the budget and its kind, the levels, the seed, the tables', the
refinement's and the evolution's options; `settings_of`), so a resume with other settings is refused. `summary`: the
fitness reached (`kl`, and each candidate's), which candidate was written (`chosen`), the measured work (generations,
evaluations, seconds per step) and what a time limit cut (`cut`). No estimate of the future is written. Files an
older version wrote are read as they are; the fields it no longer writes (OBSOLETE) are dropped when read back.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from ..fsutil import atomic_output
from ..models import file_sha256
from .fitness import Mix
from .request import SearchRequest, mix_path
from .spread import is_writer
from .units import Units

MIX_FORMAT = "matgptq-mix"
OBSOLETE = ("report_guess_seconds",)  # summary fields of older files: the guessed seconds of the report


def settings_of(
    req: SearchRequest, ckpt, levels, budget, calib_windows: int, score_dtype: torch.dtype, reference: Path
) -> dict:
    """Everything a search result depends on (JSON types); a resume state must carry the same. The teacher: the
    parent's own unquantized model (named by its metadata), or with --kl-to the directory it resolved to."""
    start, pool = req.start, req.pool
    meta_hash = hashlib.sha256(json.dumps(ckpt.meta, sort_keys=True, default=str).encode()).hexdigest()
    settings = {
        "parent": str(Path(req.parent).resolve()),
        "parent_meta_sha256": meta_hash,
        "calib_sha256": file_sha256(req.calib),
        "calib_range": list(pool.range),
        "seqlen": pool.seqlen,
        "calib_windows": int(calib_windows),
        "sensitivity_tokens": start.tokens,
        "sensitivity": start.sensitivity.value,
        "baselines": [a.value for a in start.baselines],
        **({} if start.top is None else {"sensitivity_top": start.top}),
        **({} if start.wide is None else {"sensitivity_wide": list(start.wide)}),
        "score_dtype": str(score_dtype).removeprefix("torch."),
        **_table_setting(req, score_dtype),
        "budget": str(budget),
        "budget_kind": req.kind.value,
        "levels": list(levels),
        **req.evo.settings(),
        "refine_steps": req.refine.steps,
        "refine_groups": req.refine.groups,
        "tie": req.tie,
        **({"reference": str(reference.resolve())} if req.reference is not None else {}),
    }
    return json.loads(json.dumps(settings))


def _table_setting(req: SearchRequest, score_dtype: torch.dtype) -> dict:
    """{"table_dtype": ...} where the tables are scored in another precision than the candidates (ScoreDtype.tables),
    else nothing (the settings of such runs are what they were before the tables had a precision of their own)."""
    table = req.score_dtype.tables(score_dtype, req.time_limit is not None)
    return {} if table == score_dtype else {"table_dtype": str(table).removeprefix("torch.")}


def work_of(state, seconds: dict[str, float], reused: bool, limit, table, units: Units) -> dict:
    """The summary's record of the work: the evaluations and generations, the minutes of --time-limit, the measured
    `seconds` (`total`, `teacher`, `tables`, `report`; the shared steps' in the first budget's row only, its total
    counting the tables), whether the tables were all read back, the refinement's steps, the table's scored widths
    (`table`: allocators.Filled, None without one) and the tied groups."""
    return {
        "evaluations": state.evaluations,
        "generations": state.generation,
        "seconds": round(seconds["total"], 1),
        "time_limit": None if limit is None else limit.minutes,
        "teacher_seconds": round(seconds["teacher"], 1),
        "tables_seconds": round(seconds["tables"], 1),
        "tables_reused": reused,
        "search_seconds": round(seconds["total"] - seconds["tables"], 1),
        "report_seconds": round(seconds["report"], 1),
        **{f"refine_{k}": state.refine.get(k, 0) for k in ("steps", "accepted", "seconds")},
        "sensitivity_levels": [] if table is None else list(table.measured or ()),
        "tied_groups": sum(len(unit) > 1 for unit in units.members),
    }


def sensitivity_of(units: Units, levels, table) -> dict:
    """{layer: {width: predicted KL}} of the start's table (a tied unit's row under each of its layers); {} without
    one."""
    if table is None:
        return {}
    return {units.layers[i]: dict(zip(map(str, levels), row)) for unit, row in zip(units.members, table) for i in unit}


def write_mix(
    req: SearchRequest,
    label: str,
    row: dict,
    units: Units,
    state,
    mixes: dict[str, Mix],
    mix: Mix,
    settings: dict,
    sensitivity: dict,
) -> None:
    """The mix file (module docstring); `baseline_bits` holds every one-shot allocation the search weighed (its
    `summary.baseline_kl` scores them); `tied`, the groups that were given one width each (none with --no-tie)."""
    if not is_writer():  # under torchrun every rank holds the result; rank 0 writes it
        return
    named = units.widths
    tied = [[units.layers[i] for i in unit] for unit in units.members if len(unit) > 1]
    body = {
        "format": MIX_FORMAT,
        "bits": named(mix),
        "tied": tied,
        "summary": row,
        "dp_bits": named(next(iter(mixes.values()))),
        "start_bits": named(state.start),
        "search_bits": named(state.parent),
        "refine_history": state.refine.get("history", []),
        "baseline_bits": {k: named(m) for k, m in mixes.items()},
        "sensitivity": sensitivity,
        "settings": settings,
        "history": state.history,
    }
    with atomic_output(mix_path(req.out, label), overwrite=True, directory=False) as f:
        f.write_text(json.dumps(body, indent=1))
