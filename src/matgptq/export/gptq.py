"""GPTQ checkpoints (v1 "gptq" and v2 "gptq_v2"): export of matgptq parents/slices, and import for `matgptq.load`.

Tensors per quantized Linear `<name>` (K = in features, N = out features, b bits, G groups; formats.md §1):
  <name>.qweight  int32   [K·b/32, N]   codes transposed to [K, N], packed along K (gptq_packing.pack_rows)
  <name>.qzeros   int32   [G, N·b/32]   zero points packed along N; v1 stores z − 1, v2 the true z (§2.1)
  <name>.scales   float16 [G, N]
  <name>.g_idx    int32   [K]           group of each input row; non-trivial (≠ k // g) only with act-order (§3)
dequantizing to W[n, k] = scales[g, n] · (q[k, n] − z[g, n]) with g = g_idx[k]. Everything else (embeddings, norms,
biases, lm_head) is stored unquantized under its usual name.

Odd shapes (e.g. stories260K's 172 MLP features): at 2/4/8 bits a packed axis that does not fill whole int32 words is
stored as GPTQModel 7.6.0 writes it, ceil(K·b/32) / ceil(N·b/32) words with zero codes and zero (v2) zero points in
the unused fields of the last word; v1 zeros are then derived as GPTQModel does (word − 0x11111111 for 4-bit, …, so
the unused fields borrow: 0xEEEF7777 for four real 4-bit fields), bit for bit its own output. GPTQModel's generic
torch kernel, and transformers + optimum with it, load such files (faster kernels may not: docs/gptq-compat.md).
3-bit packs 32-value blocks across 3 words that no loader reads partially (GPTQModel itself fails to pack them), so a
3-bit layer needs K and N multiples of 32 and is refused otherwise. The reader crops the fill again (K from g_idx, N
from qweight).

Slice → GPTQ (formats.md §7.3): an r-bit slice of a c-bit parent is W = s·(S·2^d − z_c) with d = c − r (`shift`), so

    GPTQ scale = s · 2^d    (exact in float16 unless it overflows)      GPTQ zero = z_c / 2^d    (must be an integer)

Symmetric slices are always exact (z_c = 2^(c−1) → 2^(r−1)); an asymmetric slice whose zero is not divisible is
refused, never rounded. v1 is written only when lossless: symmetric weights (§2.1, §2.5: an asymmetric zero of 0
cannot be stored as z − 1, and GPTQModel refuses asymmetric v1 not made by itself).
Config (§2.3–2.5): the same dict in config.json["quantization_config"] and quantize_config.json, with both
`checkpoint_format` and `format`; a per-layer mix uses the most common width as `bits` plus GPTQModel `dynamic`
overrides {"+:^<escaped name>$": {"bits": r}}, which GPTQModel honours and transformers/optimum ignore (§2.4).
"""

from __future__ import annotations

import json
import re
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from .._version import __version__
from ..checkpoint import Checkpoint
from ..errors import UserError
from ..formats.gptq_packing import SUPPORTED_BITS, pack_cols, pack_rows, packed_words, unpack_cols, unpack_rows
from ..fsutil import atomic_output, check_output, copy_tokenizer_files
from ..quantized import QuantizedWeight

FORMATS = {"gptq_v1": "gptq", "gptq_v2": "gptq_v2"}  # CLI name -> checkpoint_format
_V1_WORD_ADD = {2: 0x55555555, 4: 0x11111111, 8: 0x01010101}  # GPTQModel's v1 ⇄ v2 word constants (§2.2)


