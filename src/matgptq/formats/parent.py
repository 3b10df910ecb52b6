"""The matgptq checkpoint: one directory holding a parent (all widths) or a standalone slice.

Files: `config.json` (the HF config plus `quantization_config: {"quant_method": "matgptq", "bits": stored}`:
transformers loads it once `matgptq` is imported (integrations/transformers.py); without that import transformers
5.x skips the unknown method and reports the quantized weights MISSING), tokenizer files, `model.safetensors` and
`matgptq.json`. A parent larger than one shard (`quantize` writes shards of at most `shard_bytes`, default
SHARD_BYTES) has Hugging Face's sharded layout instead: `model-00001-of-0000N.safetensors`, … and
`model.safetensors.index.json` naming each tensor's file; the tensors are the same, and the readers take either
layout.
Tensors, per quantized layer `<name>` (the Linear's module path; weights as [out, in]):
  <name>.codes   uint8  [N, ceil(K·bits/8)]  codes as a little-endian bit stream per row (bits = stored width;
                                             bitstream.py)
  <name>.scales  float16 [N, G]              master scale per output row and group
  <name>.zeros   uint8  [N, G]               master zero point
  <name>.g_idx   int32  [K]                  group of each input column
  <name>.perm    int32  [K]                  act-order processing order (only with act-order, no static groups)
  <name>.scales.<r> float16 [N, G]           v2: the r-bit slice's own scales, r = 2..bits−1 (per-width-scales
                                             parents, quantization/algorithm/refit.py); a slice without one uses `scales`
and every unquantized tensor of the model under its usual name (embeddings, norms, biases, untied lm_head).
A parent with per-width scales is format v2 (a v1 reader would slice it on the master scale: wrong weights, so it
must refuse). A GPTQ/RTN checkpoint of mixed widths (`quantize --bits-config`) is v3: `layer_bits` in matgptq.json
gives each layer's stored width (`stored_bits` is the widest), so a v2 reader, which would unpack every layer at
`stored_bits`, refuses it. Every checkpoint is now written as v4, which adds each tensor's checksum (a v3 reader
would skip the check, so it refuses); v1-v3 files still read, unverified (`matgptq verify --add-checksums` upgrades
one in place).
`matgptq.json` records the format version, the method config (quantization/config.py), the stored width and shift (slices), the slicing rule,
calibration settings and versions — everything needed to reproduce the weights bit-exactly — and (v4) every tensor's
checksum (checksums.py), which the readers verify unless told the file is trusted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..errors import UserError
from ..fsutil import atomic_output, copy_tokenizer_files, replace_file
from ..untrusted import read_header, read_json, read_sharded, read_tensors, take
from . import checksums
from .bitstream import pack_bits, unpack_bits
from .quantized import Checkpoint, QuantizedWeight, width_scale_name, width_scale_tensors

FORMAT = "matgptq"
FORMAT_VERSION = 4  # highest version read and the one written; v2 adds <name>.scales.<r>, v3 `layer_bits`, v4 checksums
META_FILE = "matgptq.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"  # the sharded layout (Hugging Face's)
TENSOR_METADATA = {"format": "pt", "producer": FORMAT}
SLICING_RULE = "msb_round_half_up_saturating"  # slicing.py
# the name suffix of a quantized layer's tensors (`<name>.codes`, `<name>.scales.3`, ...; module docstring)
LAYER_TENSOR = re.compile(r"\.(codes|zeros|g_idx|perm|scales(\.\d+)?)$")
_FIX = "the checkpoint is damaged or incomplete, re-create it"


def layer_tensors(name: str, q: QuantizedWeight) -> dict[str, torch.Tensor]:
    """The tensors a checkpoint file stores for quantized layer `name` (codes packed at q's stored width)."""
    out = {
        f"{name}.codes": pack_bits(q.codes, q.bits),
        f"{name}.scales": q.scales.to(torch.float16).contiguous(),
        f"{name}.zeros": q.zeros.to(torch.uint8).contiguous(),
        f"{name}.g_idx": q.g_idx.to(torch.int32).contiguous(),
    }
    if q.perm is not None:
        out[f"{name}.perm"] = q.perm.to(torch.int32).contiguous()
    out.update(width_scale_tensors(name, q))
    return out


def write_dir(
    tmp: Path,
    config: dict,
    meta: dict,
    layers: dict[str, list[int]],
    layer_bits: dict[str, int],
    shift: int,
    sums: dict,
    tokenizer_dir: str | Path | None,
) -> None:
    """config.json, matgptq.json (`sums`: checksums.table of every tensor written) and the tokenizer files."""
    bits = max(layer_bits.values())
    full_meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "stored_bits": bits,
        "shift": shift,
        "slicing": SLICING_RULE,
        **meta,
        "layers": layers,
    }
    if len(set(layer_bits.values())) > 1:
        full_meta["layer_bits"] = layer_bits
    full_meta[checksums.KEY] = sums
    hf_config = dict(config, quantization_config={"quant_method": FORMAT, "bits": bits})
    (tmp / "config.json").write_text(json.dumps(hf_config, indent=2, default=str))
    (tmp / META_FILE).write_text(json.dumps(full_meta, indent=2))
    if tokenizer_dir is not None:
        copy_tokenizer_files(tokenizer_dir, tmp)


