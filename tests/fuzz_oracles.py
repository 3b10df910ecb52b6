"""Oracles of tests/test_fuzz_volume.py: what a damaged input that a reader still loads may differ in from the
undamaged one. Each judge gets (damaged result, undamaged result, recipe, the damaged file's original bytes) and
returns None or the failure in words.

- matgptq parent / slice (checksummed): the same model — every layer's codes, scales, zeros, g_idx, perm and
  per-width scales and every unquantized tensor equal, bit for bit.
- GPTQ v1/v2, compressed-tensors (no checksums): every structural property equal (layer names, shapes, widths,
  shifts, group counts, tensor names, shapes and dtypes, the recorded bits and group size), and data differing only
  where the damaged bytes feed: a changed byte of a stored tensor may change the output it is decoded into, by at most
  the values one int32 word packs (32 // bits: GPTQ v1's zero points are recovered by a word-wide add, which borrows
  across the fields of that word), or one value for an unpacked tensor; nothing else may change.
- GGUF: the tensors' names, types and shapes equal; each tensor's bytes differ only at damaged positions; at most
  two metadata fields (a key renamed: one gone, one new) per damaged header byte.
- a bare safetensors file: entries whose header text was not touched are unchanged, at most one changed entry per
  touched one, and tensor bytes differ only at damaged positions.
- config.json: the model built has the same parameters, shapes and values (a damaged config may change a
  hyperparameter, never which weights are loaded).
- mix JSON: every layer gets an integer width; a file that still parses to the same JSON gives the same mix.
- resume state: the same finished blocks and report count; hidden states of the same shapes and dtypes, differing
  only in the elements whose bytes were damaged.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import torch

from tests.fuzz_damage import apply, damaged_bytes

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def ndiff(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements whose bits differ (NaN-safe: floats compared as integers of their width)."""
    if a.is_floating_point():
        a, b = a.view(_INT_VIEW[a.element_size()]), b.view(_INT_VIEW[b.element_size()])
    return int((a != b).sum())


def st_ranges(raw: bytes) -> tuple[int, dict[str, tuple[int, int]]]:
    """The header's end and each tensor's [begin, end) in a safetensors file's bytes."""
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8 : 8 + n])
    return 8 + n, {
        k: (8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1]) for k, v in head.items() if k != "__metadata__"
    }


def data_damage(recipe: dict, raw: bytes, data_file: str) -> dict[str, int]:
    """{stored tensor: damaged bytes} when only tensor data of `data_file` changed; {} for anything else (a header,
    another file, moved bytes), where no data may differ."""
    pos = damaged_bytes(recipe["ops"])
    if recipe["file"] != data_file or pos is None:
        return {}
    end, ranges = st_ranges(raw)
    if any(p < end for p in pos):
        return {}
    return {k: sum(b <= p < e for p in pos) for k, (b, e) in ranges.items() if any(b <= p < e for p in pos)}


def components(ckpt) -> dict[tuple[str, str], torch.Tensor]:
    out = {}
    for name, q in ckpt.layers.items():
        out.update(
            {(name, "codes"): q.codes, (name, "scales"): q.scales, (name, "zeros"): q.zeros, (name, "g_idx"): q.g_idx}
        )
        if q.perm is not None:
            out[(name, "perm")] = q.perm
        out.update({(name, f"scales.{r}"): s for r, s in (q.width_scales or {}).items()})
    out.update({(k, "tensor"): t for k, t in ckpt.tensors.items()})
    return out


def signature(ckpt, recorded: bool) -> dict:
    """Structural properties; `recorded`: with the bits and group size the checkpoint records (those of a foreign
    format are read from its config; a matgptq checkpoint's live in matgptq.json, outside its checksums)."""
    quant = ckpt.meta.get("quantization") or {}
    return {
        "components": {k: (tuple(t.shape), t.dtype) for k, t in components(ckpt).items()},
        "widths": {n: (q.bits, q.shift) for n, q in ckpt.layers.items()},
        "recorded": (quant.get("bits"), quant.get("group_size")) if recorded else None,
    }


def _first_difference(a: dict, b: dict) -> str:
    for part in a:
        if a[part] != b[part]:
            keys = sorted(set(a[part]) | set(b[part]), key=str) if isinstance(a[part], dict) else [None]
            k = next((k for k in keys if k is None or a[part].get(k) != b[part].get(k)), None)
            got, want = (a[part], b[part]) if k is None else (a[part].get(k), b[part].get(k))
            return f"{part} {k}: {got} instead of {want}"
    return "?"


# stored tensor suffix -> the decoded component it feeds, and whether it is int32-packed
FEEDS = {
    "qweight": ("codes", True),
    "qzeros": ("zeros", True),
    "scales": ("scales", False),
    "g_idx": ("g_idx", False),
    "weight_packed": ("codes", True),
    "weight_zero_point": ("zeros", True),
    "weight_scale": ("scales", False),
    "weight_g_idx": ("g_idx", False),
}


