"""An output against the uninterrupted run's: tensors byte for byte, JSON equal but for listed fields, other files
byte for byte (faults_kill.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

# JSON fields that record a duration, as paths ("*": any key or index); nothing else may differ
TIMING = (
    ("report", "*", "seconds"),  # matgptq.json: each layer's solve
    *(
        ("summary", k)
        for k in ("seconds", "teacher_seconds", "tables_seconds", "search_seconds", "report_seconds", "refine_seconds")
    ),  # mix-<budget>.json
    ("history", "*", "seconds"),  # mix-<budget>.json: per generation
    ("state", "seconds"),
    ("state", "history", "*", "seconds"),
    ("state", "refine", "seconds"),  # .state-<budget>.json
    ("tables", "*", "seconds"),  # .tables.json
)
RESUME_RECORDS = (("summary", "tables_reused"),)  # true where a resumed search read the tables back


def _matches(path: tuple, patterns) -> bool:
    return any(len(p) == len(path) and all(a in ("*", b) for a, b in zip(p, path)) for p in patterns)


def json_diff(a, b, path: tuple = ()) -> list[tuple]:
    """The paths where JSON values `a` and `b` differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in json_diff(a.get(k, ...), b.get(k, ...), (*path, k))]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in json_diff(x, y, (*path, i))]
    return [] if a == b and type(a) is type(b) else [path]


def tensors_equal(a: Path, b: Path) -> bool:
    """The same tensor names, each of the same dtype and shape and the same bytes."""
    ta, tb = load_file(str(a)), load_file(str(b))
    raw = lambda t: t.contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
    return sorted(ta) == sorted(tb) and all(
        ta[k].dtype == tb[k].dtype and ta[k].shape == tb[k].shape and raw(ta[k]).equal(raw(tb[k])) for k in ta
    )


def compare_file(a: Path, b: Path) -> tuple[list[str], list[str]]:
    """(differences, resume records that differ) of output file `a` against the reference `b`."""
    if a.suffix == ".safetensors":
        return ([] if tensors_equal(a, b) else [f"{a.name}: tensors"]), []
    if a.suffix == ".json":
        diffs = [d for d in json_diff(json.loads(a.read_text()), json.loads(b.read_text())) if not _matches(d, TIMING)]
        records = [d for d in diffs if _matches(d, RESUME_RECORDS)]
        return [f"{a.name}: {'.'.join(map(str, d))}" for d in diffs if d not in records], [
            f"{a.name}: {'.'.join(map(str, d))}" for d in records
        ]
    return ([] if a.read_bytes() == b.read_bytes() else [f"{a.name}: bytes"]), []


def compare(out: Path, ref: Path) -> tuple[list[str], list[str]]:
    """(differences, resume records) of output `out` against `ref`: a file, or a directory's files but temporary
    ones."""
    if ref.is_file():
        return compare_file(out, ref) if out.is_file() else ([f"{out.name} missing"], [])
    names = lambda d: {p.name for p in d.iterdir() if p.is_file() and ".tmp" not in p.name}  # noqa: E731
    mine, theirs = (names(out) if out.is_dir() else set()), names(ref)
    diffs = [f"{n}: extra" for n in sorted(mine - theirs)] + [f"{n}: missing" for n in sorted(theirs - mine)]
    records: list[str] = []
    for n in sorted(mine & theirs):
        d, r = compare_file(out / n, ref / n)
        diffs, records = diffs + d, records + r
    return diffs, records