def save_checkpoint(
    out: str | Path,
    config: dict,
    tensors: dict[str, torch.Tensor],
    layers: dict[str, QuantizedWeight],
    meta: dict,
    tokenizer_dir: str | Path | None,
    overwrite: bool = False,
) -> Path:
    """Write a checkpoint directory atomically, in one file. `tensors` are the unquantized ones. Layers of several
    widths are one checkpoint only as whole GPTQ/RTN layers (shift 0): a slice stores one width of one parent."""
    widths = {(q.bits, q.shift) for q in layers.values()}
    if len(widths) != 1 and any(shift for _, shift in widths):
        raise ValueError(f"a slice checkpoint stores one width; got {sorted(widths)}")
    shift = widths.pop()[1]
    out_tensors = {k: v.contiguous() for k, v in tensors.items()}
    for name, q in layers.items():
        out_tensors.update(layer_tensors(name, q))
    with atomic_output(out, overwrite, size=sum(t.nbytes for t in out_tensors.values())) as tmp:
        save_file(out_tensors, str(tmp / WEIGHTS_FILE), metadata=TENSOR_METADATA)
        write_dir(
            tmp,
            config,
            meta,
            {name: list(q.shape) for name, q in layers.items()},
            {name: q.bits for name, q in layers.items()},
            shift,
            checksums.table(out_tensors),
            tokenizer_dir,
        )
    return Path(out)


def write_slice(
    parent: str | Path, bits: int, out: str | Path, overwrite: bool = False, verify: bool | None = None
) -> Path:
    """Write the `bits`-bit slice of the parent at `parent` as its own, smaller checkpoint (only that width's codes
    and scales); it records the parent it came from. `verify`: as read_checkpoint's."""
    ckpt = read_checkpoint(parent, verify=verify)
    if ckpt.layers and next(iter(ckpt.layers.values())).shift:
        raise UserError(f"{parent} is already a slice; slice the parent checkpoint")
    try:
        layers = {n: q.slice(bits) for n, q in ckpt.layers.items()}
    except ValueError as e:
        raise UserError(str(e)) from None
    drop = ("stored_bits", "shift", "layers", "format", "format_version", "slicing", "layer_bits", checksums.KEY)
    meta = {k: v for k, v in ckpt.meta.items() if k not in drop} | {"sliced_from": str(Path(parent).resolve())}
    return save_checkpoint(out, ckpt.config, ckpt.tensors, layers, meta, parent, overwrite)


def is_checkpoint(path: str | Path) -> bool:
    return (Path(path) / META_FILE).is_file()


def _int_field(where: Path, meta: dict, key: str, lo: int, hi: int) -> int:
    v = meta.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise UserError(f"{where}: `{key}` is {v!r}, expected an integer in {lo}..{hi}; the checkpoint is damaged")
    return v


def _layer_shapes(where: Path, meta: dict) -> dict[str, tuple[int, int]]:
    layers = meta.get("layers")
    ok = isinstance(layers, dict) and all(
        isinstance(v, list) and len(v) == 2 and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in v)
        for v in layers.values()
    )
    if not ok:
        raise UserError(f"{where}: `layers` must map each layer to [out, in] positive sizes; the checkpoint is damaged")
    return {name: (n, k) for name, (n, k) in layers.items()}


