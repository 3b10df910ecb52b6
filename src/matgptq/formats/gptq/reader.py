"""GPTQ checkpoints (v1 "gptq" and v2 "gptq_v2") on disk, read as a `Checkpoint` for `matgptq.load` and exports.

Tensors per quantized Linear `<name>` (K = in features, N = out features, b bits, G groups; docs/formats.md §2):
  <name>.qweight  int32   [K·b/32, N]   codes transposed to [K, N], packed along K (packing.pack_rows)
  <name>.qzeros   int32   [G, N·b/32]   zero points packed along N; v1 stores z − 1, v2 the true z (§2.5)
  <name>.scales   float16 [G, N]
  <name>.g_idx    int32   [K]           group of each input row; non-trivial (≠ k // g) only with act-order (§4.2)
dequantizing to W[n, k] = scales[g, n] · (q[k, n] − z[g, n]) with g = g_idx[k]. Everything else (embeddings, norms,
biases, lm_head) is stored unquantized under its usual name.

Odd shapes (e.g. an MLP width of 172): at 2/4/8 bits a packed axis that does not fill whole int32 words is
stored as GPTQModel writes it, ceil(K·b/32) / ceil(N·b/32) words with zero codes and zero (v2) zero points in
the unused fields of the last word; v1 zeros are then derived as GPTQModel does (word − 0x11111111 for 4-bit, …, so
the unused fields borrow: 0xEEEF7777 for four real 4-bit fields), bit for bit its own output. GPTQModel's generic
torch kernel, and transformers + optimum with it, load such files (faster kernels may not: docs/results/gptq_compat.md).
3-bit packs 32-value blocks across 3 words that no loader reads partially (GPTQModel itself fails to pack them), so a
3-bit layer needs K and N multiples of 32 and is refused otherwise. The reader crops the fill again (K from g_idx, N
from qweight).

Written by writer.py.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import torch

from ...errors import UserError
from ...untrusted import read_json, read_model_weights
from ..quantized import Checkpoint, QuantizedWeight
from .constants import CONFIG_FILES, FIX, SUPPORTED_BITS, TENSORS, V1, V1_WORD_ADD, V2
from .experts import join_experts  # MoE: per-expert gate/up halves back to fused layers
from .packing import packed_words, unpack_cols, unpack_rows


def trivial_g_idx(k: int, group_size: int) -> torch.Tensor:
    """g_idx[k] = k // group_size (−1: one group): the g_idx of a checkpoint without act-order."""
    return torch.arange(k, dtype=torch.int32) // (max(k, 1) if group_size == -1 or group_size > k else group_size)


def _read_config(p: Path) -> tuple[dict, dict]:
    config = read_json(p / "config.json", FIX)
    for name in CONFIG_FILES:  # GPTQModel's order of preference (§2.6)
        if (p / name).is_file():
            return config, read_json(p / name, FIX)
    qc = config.get("quantization_config") or {}
    if not isinstance(qc, dict):
        raise UserError(f"{p}/config.json: `quantization_config` is not an object; {FIX}")
    return config, dict(qc)


def _is_group_size(g) -> bool:
    return isinstance(g, int) and not isinstance(g, bool) and (g == -1 or g > 0)


def _settings(p: Path, qc: dict) -> tuple[int, int, dict]:
    """bits, group_size and `dynamic` of a GPTQ config, type- and range-checked."""
    bits, group_size, dynamic = qc.get("bits"), qc.get("group_size", 128), qc.get("dynamic") or {}
    width = lambda b: isinstance(b, int) and not isinstance(b, bool) and b in SUPPORTED_BITS  # noqa: E731
    if not width(bits):
        raise UserError(
            f"{p}: the GPTQ config's `bits` is {bits!r:.60}; matgptq reads {sorted(SUPPORTED_BITS)}-bit GPTQ"
        )
    if not _is_group_size(group_size):
        raise UserError(f"{p}: the GPTQ config's `group_size` is {group_size!r:.60}, expected -1 or a positive integer")
    ok = isinstance(dynamic, dict) and all(
        isinstance(v, dict) and width(v.get("bits", bits)) and _is_group_size(v.get("group_size", group_size))
        for v in dynamic.values()
    )
    if not ok:
        raise UserError(
            f'{p}: the GPTQ config\'s `dynamic` must map patterns to {{"bits": 2|3|4|8}} (and an optional '
            f"group_size); {FIX}"
        )
    for pattern in dynamic:
        try:
            re.compile(pattern[2:] if pattern[:2] in ("-:", "+:") else pattern)
        except re.error:
            raise UserError(f"{p}: `dynamic` pattern {pattern!r:.60} is not a regular expression; {FIX}") from None
    return bits, group_size, dynamic


