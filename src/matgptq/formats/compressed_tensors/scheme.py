"""The schemes of a compressed-tensors `quantization_config` (docs/formats.md §5): each config group's weight
settings, checked (a one-line refusal of what matgptq cannot run), and which of them a Linear has.

config.json's `quantization_config` (quant_method "compressed-tensors", status "compressed") maps config groups to
`targets`. A Linear's scheme is resolved as compressed-tensors resolves it (apply_quantization_config,
utils/match.py): it is quantized when a target matches it, by exact name, by `re:<regex>` (re.match, from the start of
the name) or by class name ("Linear"), and no `ignore` entry matches it the same way; of several matching targets
the exact names win, then the regexes, then the class names, each in sorted order; a target listed by two groups
belongs to the later one.

Refused in one line: other formats (int-/float-/naive-quantized, nvfp4, sparse ones), float or dynamic weights, block
strategies, activation or KV-cache quantization, sparsity and transforms (rotations the weights need at run time),
and 1-bit weights.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ...errors import UserError
from .constants import FIX, FORMAT, LINEAR_CLASSES


@dataclass(frozen=True)
class Scheme:
    """The weight settings of one config group, checked."""

    bits: int
    symmetric: bool
    strategy: str  # "group", "channel" or "tensor"
    group_size: int | None  # "group" only
    actorder: str | None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _weights(p: Path, group: str, w) -> Scheme:
    """The `weights` of config group `group` as a Scheme, or a one-line refusal of what matgptq cannot run."""
    if not isinstance(w, dict):
        raise UserError(
            f"{p}: config group {group} quantizes no weights (`weights` is {w!r:.60}); matgptq reads "
            "weight-quantized compressed-tensors checkpoints only"
        )
    kind, bits, sym, size = w.get("type", "int"), w.get("num_bits"), w.get("symmetric", True), w.get("group_size")
    strategy, order = w.get("strategy"), w.get("actorder")
    kind, strategy, order = (v.lower() if isinstance(v, str) else v for v in (kind, strategy, order))
    if strategy is None:  # compressed-tensors' default: from group_size
        strategy = "tensor" if size is None else "channel" if size == -1 else "group"
    if kind != "int" or w.get("dynamic", False) not in (False, None):
        raise UserError(
            f"{p}: config group {group} has {kind} {'dynamic ' if w.get('dynamic') else ''}weights; "
            "matgptq reads static integer weights (e.g. W4A16); use compressed-tensors"
        )
    if not _is_int(bits) or not 2 <= bits <= 8:
        raise UserError(f"{p}: config group {group} has num_bits {bits!r:.60}; matgptq reads 2- to 8-bit weights")
    if strategy not in ("group", "channel", "tensor") or w.get("block_structure") is not None:
        raise UserError(
            f"{p}: config group {group} uses the {strategy!r:.60} strategy; matgptq reads group, "
            "channel and tensor scales"
        )
    if strategy == "group" and (not _is_int(size) or size < 1):
        raise UserError(f"{p}: config group {group} has group_size {size!r:.60}, expected a positive integer; {FIX}")
    if not isinstance(sym, bool) or order not in (None, False, True, "group", "dynamic", "weight", "static"):
        raise UserError(f"{p}: config group {group} has symmetric {sym!r:.60} and actorder {order!r:.60}; {FIX}")
    order = "group" if order in (True, "dynamic") else None if order is False else order
    return Scheme(bits, sym, strategy, size if strategy == "group" else None, order)


def _check_config(p: Path, qc: dict) -> None:
    """Everything beyond packed integer weights that the checkpoint would need at run time is refused."""
    fmt, status = qc.get("format"), qc.get("quantization_status", "compressed")
    if fmt not in (FORMAT, "mixed-precision"):
        raise UserError(
            f"{p} is compressed-tensors format {fmt!r:.60}; matgptq reads '{FORMAT}' (e.g. "
            "llm-compressor's W4A16); load it with compressed-tensors or vLLM"
        )
    if status != "compressed":
        raise UserError(
            f"{p} is in compressed-tensors status {status!r:.60}, not 'compressed' (packed); re-save it "
            "compressed (llm-compressor's save_pretrained does)"
        )
    for key, what in (
        ("kv_cache_scheme", "KV-cache quantization"),
        ("sparsity_config", "sparsity"),
        ("transform_config", "transforms (rotations)"),
    ):
        if qc.get(key):
            raise UserError(
                f"{p} uses {what} (`{key}`), which matgptq does not run; load it with compressed-tensors or vLLM"
            )


def read_schemes(p: Path, qc: dict) -> tuple[dict[str, Scheme], list[str]]:
    """({target: scheme}, ignore) of a `quantization_config`, in config order (a later group's target wins)."""
    _check_config(p, qc)
    groups, ignore = qc.get("config_groups"), qc.get("ignore") or []
    if not isinstance(groups, dict) or not isinstance(ignore, list) or not all(isinstance(i, str) for i in ignore):
        raise UserError(f"{p}: `config_groups` must be an object and `ignore` a list of names; {FIX}")
    targets: dict[str, Scheme] = {}
    for name, g in groups.items():
        if not isinstance(g, dict) or not isinstance(g.get("targets"), list):
            raise UserError(f"{p}: config group {name} has no `targets` list; {FIX}")
        if g.get("input_activations") or g.get("output_activations"):
            raise UserError(
                f"{p}: config group {name} quantizes activations, which matgptq does not run; it reads "
                "weight-only checkpoints (e.g. W4A16)"
            )
        if g.get("format") not in (None, FORMAT):
            raise UserError(f"{p}: config group {name} is format {g.get('format')!r:.60}; matgptq reads '{FORMAT}'")
        scheme = _weights(p, name, g.get("weights"))
        for t in g["targets"]:
            if not isinstance(t, str):
                raise UserError(f"{p}: config group {name} has a target {t!r:.60} that is not a string; {FIX}")
            targets[t] = scheme
    for t in [*targets, *ignore]:
        try:
            re.compile(t[3:]) if t.startswith("re:") else None
        except re.error:
            raise UserError(f"{p}: target {t!r:.60} is not a regular expression; {FIX}") from None
    return targets, ignore


def _matches(name: str, target: str) -> bool:
    """compressed-tensors' match of a Linear: `re:` regex from the start, exact name, or class name."""
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name or target in LINEAR_CLASSES


def scheme_of(name: str, targets: dict[str, Scheme], ignore: list[str]) -> Scheme | None:
    """The scheme of Linear `name` (None: not quantized), resolved as compressed-tensors does (module docstring)."""
    if any(_matches(name, i) for i in ignore):
        return None
    ordered = sorted(targets, key=lambda t: ("re:" in t, t))
    by_name = [t for t in ordered if t not in LINEAR_CLASSES and _matches(name, t)]
    by_class = [t for t in ordered if t in LINEAR_CLASSES]
    found = by_name + by_class
    return targets[found[0]] if found else None