def gptq_layer(name: str, q: QuantizedWeight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes [N, K], fp16 scales [N, G], integer zeros [N, G]) of the plain r-bit GPTQ layer equal to `q`."""
    d = q.shift
    scales = q.scales.float() * float(1 << d)
    if not torch.isfinite(scales.half()).all():
        raise UserError(f"{name}: scale·2^{d} overflows float16 for the {q.bits}-bit slice; export a wider slice")
    zeros = q.zeros.to(torch.int32)
    if (zeros % (1 << d)).any():
        bad = int((zeros % (1 << d) != 0).sum())
        raise UserError(
            f"{name}: {bad} asymmetric zero point(s) of the {q.master_bits}-bit parent are not multiples of 2^{d}, so "
            f"the {q.bits}-bit slice has a fractional GPTQ zero; export {q.master_bits} bits, use a symmetric parent "
            "(--sym), or export GGUF (Q4_1/Q5_1 hold an offset)"
        )
    return q.codes.numpy(), scales.half().numpy(), (zeros >> d).numpy()


def _trivial_g_idx(k: int, group_size: int) -> torch.Tensor:
    return torch.arange(k, dtype=torch.int32) // (k if group_size == -1 else group_size)


def _to_v1_words(qzeros: np.ndarray, bits: int) -> np.ndarray:
    """GPTQModel's v2 → v1 (convert_gptq_v2_to_v1_format_module): one subtracted per field, as a word constant at
    2/4/8 bits (only zero-filled padding fields borrow; v1 is written for symmetric zeros ≥ 1), field by field at 3."""
    if bits == 3:
        return pack_cols(unpack_cols(qzeros, 3, qzeros.shape[-1] * 32 // 3).astype(np.int32) - 1, 3)
    words = (qzeros.view(np.uint32).astype(np.int64) - _V1_WORD_ADD[bits]) & 0xFFFFFFFF
    return words.astype(np.uint32).view(np.int32)


def _layer_tensors(name: str, q: QuantizedWeight, v1: bool) -> tuple[dict[str, torch.Tensor], bool, bool]:
    """The four GPTQ tensors of one layer, whether its zeros are the symmetric 2^(r−1), and whether it was padded."""
    r = q.bits
    if r not in SUPPORTED_BITS:
        raise UserError(f"GPTQ has no packing for {r}-bit weights ({name}); export 2, 3, 4 or 8 bits, or use --format gguf")
    codes, scales, zeros = gptq_layer(name, q)
    n, k = codes.shape
    if r == 3 and (n % 32 or k % 32):
        raise UserError(
            f"{name} has {n} output × {k} input features; 3-bit GPTQ packs blocks of 32 values across 3 words, so both "
            "must be multiples of 32 (no GPTQ loader reads a partial 3-bit block, and GPTQModel cannot write one); "
            "export 2, 4 or 8 bits (padded as GPTQModel does), or use --format gguf"
        )
    sym = bool((zeros == 1 << (r - 1)).all())
    if v1 and not sym:
        raise UserError(
            f"{name} has asymmetric zero points, which GPTQ v1 cannot store losslessly (a zero of 0 becomes −1, and "
            "GPTQModel refuses asymmetric v1 checkpoints it did not make); use --format gptq_v2"
        )
    qzeros = pack_cols(zeros.T, r, pad=True)
    tensors = {"qweight": pack_rows(codes.T, r, pad=True), "qzeros": _to_v1_words(qzeros, r) if v1 else qzeros}
    tensors = {key: torch.from_numpy(np.ascontiguousarray(v)) for key, v in tensors.items()}
    tensors["scales"] = torch.from_numpy(np.ascontiguousarray(scales.T))
    tensors["g_idx"] = q.g_idx.to(torch.int32).contiguous()
    return tensors, sym, (k * r) % 32 != 0 or (n * r) % 32 != 0


def quantization_config(fmt: str, widths: dict[str, int], group_size: int, desc_act: bool, sym: bool, meta: dict) -> dict:
    """The GPTQ config dict (fields every loader reads, formats.md §2.3–2.4), with `dynamic` for per-layer mixes."""
    counts = Counter(widths.values())
    base = max(counts, key=lambda b: (counts[b], b))
    extra = {k: meta[k] for k in ("true_sequential", "static_groups") if k in meta}
    extra["damp_percent"] = meta.get("damp", 0.01)
    qc = {
        "quant_method": "gptq", "method": "gptq", "bits": base, "group_size": group_size, "desc_act": desc_act,
        "sym": sym, "lm_head": False, "checkpoint_format": fmt, "format": fmt, "pack_dtype": "int32", **extra,
        "meta": {"quantizer": [f"matgptq:{__version__}"], **extra},
    }  # fmt: skip
    dynamic = {f"+:^{re.escape(n)}$": {"bits": r} for n, r in widths.items() if r != base}
    if dynamic:
        qc["dynamic"] = dynamic
    return qc


def export_gptq(src, out, fmt: str, bits: int | None = None, bits_config=None, overwrite: bool = False) -> Path:
    """Write the (sliced) checkpoint `src` as a GPTQ directory `out`; fmt is "gptq_v1" or "gptq_v2"."""
    from ..runtime import open_checkpoint, resolve_bits

    if fmt not in FORMATS:
        raise UserError(f"unknown GPTQ format {fmt!r}; use one of {sorted(FORMATS)}")
    if bits is not None and bits_config is not None:
        raise UserError("give either bits or a bits config, not both")
    check_output(out, overwrite)
    if not Path(src).is_dir():
        raise UserError(f"{src} is not a directory; give a matgptq parent/slice or a GPTQ checkpoint")
    ckpt = open_checkpoint(src)
    if ckpt is None:
        raise UserError(f"{src} is not quantized; quantize it first (matgptq quantize) and export the result")
    widths = resolve_bits(bits if bits is not None else bits_config, ckpt)
    qmeta = ckpt.meta.get("quantization") or {}
    if qmeta.get("skip"):
        raise UserError(
            f"{src} leaves block Linears unquantized (--skip {' '.join(qmeta['skip'])}); GPTQ loaders expect every "
            "block Linear quantized: re-quantize without --skip, or use --format gguf"
        )
    if "group_size" not in qmeta:
        raise UserError(f"{src} does not record its group size (matgptq.json quantization.group_size); re-quantize it")
    group_size = int(qmeta["group_size"])
    tensors = {k: v.contiguous() for k, v in ckpt.tensors.items()}
    all_sym, desc_act, padded = True, False, {}
    for name, r in widths.items():
        q = ckpt.layers[name].slice(r)
        layer, sym, pad = _layer_tensors(name, q, v1=fmt == "gptq_v1")
        all_sym &= sym
        if pad:
            padded[name] = (r, *q.shape)
        desc_act |= not torch.equal(layer["g_idx"], _trivial_g_idx(q.shape[1], group_size))
        tensors.update({f"{name}.{k}": v for k, v in layer.items()})
    qc = quantization_config(FORMATS[fmt], widths, group_size, desc_act, all_sym, qmeta)
    if "dynamic" in qc:
        warnings.warn("a per-layer mix is stored as GPTQModel `dynamic` overrides: transformers/optimum ignore them "
                      "and cannot load this export; use GPTQModel (or vLLM)", stacklevel=2)  # fmt: skip
    if padded:
        name, (r, n, k) = next(iter(padded.items()))
        warnings.warn(
            f"{len(padded)} layer(s) have features that do not fill whole int32 words (e.g. {name}: {n} out × {k} in "
            f"at {r} bits) and are zero-padded as GPTQModel pads them. GPTQModel's generic torch kernel reads them "
            "(backend=BACKEND.GPTQ_TORCH; in transformers: GPTQConfig(bits=..., backend=\"gptq_torch\")); kernels "
            "that need multiples of 16-128 do not (transformers' default 4-bit CPU kernel, ExLlama/Triton/Machete on "
            "GPU)", stacklevel=2)  # fmt: skip
    with atomic_output(out, overwrite) as tmp:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt", "producer": "matgptq"})
        (tmp / "config.json").write_text(json.dumps(dict(ckpt.config, quantization_config=qc), indent=2, default=str))
        (tmp / "quantize_config.json").write_text(json.dumps(qc, indent=2))
        copy_tokenizer_files(ckpt.path, tmp)
    return Path(out)


def export_gptq_cli(args) -> None:
    out = export_gptq(args.src, args.out, args.format, args.bits, args.bits_config, args.overwrite)
    print(f"wrote {out} ({args.format})")


# ---------------------------------------------------------------------------------------------------------- import


def _read_config(p: Path) -> tuple[dict, dict]:
    try:
        config = json.loads((p / "config.json").read_text())
        for name in ("quantize_config.json", "quant_config.json"):  # GPTQModel's order of preference (§2.3)
            if (p / name).is_file():
                return config, json.loads((p / name).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read the GPTQ config of {p} ({e}); is it a complete GPTQ checkpoint?") from None
    return config, dict(config.get("quantization_config") or {})


def _read_tensors(p: Path) -> dict[str, torch.Tensor]:
    index = p / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else None
    files = files or sorted(f.name for f in p.glob("*.safetensors"))
    if not files:
        raise UserError(f"{p} has no .safetensors weights; matgptq reads only safetensors (never pickles)")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(p / f)))
    return out


def _layer_bits(name: str, base: int, dynamic: dict) -> int | None:
    """Width of `name` under GPTQModel `dynamic` rules (first match wins; "-:" = not quantized → None)."""
    for pattern, override in dynamic.items():
        negative, raw = pattern.startswith("-:"), pattern[2:] if pattern[:2] in ("-:", "+:") else pattern
        if re.match(raw, name):
            return None if negative else int(override.get("bits", base))
    return base


def _holds(words: int, length: int, bits: int) -> bool:
    """Whether `words` int32 words are the (GPTQModel-padded) packing of `length` b-bit values (False: no packing)."""
    try:
        return words == packed_words(length, bits, pad=True)
    except ValueError:
        return False


def _v1_to_true(qzeros: torch.Tensor, bits: int, n: int, by_gptqmodel: bool) -> np.ndarray:
    """True zeros from v1 fields. GPTQModel subtracted a word constant (borrowing across fields), so its own files
    are inverted by the same word add; other producers are read per field, where a field of 2^b − 1 is invalid."""
    if by_gptqmodel and bits in _V1_WORD_ADD:
        words = (qzeros.numpy().view(np.uint32).astype(np.uint64) + _V1_WORD_ADD[bits]) & 0xFFFFFFFF
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
    checkpoints labelled "gptq" that hold v2 zeros exist (formats.md §2.5, §8.4); then trust the data and warn."""
    v2 = label == "gptq_v2"
    other = "v1" if v2 else "v2"  # its symmetric stored zero is 2^(b−1) − 1 (v1) or 2^(b−1) (v2)
    if stored and all((z == (1 << (widths[n] - 1)) - int(v2)).all() for n, z in stored.items()):
        warnings.warn(f"{p} is labelled {label} but holds the symmetric {other} zero points; reading them as {other}",
                      stacklevel=3)  # fmt: skip
        return not v2
    return v2