def _layer_settings(name: str, base: int, group_size: int, dynamic: dict) -> tuple[int, int] | None:
    """(bits, group_size) of `name` under GPTQModel `dynamic` rules (first match wins; "-:" = not quantized → None)."""
    for pattern, override in dynamic.items():
        negative, raw = pattern.startswith("-:"), pattern[2:] if pattern[:2] in ("-:", "+:") else pattern
        if re.match(raw, name):
            return None if negative else (override.get("bits", base), override.get("group_size", group_size))
    return base, group_size


def _holds(words: int, length: int, bits: int) -> bool:
    """Whether `words` int32 words are the (GPTQModel-padded) packing of `length` b-bit values (False: no packing)."""
    try:
        return words == packed_words(length, bits, pad=True)
    except ValueError:
        return False


def _v1_to_true(qzeros: torch.Tensor, bits: int, n: int, by_gptqmodel: bool) -> np.ndarray:
    """True zeros from v1 fields. GPTQModel subtracted a word constant (borrowing across fields), so its own files
    are inverted by the same word add; other producers are read per field, where a field of 2^b − 1 is invalid."""
    if by_gptqmodel and bits in V1_WORD_ADD:
        words = (qzeros.numpy().view(np.uint32).astype(np.uint64) + V1_WORD_ADD[bits]) & 0xFFFFFFFF
        return unpack_cols(words.astype(np.uint32), bits, n, pad=True).astype(np.int32)
    z = unpack_cols(qzeros.numpy(), bits, n, pad=True).astype(np.int32) + 1
    if by_gptqmodel:  # 3-bit: GPTQModel stores (z − 1) & 7
        return z & ((1 << bits) - 1)
    if (z == 1 << bits).any():
        raise UserError(
            f"a GPTQ v1 zero field holds 2^{bits} − 1 (true zero {1 << bits}): this asymmetric v1 checkpoint lost its "
            "zero points of 0 when it was written; re-export it as gptq_v2"
        )
    return z


def _is_v2(p: Path, label: str, stored: dict[str, np.ndarray], widths: dict[str, int]) -> bool:
    """v1 or v2 zeros: the label, unless every stored zero is the symmetric value of the other convention — GPTQ
    checkpoints labelled "gptq" that hold v2 zeros exist (docs/formats.md §2.5); then trust the data and warn."""
    v2 = label == V2
    other = "v1" if v2 else "v2"  # its symmetric stored zero is 2^(b−1) − 1 (v1) or 2^(b−1) (v2)
    if stored and all((z == (1 << (widths[n] - 1)) - int(v2)).all() for n, z in stored.items()):
        warnings.warn(
            f"{p} is labelled {label} but holds the symmetric {other} zero points; reading them as {other}",
            stacklevel=3,
        )
        return not v2
    return v2


def _in_features(qweight: torch.Tensor, g_idx: torch.Tensor | None, bits: int) -> int:
    """K: g_idx's length (a padded qweight holds ceil(K·b/32) rows), else every value the rows hold."""
    return qweight.shape[0] * 32 // bits if g_idx is None else g_idx.shape[0]