def _layer_widths(where: Path, meta: dict, shapes: dict, bits: int, shift: int) -> dict[str, int]:
    """Each layer's stored width: `stored_bits`, or per layer from v3's `layer_bits` (whole layers only, widest =
    `stored_bits`)."""
    if "layer_bits" not in meta:
        return dict.fromkeys(shapes, bits)
    widths = meta["layer_bits"]
    ok = (
        isinstance(widths, dict)
        and set(widths) == set(shapes)
        and shift == 0
        and all(isinstance(r, int) and not isinstance(r, bool) and 1 <= r <= 8 for r in widths.values())
        and max(widths.values(), default=bits) == bits
    )
    if not ok:
        raise UserError(
            f"{where}: `layer_bits` must give every layer a width 1..8, the widest `stored_bits`, with "
            "shift 0; the checkpoint is damaged"
        )
    return widths


def _check_quantization(where: Path, meta: dict) -> None:
    """The recorded settings the exporters read: types and ranges, so a damaged record fails here, not later."""
    q = meta.get("quantization", {})
    if not isinstance(q, dict):
        raise UserError(f"{where}: `quantization` must be an object; the checkpoint is damaged")
    g = q.get("group_size", -1)
    bad = (
        not isinstance(g, int)
        or isinstance(g, bool)
        or g == 0
        or g < -1
        or not isinstance(q.get("sym", True), bool)
        or not isinstance(q.get("act_order", False), bool)
        or not isinstance(q.get("skip", []), list)
        or not all(isinstance(x, str) for x in q.get("skip", []))
    )
    if bad:
        raise UserError(
            f"{where}: the `quantization` record has a value of the wrong type or range "
            "(group_size, sym, act_order, skip); the checkpoint is damaged, re-create it"
        )