def _in_features(qweight: torch.Tensor, g_idx: torch.Tensor | None, bits: int) -> int:
    """K: g_idx's length (a padded qweight holds ceil(K·b/32) rows), else every value the rows hold."""
    return qweight.shape[0] * 32 // bits if g_idx is None else g_idx.shape[0]


def _layer(p: Path, name: str, raw: dict, r: int, zeros: np.ndarray, group_size: int) -> QuantizedWeight:
    qweight, scales, g_idx = raw.pop(f"{name}.qweight"), raw.pop(f"{name}.scales"), raw.pop(f"{name}.g_idx", None)
    k, n = _in_features(qweight, g_idx, r), qweight.shape[1]
    g_idx = _trivial_g_idx(k, group_size) if g_idx is None else g_idx.to(torch.int32)
    if scales.shape != (zeros.shape[0], n) or g_idx.shape != (k,):
        raise UserError(f"{p}: {name} has scales {tuple(scales.shape)} and g_idx {tuple(g_idx.shape)} for a {k}×{n} "
                        f"layer with {zeros.shape[0]} groups; the checkpoint is corrupt")  # fmt: skip
    if k and (int(g_idx.min()) < 0 or int(g_idx.max()) >= zeros.shape[0]):
        raise UserError(f"{p}: {name}.g_idx points outside its {zeros.shape[0]} groups; the checkpoint is corrupt")
    half = scales.to(torch.float16)
    if not torch.equal(half.to(scales.dtype), scales):
        raise UserError(f"{p}: {name} has {scales.dtype} scales that float16 cannot hold exactly; matgptq keeps fp16")
    return QuantizedWeight(
        codes=torch.from_numpy(np.ascontiguousarray(unpack_rows(qweight.numpy(), r, k, pad=True).T)),
        scales=half.T.contiguous(), zeros=torch.from_numpy(np.ascontiguousarray(zeros.T.astype(np.uint8))),
        g_idx=g_idx.contiguous(), bits=r,
    )  # fmt: skip