def _allowed(base, damage: dict[str, int]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for stored, nbytes in damage.items():
        layer, _, suffix = stored.rpartition(".")
        if layer in base.layers and suffix in FEEDS:
            part, packed = FEEDS[suffix]
            key, fan = (layer, part), (32 // base.layers[layer].bits if packed else 1)
        else:
            key, fan = (stored, "tensor"), 1
        out[key] = out.get(key, 0) + nbytes * fan
    return out


def _data_judge(res, base, allowed: dict, recorded: bool = True) -> str | None:
    got, want = signature(res, recorded), signature(base, recorded)
    if got != want:
        return "structure changed: " + _first_difference(got, want)
    got, want = components(res), components(base)
    for key, t in got.items():
        n = ndiff(t, want[key])
        if n > allowed.get(key, 0):
            return f"{key[0]} {key[1]} differs in {n} values; the damage allows {allowed.get(key, 0)}"
    return None


def checkpoint_judge(res, base, recipe, raw) -> str | None:
    if not hasattr(res, "layers"):
        return f"the quantized checkpoint loaded as an unquantized {type(res).__name__}"
    return _data_judge(res, base, _allowed(base, data_damage(recipe, raw, "model.safetensors")))


def same_model_judge(res, base, recipe, raw) -> str | None:
    return _data_judge(res, base, {}, recorded=False)


def config_judge(model, base, recipe, raw) -> str | None:
    got, want = model.state_dict(), base.state_dict()
    if {k: tuple(v.shape) for k, v in got.items()} != {k: tuple(v.shape) for k, v in want.items()}:
        return "the model built has other parameters or shapes"
    bad = next((k for k, v in got.items() if ndiff(v, want[k].to(v.dtype))), None)
    return None if bad is None else f"parameter {bad} holds other values than the checkpoint's"


def mix_judge(res, base, recipe, raw) -> str | None:
    if set(res) != set(base) or not all(type(v) is int for v in res.values()):
        return f"the mix is not an integer width for every layer: {res!r:.200}"
    try:
        same = json.loads(apply(raw, recipe["ops"])) == json.loads(raw)
    except ValueError:
        same = False
    return f"the same JSON gave another mix: {res!r:.200}" if same and res != base else None


def _bytes_confined(got: np.ndarray, want: np.ndarray, start: int, pos: set[int]) -> bool:
    return all(start + int(i) in pos for i in np.flatnonzero(got != want))


def gguf_judge(res, base, recipe, raw) -> str | None:
    shape = lambda f: [(t.name, t.type, t.shape) for t in f.tensors.values()]  # noqa: E731
    if shape(res) != shape(base):
        return "tensors changed: " + str(
            next((a, b) for a, b in zip(shape(res) + [None], shape(base) + [None]) if a != b)
        )
    pos = damaged_bytes(recipe["ops"]) or set()
    for name, t in res.tensors.items():
        if not _bytes_confined(t.data, base.tensors[name].data, t.offset, pos):
            return f"tensor {name} differs outside the damaged bytes"
    keys = set(res.fields) | set(base.fields)
    changed = [
        k
        for k in keys
        if k not in res.fields
        or k not in base.fields
        or not np.array_equal(np.asarray(res.fields[k], dtype=object), np.asarray(base.fields[k], dtype=object))
    ]
    if len(changed) > 2 * len(pos):
        return f"{len(changed)} metadata fields changed (e.g. {sorted(changed)[:2]})"
    return None


def _spans(raw: bytes) -> dict[str, tuple[int, int]]:
    """Each entry's text in a safetensors header: from its quoted name to the end of its object."""
    n = struct.unpack("<Q", raw[:8])[0]
    text = raw[8 : 8 + n].decode()
    out = {}
    for name in json.loads(text):
        at = text.find(json.dumps(name) + ":")
        out[name] = (8 + at, 8 + text.find("}", at) + 1)
    return out


def safetensors_judge(res, base, recipe, raw) -> str | None:
    (head, tensors), (base_head, base_tensors) = res, base
    hit = [(at, at + max(cut, 1)) for at, cut, _ in recipe["ops"]]
    touched = {k for k, (b, e) in _spans(raw).items() if any(b < he and hb < e for hb, he in hit)}
    kept = {k: v for k, v in base_head.items() if k not in touched}
    if any(head.get(k) != v for k, v in kept.items()) or len(set(head) - set(kept)) > len(touched):
        return "header entries changed beyond those whose text was damaged"
    pos = damaged_bytes(recipe["ops"]) or set()
    _, ranges = st_ranges(raw)
    for k in kept:
        as_bytes = lambda t: t.reshape(-1).view(torch.uint8).numpy()  # noqa: E731
        if not _bytes_confined(as_bytes(tensors[k]), as_bytes(base_tensors[k]), ranges[k][0], pos):
            return f"tensor {k} differs outside the damaged bytes"
    return None


def _rebuild(report: dict):
    """The LayerReport the pipeline makes of a restored report (quantization/block_io.py, restore)."""
    from matgptq.quantization.layer import LayerReport

    r = report
    return LayerReport(
        r["name"],
        tuple(r["shape"]),
        {int(k): v for k, v in r["rel_error"].items()},
        r["damp"],
        r["seconds"],
        r.get("tokens"),
        r.get("starved"),
    )


def resume_judge(res, base, recipe, raw) -> str | None:
    try:
        for r in res.reports:
            _rebuild(r)
    except Exception as e:  # noqa: BLE001 — what the pipeline would meet after load() returned
        return f"a restored report cannot be rebuilt ({type(e).__name__}: {str(e)[:80]})"
    if res.done != base.done or len(res.reports) != len(base.reports) or len(res.hidden) != len(base.hidden):
        return (
            f"restored {res.done} blocks and {len(res.reports)} reports; the state holds {base.done}, "
            f"{len(base.reports)}"
        )
    if recipe["file"].endswith(".safetensors") and res.reports != base.reports:
        return "the reports changed, though only the hidden states were damaged"
    damage = data_damage(recipe, raw, recipe["file"]) if recipe["file"].endswith(".safetensors") else {}
    for b, (got, want) in enumerate(zip(res.hidden, base.hidden)):
        if got.shape != want.shape or got.dtype != want.dtype:
            return f"batch {b} is {got.dtype} {list(got.shape)}, not {want.dtype} {list(want.shape)}"
        if ndiff(got, want) > damage.get(f"batch_{b}", 0):
            return f"batch {b} differs in {ndiff(got, want)} values, beyond its damaged bytes"
    return None