def _check_groups(p: Path, name: str, g_idx: torch.Tensor, groups: int, group_size: int) -> None:
    """GPTQ's groups, with or without act-order: ceil(K / group_size) of them, each of group_size columns but the last
    (g_idx permutes which columns, never how many): a group size that disagrees with the tensors is damage."""
    k = g_idx.shape[0]
    size = max(k, 1) if group_size == -1 else group_size
    count = -(-k // size)
    want = [size] * (count - 1) + [k - size * (count - 1)] if count else []
    if groups != count or torch.bincount(g_idx.long(), minlength=groups).tolist() != want:
        raise UserError(
            f"{p}: {name}'s {groups} groups (g_idx) are not the groups of {size} of its {k} inputs that "
            f"the config's group_size {group_size} makes; {FIX}"
        )


def _layer(p: Path, name: str, raw: dict, r: int, zeros: np.ndarray, group_size: int) -> QuantizedWeight:
    qweight, scales, g_idx = raw.pop(f"{name}.qweight"), raw.pop(f"{name}.scales", None), raw.pop(f"{name}.g_idx", None)
    k, n = _in_features(qweight, g_idx, r), qweight.shape[1]
    g_idx = trivial_g_idx(k, group_size) if g_idx is None else g_idx
    if scales is None or not scales.is_floating_point():
        raise UserError(f"{p}: {name}.scales is missing or not floating-point; {FIX}")
    g_idx = g_idx.to(torch.int32)
    if scales.shape != (zeros.shape[0], n) or g_idx.shape != (k,):
        raise UserError(
            f"{p}: {name} has scales {tuple(scales.shape)} and g_idx {tuple(g_idx.shape)} for a {k}×{n} "
            f"layer with {zeros.shape[0]} groups; the checkpoint is corrupt"
        )
    if not bool(torch.isfinite(scales).all()):
        raise UserError(f"{p}: {name}.scales hold NaN or Inf; the checkpoint is corrupt")
    if k and (int(g_idx.min()) < 0 or int(g_idx.max()) >= zeros.shape[0]):
        raise UserError(f"{p}: {name}.g_idx points outside its {zeros.shape[0]} groups; the checkpoint is corrupt")
    _check_groups(p, name, g_idx, zeros.shape[0], group_size)
    half = scales.to(torch.float16)
    if not torch.equal(half.to(scales.dtype), scales):
        raise UserError(f"{p}: {name} has {scales.dtype} scales that float16 cannot hold exactly; matgptq keeps fp16")
    return QuantizedWeight(
        codes=torch.from_numpy(np.ascontiguousarray(unpack_rows(qweight.numpy(), r, k, pad=True).T)),
        scales=half.T.contiguous(),
        zeros=torch.from_numpy(np.ascontiguousarray(zeros.T.astype(np.uint8))),
        g_idx=g_idx.contiguous(),
        bits=r,
    )


def _stored_layers(p: Path, raw: dict, base: int, group_size: int, dynamic: dict) -> tuple[dict, dict, dict]:
    """({layer: bits}, {layer: group size}, {layer: stored zero fields}) of every `<layer>.qweight`, its packing
    checked."""
    widths, groups, stored = {}, {}, {}
    for name in [k[: -len(".qweight")] for k in raw if k.endswith(".qweight")]:
        settings = _layer_settings(name, base, group_size, dynamic)
        if settings is None:
            raise UserError(f"{p}: {name} is stored quantized but the config's `dynamic` excludes it; fix the config")
        r, groups[name] = settings
        qweight, qzeros = raw[f"{name}.qweight"], raw.get(f"{name}.qzeros")
        if qweight.dtype != torch.int32 or qweight.dim() != 2 or qzeros is None or qzeros.dtype != torch.int32:
            raise UserError(f"{p}: {name} needs int32 2-D qweight and int32 qzeros tensors; {FIX}")
        rows, n = qweight.shape
        g_idx = raw.get(f"{name}.g_idx")
        if g_idx is not None and (g_idx.dim() != 1 or g_idx.is_floating_point()):
            raise UserError(f"{p}: {name}.g_idx must be a 1-D integer tensor; {FIX}")
        k = _in_features(qweight, g_idx, r)
        if not _holds(rows, k, r):
            raise UserError(f"{p}: {name} has qweight {(rows, n)} for {k} inputs, which is not {r}-bit GPTQ")
        try:
            widths[name], stored[name] = r, unpack_cols(qzeros.numpy(), r, n, pad=True)
        except (KeyError, ValueError) as e:
            raise UserError(f"{p}: {name} has no valid {r}-bit qzeros ({e}); the checkpoint is corrupt") from None
    return widths, groups, stored


def read_gptq_checkpoint(path: str | Path) -> Checkpoint:
    """A GPTQ v1/v2 checkpoint directory (safetensors) as a `Checkpoint` of plain r-bit layers (shift 0)."""
    p = Path(path)
    config, qc = _read_config(p)
    config.pop("quantization_config", None)
    label = str(qc.get("checkpoint_format") or qc.get("format") or V1).lower()
    if label not in (V1, V2):
        raise UserError(f"{p} is GPTQ format '{label}'; matgptq reads 'gptq' (v1) and 'gptq_v2' (re-save it as one)")
    if str(qc.get("pack_dtype", "int32")) != "int32":
        raise UserError(f"{p} packs into {qc['pack_dtype']} words; matgptq reads int32-packed GPTQ only")
    base, group_size, dynamic = _settings(p, qc)
    meta = qc.get("meta")
    quantizers = (meta.get("quantizer") if isinstance(meta, dict) else None) or []
    by_gptqmodel = any(str(s).lower().startswith("gptqmodel:") for s in np.atleast_1d(quantizers))
    raw = read_model_weights(p, FIX)
    widths, groups, stored = _stored_layers(p, raw, base, group_size, dynamic)
    v2 = _is_v2(p, label, stored, widths)
    layers = {}
    for name, r in widths.items():
        qzeros = raw.pop(f"{name}.qzeros")
        n = raw[f"{name}.qweight"].shape[1]
        zeros = stored[name] if v2 else _v1_to_true(qzeros, r, n, by_gptqmodel)
        layers[name] = _layer(p, name, raw, r, zeros, groups[name])
    stray = next((k for k in raw if k.rpartition(".")[2] in TENSORS), None)
    if stray is not None:  # e.g. a layer whose qweight's name was damaged
        raise UserError(f"{p}: {stray} belongs to no quantized layer (no {stray.rpartition('.')[0]}.qweight); {FIX}")
    quant = {
        "method": "gptq",
        "bits": base,
        "group_size": group_size,
        "sym": bool(qc.get("sym", True)),
        "act_order": bool(qc.get("desc_act", False)),
    }
    meta = {"format": "gptq", "checkpoint_format": V2 if v2 else V1, "quantization": quant}
    layers, raw = join_experts(config.get("model_type"), layers, raw)
    return Checkpoint(meta, config, layers, raw, p)