def read_gptq_checkpoint(path: str | Path) -> Checkpoint:
    """A GPTQ v1/v2 checkpoint directory (safetensors) as a `Checkpoint` of plain r-bit layers (shift 0)."""
    p = Path(path)
    config, qc = _read_config(p)
    config.pop("quantization_config", None)
    label = str(qc.get("checkpoint_format") or qc.get("format") or "gptq").lower()
    if label not in ("gptq", "gptq_v2"):
        raise UserError(f"{p} is GPTQ format '{label}'; matgptq reads 'gptq' (v1) and 'gptq_v2' (re-save it as one)")
    if str(qc.get("pack_dtype", "int32")) != "int32":
        raise UserError(f"{p} packs into {qc['pack_dtype']} words; matgptq reads int32-packed GPTQ only")
    if "bits" not in qc:
        raise UserError(f"{p}: the GPTQ config has no `bits`; the checkpoint is incomplete")
    base, group_size, dynamic = int(qc["bits"]), int(qc.get("group_size", 128)), qc.get("dynamic") or {}
    quantizers = (qc.get("meta") or {}).get("quantizer") or []
    by_gptqmodel = any(str(s).lower().startswith("gptqmodel:") for s in np.atleast_1d(quantizers))
    raw = _read_tensors(p)
    widths, stored = {}, {}
    for name in [k[: -len(".qweight")] for k in raw if k.endswith(".qweight")]:
        r = _layer_bits(name, base, dynamic)
        if r is None:
            raise UserError(f"{p}: {name} is stored quantized but the config's `dynamic` excludes it; fix the config")
        rows, n = raw[f"{name}.qweight"].shape
        k = _in_features(raw[f"{name}.qweight"], raw.get(f"{name}.g_idx"), r)
        if not _holds(rows, k, r):
            raise UserError(f"{p}: {name} has qweight {(rows, n)} for {k} inputs, which is not {r}-bit GPTQ")
        try:
            widths[name], stored[name] = r, unpack_cols(raw[f"{name}.qzeros"].numpy(), r, n, pad=True)
        except (KeyError, ValueError) as e:
            raise UserError(f"{p}: {name} has no valid {r}-bit qzeros ({e}); the checkpoint is corrupt") from None
    v2 = _is_v2(p, label, stored, widths)
    layers = {}
    for name, r in widths.items():
        qzeros = raw.pop(f"{name}.qzeros")
        n = raw[f"{name}.qweight"].shape[1]
        zeros = stored[name] if v2 else _v1_to_true(qzeros, r, n, by_gptqmodel)
        layers[name] = _layer(p, name, raw, r, zeros, group_size)
    quant = {"method": "gptq", "bits": base, "group_size": group_size, "sym": bool(qc.get("sym", True)),
             "act_order": bool(qc.get("desc_act", False))}  # fmt: skip
    meta = {"format": "gptq", "checkpoint_format": "gptq_v2" if v2 else "gptq", "quantization": quant}
    return Checkpoint(meta, config, layers, raw, p)
