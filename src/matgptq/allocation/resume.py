"""What `search --resume` takes from the run before, besides each budget's search state (evopress.py): the budgets
it finished, and the one-shot allocators' tables.

Finished budgets. A budget whose mix file was written with exactly this run's settings (record.settings_of) after at
least this run's --generations is not searched again: its summary row is read back (`finished_row`, `kept_rows`).
Anything else (no mix file, a damaged one, other settings, fewer generations) is searched on from its state and the
mix rewritten; a state made with other settings is refused before anything is computed (`check_states`).

Tables. After the teacher, the tables (allocators.tables) are the costliest shared part of a search: a full table is
layers × (levels − 1) scorings (hours for a large model). They are written atomically (fsutil.atomic_output) as
`.tables.json` in --out once filled, with what they depend on: the search settings but the budget, the baselines
(each allocator's table is kept under its name, the gradient's one per floor width) and the evolution's own
(`tables_settings`). A resumed search with the same
settings reads back every table it needs instead of scoring it (the same numbers: JSON writes a float64 so that it
reads back exactly, hence the same mixes) and scores only those the file lacks: a baseline not asked for before, the
floor width of a budget added (allocators.lacking); the file then holds them all. Tables made with other settings,
or a file that does not read as such, are scored afresh and rewritten: this file is a cache, and losing it loses only
time.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError
from ..fsutil import atomic_output
from ..untrusted import read_json
from .allocators import Allocator, Filled
from .evopress import read_state
from .plot import plot_mix
from .record import OBSOLETE
from .request import mix_path, state_path
from .spread import from_rank0, is_writer

TABLES_FORMAT = "matgptq-search-tables"
TABLES_VERSION = 2  # 1 keyed the whole file on the allocators and floors


def finished_row(mix_file: Path, settings: dict, generations: int) -> dict | None:
    """The summary row of `mix_file` if it was written with exactly `settings` after at least `generations`
    generations, else None (searched again); the fields this version no longer writes dropped (record.OBSOLETE)."""
    if not mix_file.is_file():
        return None
    try:
        body = read_json(mix_file)
        row = body["summary"]
        done = body.get("settings") == settings and int(row["generations"]) >= generations
    except (UserError, KeyError, TypeError, ValueError):
        return None
    return {k: v for k, v in row.items() if k not in OBSOLETE} if done and isinstance(row, dict) else None


def kept_rows(req, budgets, settings: dict | None) -> dict[str, dict]:
    """With --resume, the budgets a run before finished with these settings and --generations (`finished_row`):
    their summary rows as rank 0 reads them, marked `kept`, their plots redrawn with --plot. Not with --text: the
    held-out scores are not among the settings, so every budget is scored on the text given now."""
    if not req.resume or req.held_out is not None:
        return {}
    rows = {}
    for label, _ in budgets:
        row = finished_row(mix_path(req.out, label), settings[label], req.evo.generations) if is_writer() else None
        if row is not None:
            rows[label] = {**row, "kept": True}
            if req.plot:
                plot_mix(mix_path(req.out, label), mix_path(req.out, label).with_suffix(".png"))
    return from_rank0(rows)


def check_states(req, budgets, settings: dict, units: int) -> None:
    """With --resume, a saved state made with other settings fails now, not after the teacher and the tables."""
    for label, _ in budgets:
        if state_path(req.out, label).exists():
            read_state(state_path(req.out, label), settings[label], units)


def tables_path(out: Path) -> Path:
    return out / ".tables.json"


# the evolution's and the refinement's own settings (record.settings_of), on which no table depends; the seed is not
# among them: NOISE draws its noise from it
SEARCH_ONLY = ("offspring", "stages", "max_flips", "temperature", "refine_steps", "refine_groups")


def tables_settings(settings: dict) -> dict:
    """What the tables depend on: one budget's search settings without the budget and the baselines (each table is
    kept under its allocator's name, the gradient's per floor) and without SEARCH_ONLY (a resumed search with other
    generation sizes or mutations reads the same tables)."""
    dropped = ("budget", "baselines", *SEARCH_ONLY)
    return json.loads(json.dumps({k: v for k, v in settings.items() if k not in dropped}))


def write_tables(path: Path, settings: dict, filled: dict[Allocator, Filled]) -> None:
    body = {
        "format": TABLES_FORMAT,
        "version": TABLES_VERSION,
        "settings": settings,
        "tables": {
            a.value: {
                "table": _json_table(f.table),
                "seconds": f.seconds,
                "measured": None if f.measured is None else list(f.measured),
            }
            for a, f in filled.items()
        },
    }
    with atomic_output(path, overwrite=True, directory=False) as f:
        f.write_text(json.dumps(body))


def read_tables(path: Path, settings: dict, layers: int) -> dict[Allocator, Filled] | None:
    """The tables at `path` ({allocator: Filled}, those it holds) if they were made with exactly `settings`
    (tables_settings), for `layers` layers, else None."""
    if not path.is_file():
        return None
    try:
        body = read_json(path)
        if body.get("format") != TABLES_FORMAT or body.get("version") != TABLES_VERSION:
            return None
        if body.get("settings") != settings:
            return None
        out = {}
        for name, entry in body["tables"].items():
            table = entry["table"]
            shape = (layers, len(settings["levels"]))
            if isinstance(table, dict):
                table = {int(u): _rows(rows, shape) for u, rows in table.items()}
            else:
                table = _rows(table, shape)
            measured = None if entry["measured"] is None else tuple(int(r) for r in entry["measured"])
            out[Allocator(name)] = Filled(table, float(entry["seconds"]), measured)
    except (UserError, KeyError, TypeError, ValueError, AttributeError):
        return None  # not a tables file as this version writes it: score afresh
    return out


def _rows(rows, shape: tuple[int, int] | None = None) -> list[list[float | None]]:
    """Rows of floats, None kept (the gradient tables' widths below their floor); ValueError if not of `shape`."""
    out = [[None if v is None else float(v) for v in row] for row in rows]
    if shape is not None and (len(out), *{len(row) for row in out}) != shape:
        raise ValueError("a table of another shape")
    return out


def _json_table(table) -> list | dict:
    """A table as JSON types: its rows, or {floor: rows} for the gradient's."""
    return {str(u): _rows(rows) for u, rows in table.items()} if isinstance(table, dict) else _rows(table)