def read_layer(where: Path, raw: dict, name: str, n: int, k: int, bits: int, shift: int) -> QuantizedWeight:
    """One layer's tensors, checked against the metadata: dtypes, shapes, g_idx and zeros in range, perm a
    permutation, scales finite and non-zero."""
    codes = take(raw, f"{name}.codes", torch.uint8, (n, k if bits == 8 else -(-k * bits // 8)), where)
    scales = take(raw, f"{name}.scales", torch.float16, (n, None), where)
    groups = scales.shape[1]
    zeros = take(raw, f"{name}.zeros", torch.uint8, (n, groups), where)
    g_idx = take(raw, f"{name}.g_idx", torch.int32, (k,), where)
    perm = take(raw, f"{name}.perm", torch.int32, (k,), where, optional=True)
    if int(g_idx.min()) < 0 or int(g_idx.max()) >= groups:
        raise UserError(f"{where}: {name}.g_idx points outside its {groups} groups; the checkpoint is damaged")
    if int(zeros.max()) >= 1 << (bits + shift):
        raise UserError(f"{where}: {name}.zeros exceed the {bits + shift}-bit grid; the checkpoint is damaged")
    if not bool(torch.isfinite(scales).all()) or bool((scales == 0).any()):
        raise UserError(f"{where}: {name}.scales hold zero, NaN or Inf; the checkpoint is damaged")
    if perm is not None and not torch.equal(perm.sort().values, torch.arange(k, dtype=torch.int32)):
        raise UserError(f"{where}: {name}.perm is not a permutation of its {k} columns; the checkpoint is damaged")
    width_scales = {}
    for r in range(2, bits) if shift == 0 else ():
        s = take(raw, width_scale_name(name, r), torch.float16, (n, groups), where, optional=True)
        if s is not None:
            if not bool(torch.isfinite(s).all()) or bool((s == 0).any()):
                raise UserError(
                    f"{where}: {width_scale_name(name, r)} holds zero, NaN or Inf; the checkpoint is damaged"
                )
            width_scales[r] = s
    return QuantizedWeight(
        codes=unpack_bits(codes, bits, k),
        scales=scales,
        zeros=zeros,
        g_idx=g_idx,
        bits=bits,
        shift=shift,
        perm=None if perm is None else perm.long(),
        width_scales=width_scales or None,
    )


@dataclass
class Layout:
    """What a checkpoint's matgptq.json says, checked, without reading a tensor: each quantized layer's [out, in]
    shape and stored width, the shift (a slice's c − r; 0 for a parent) and the HF config without its
    quantization_config, and each tensor's checksum (v4; None for an older file). For a reader that loads the tensors
    itself (vLLM, integrations/vllm.py)."""

    meta: dict
    config: dict
    shapes: dict[str, tuple[int, int]]
    widths: dict[str, int]
    shift: int
    path: Path
    sums: dict[str, str] | None


def read_layout(path: str | Path) -> Layout:
    """The checked metadata of the parent or slice directory `path` (damage is one `UserError` naming the file)."""
    p = Path(path)
    meta_path = p / META_FILE
    meta, config = read_json(meta_path, _FIX), read_json(p / "config.json", _FIX)
    if meta.get("format") != FORMAT:
        raise UserError(
            f"{meta_path} says format {meta.get('format')!r}, not {FORMAT!r}; it is not a matgptq checkpoint"
        )
    version = meta.get("format_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        raise UserError(f"{p} holds format {FORMAT} v{version}; this matgptq reads up to v{FORMAT_VERSION}: upgrade it")
    _int_field(meta_path, meta, "format_version", 1, FORMAT_VERSION)
    bits = _int_field(meta_path, meta, "stored_bits", 1, 8)
    shift = _int_field(meta_path, meta, "shift", 0, 8 - bits)
    shapes = _layer_shapes(meta_path, meta)
    widths = _layer_widths(meta_path, meta, shapes, bits, shift)
    _check_quantization(meta_path, meta)
    sums = checksums.recorded(meta_path, meta) if meta["format_version"] >= 4 else None
    config.pop("quantization_config", None)
    return Layout(meta, config, shapes, widths, shift, p, sums)


def read_checkpoint(path: str | Path, layers_only: bool = False, verify: bool | None = None) -> Checkpoint:
    """A parent or slice directory, validated before use: any damage is one `UserError` naming the file.
    `layers_only`: keep the quantized layers' tensors only (`tensors` is then empty), for a reader that loads the
    others itself (transformers' from_pretrained, integrations/transformers.py). `verify`: check every tensor of the
    files against its recorded checksum (v4 files; checksums.py), those not kept included; None: unless inside
    `checksums.trusted()`."""
    layout = read_layout(path)
    p, meta, config = layout.path, layout.meta, layout.config
    shapes, widths, shift = layout.shapes, layout.widths, layout.shift
    sharded = (p / INDEX_FILE).is_file()
    weights = p / (INDEX_FILE if sharded else WEIGHTS_FILE)
    keep = (lambda k: LAYER_TENSOR.search(k) is not None and LAYER_TENSOR.sub("", k) in shapes) if layers_only else None
    raw = (read_sharded if sharded else read_tensors)(weights, _FIX, keep)
    if (checksums.wanted() if verify is None else verify) and layout.sums is not None:
        _verify(weights, raw, layout.sums, sharded and read_json(weights, _FIX)["weight_map"])
    layers = {name: read_layer(weights, raw, name, n, k, widths[name], shift) for name, (n, k) in shapes.items()}
    stray = next((k for k in raw if k.endswith(".codes")), None)  # a layer's codes whose layer `layers` lacks
    if stray is not None:
        raise UserError(
            f"{weights}: {stray} belongs to no layer of {META_FILE}'s `layers`; the checkpoint is damaged, re-create it"
        )
    return Checkpoint(meta, config, layers, raw, p)


def _verify(weights: Path, raw: dict[str, torch.Tensor], sums: dict[str, str], weight_map: dict | bool) -> None:
    """The tensors read, then the files' others one at a time (a `layers_only` read), against their checksums; the
    files must hold every tensor recorded."""
    checksums.verify(weights, raw, sums)
    files = (
        {k: weights.parent / f for k, f in weight_map.items()}
        if weight_map
        else dict.fromkeys(read_header(weights, _FIX), weights)
    )
    checksums.complete(weights, files, sums)
    for name in sorted(set(files) - set(raw)):
        checksums.verify(files[name], read_tensors(files[name], _FIX, lambda k, n=name: k == n), sums)


def add_checksums(path: str | Path) -> int:
    """Record the checksums of a checkpoint written before them (v1-v3; its structure checked first), making it v4:
    matgptq.json is replaced whole (a temporary file renamed), the tensors are untouched. The number of tensors."""
    layout = read_layout(path)
    if layout.sums is not None:
        raise UserError(f"{layout.path} already records its checksums (format v{layout.meta['format_version']})")
    read_checkpoint(path)
    sharded = (layout.path / INDEX_FILE).is_file()
    raw = (read_sharded if sharded else read_tensors)(layout.path / (INDEX_FILE if sharded else WEIGHTS_FILE), _FIX)
    meta = dict(layout.meta, format_version=FORMAT_VERSION, **{checksums.KEY: checksums.table(raw)})
    replace_file(layout.path / META_FILE, lambda tmp: tmp.write_text(json.dumps(meta, indent=2)), "run it again")
    return len(raw)
