"""GGUF export (llama.cpp) of a matgptq parent, slice or per-layer mix, keeping the integer codes.

A quantized layer at r bits is W = D·(c − Z) with D = scale·2^shift (an fp16 value: ×2^k is exact) and
Z = zero / 2^shift (formats.md §7.3). A GGUF block type holds it *with the codes kept* when every GGUF block (32
columns; 16 for the sub-scales of K-quants) lies inside one quantization group, and (formats.md §6):

- offset types, w = d·(n − o): Q4_0 (o = 8), Q5_0 (16), Q8_0 (128, stored as int8 n − 128), Q3_K (4), Q6_K (32):
  n = c + o − Z must be an integer in the type's code range for every code 0..2^r − 1, and d = D (or, per block,
  mirrored: n = o + Z − c, d = −D, which holds a grid [−7s, 8s] or a negative scale). Legacy types are then
  bit-exact; K-quants store d·sc with one fp16 d per 256 columns and small integer sub-scales sc, exact only when all
  sub-scales of a super-block are equal (per-channel), otherwise the rounding of D onto that grid is measured.
- min types, w = d·n + m: Q4_1, Q5_1 (n = c, d = D, m = −D·Z rounded to fp16: the only error, ≤ 2^-11·|m|) and
  Q2_K (sub-scales and mins on 4-bit grids).

`auto` takes, per layer, the smallest of Q2_K, Q3_K, Q4_0, Q4_1, Q5_0, Q5_1, Q6_K, Q8_0 that keeps the codes and is
exact, accepting for Q4_1/Q5_1 the fp16 rounding of the offset (so asymmetric 4/5-bit layers become Q4_1/Q5_1
rather than the exact but 70% larger Q8_0). Symmetric 2/3/4-bit → Q4_0 (K-quant when per-channel), 5 → Q5_0,
6 → Q8_0 (Q6_K when per-channel), 8 → Q8_0, all bit-exact.

Layers no block type can hold with their codes (act-order without static groups, so a 32-block mixes groups; group
sizes that are not a multiple of 32 (16 for K-quants)) are **re-quantized to Q8_0 from the dequantized weights**
with a warning (error ≤ half a Q8_0 step, reported); layers whose in_features is not a multiple of 32 (e.g. 172)
cannot be blocked at all and are written as float (`float_type`, F32 = exact) with a warning, as llama.cpp's own
quantizer does (it falls back to F16). An explicit `qtype` that cannot hold a layer's codes (too many bits, an
asymmetric grid on a symmetric type) is a UserError; a shape/group mismatch falls back as `auto` would, with a warning.

Metadata follows convert_hf_to_gguf.py (formats.md §5.3), Q/K rows get the Llama RoPE permutation (§5.4, applied to
whole encoded rows, which commutes with the row-wise blocks), norms are F32, embeddings/lm_head `embed_type`
(default `float_type` = F32). The file is written atomically and every tensor is read back through gguf-py's
dequantizer to measure max |Δw| against matgptq's dequantized weight for the report.
"""

from __future__ import annotations

import json
import logging
import re
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from ..fsutil import atomic_output, check_output
from .gguf_metadata import _add_metadata, _add_vocab, _gguf, _hparams

__all__ = ["export_gguf", "export_gguf_cli", "read_gguf_weights", "GGUFExport", "TensorExport", "GGUFExportWarning",
           "QTYPES", "llama_qk_permutation", "gguf_tensor_name"]  # fmt: skip


class GGUFExportWarning(UserWarning):
    """A tensor could not be stored with its codes kept (re-quantized or written as float)."""


@dataclass(frozen=True)
class _Spec:
    name: str
    bits: int  # width of the stored code n
    offset: int | None  # w = d·(n − offset); None: w = d·n + m (min types)
    block: int  # columns sharing one (d, m): 32 legacy, 16 K-quant sub-block
    row: int  # in_features must be a multiple of this
    kquant: bool = False

    @property
    def ggml(self):
        return getattr(_gguf().GGMLQuantizationType, self.name.upper())

    @property
    def bpw(self) -> float:
        block, nbytes = _gguf().GGML_QUANT_SIZES[self.ggml]
        return 8 * nbytes / block


QTYPES: dict[str, _Spec] = {
    "q2_k": _Spec("q2_k", 2, None, 16, 256, True),
    "q3_k": _Spec("q3_k", 3, 4, 16, 256, True),
    "q4_0": _Spec("q4_0", 4, 8, 32, 32),
    "q4_1": _Spec("q4_1", 4, None, 32, 32),
    "q5_0": _Spec("q5_0", 5, 16, 32, 32),
    "q5_1": _Spec("q5_1", 5, None, 32, 32),
    "q6_k": _Spec("q6_k", 6, 32, 16, 256, True),
    "q8_0": _Spec("q8_0", 8, 128, 32, 32),
}  # ascending bits per weight: auto tries them in this order
_OFFSET_ROUNDED_OK = {"q4_1", "q5_1"}  # auto accepts fp16 rounding of their block offset m
FLOAT_TYPES = ("f32", "f16")
EMBED_TYPES = ("f32", "f16", "q8_0")

_FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10, "q3_k": 11,
               "q6_k": 18}  # fmt: skip  LlamaFileType (Q3_K → MOSTLY_Q3_K_S)

_BLOCK_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}  # fmt: skip
_TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}  # fmt: skip


def gguf_tensor_name(hf_name: str) -> str | None:
    """GGUF name of a Llama HF tensor (formats.md §5.3), or None if it has none."""
    if hf_name in _TOP_NAMES:
        return _TOP_NAMES[hf_name]
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", hf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"blk.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
    return None


_IN_BLOCK = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")


def _order(gguf_name: str) -> tuple:
    """convert_hf_to_gguf's tensor order: token_embd, blocks in order, output_norm, output."""
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    if m:
        return (1, int(m.group(1)), _IN_BLOCK.index(m.group(2)), m.group(3))
    return ({"token_embd.weight": 0, "output_norm.weight": 2, "output.weight": 3}.get(gguf_name, 4), gguf_name)


def llama_qk_permutation(rows: int, n_head: int) -> np.ndarray:
    """Row index P with gguf_row[i] = hf_row[P[i]] (convert_hf_to_gguf LlamaModel.permute, formats.md §5.4)."""
    if rows % (2 * n_head):
        raise UserError(f"cannot apply the Llama RoPE permutation: {rows} rows for {n_head} heads")
    return np.arange(rows).reshape(n_head, 2, rows // n_head // 2).swapaxes(1, 2).reshape(-1)


# --- reports ------------------------------------------------------------------------------------------------------


@dataclass
class TensorExport:
    """One tensor of the exported file."""

    name: str  # GGUF name
    source: str  # HF tensor name
    ggml_type: str  # e.g. "Q4_0"
    shape: tuple[int, ...]  # HF shape ([out, in] for weights)
    bits: int | None  # slice width of a quantized layer, None for float tensors
    method: str  # "codes" (integer codes kept), "requantized", "float"
    exact: bool  # measured: GGUF dequantization == matgptq's dequantized weight, bit for bit
    max_abs_err: float  # max |w_gguf − w_matgptq| (after undoing the Q/K permutation)
    rel_err: float  # max_abs_err / max |w_matgptq|
    note: str = ""


@dataclass
class GGUFExport:
    """What `export_gguf` wrote."""

    path: Path
    file_type: str
    size_bytes: int
    tensors: list[TensorExport] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return all(t.exact for t in self.tensors)

    @property
    def max_abs_err(self) -> float:
        return max((t.max_abs_err for t in self.tensors), default=0.0)

    def types(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.ggml_type] = out.get(t.ggml_type, 0) + 1
        return out

    def table(self) -> str:
        from ..evaluation import format_table

        rows = [[t.name, t.ggml_type, t.bits, t.method, "yes" if t.exact else "no", t.max_abs_err, t.note]
                for t in self.tensors]  # fmt: skip
        return format_table(["tensor", "type", "bits", "method", "exact", "max |Δw|", "note"], rows)

    def to_json(self) -> dict:
        d = asdict(self)
        d["path"] = str(self.path)
        d["exact"] = self.exact
        d["max_abs_err"] = self.max_abs_err
        return d


# --- encoding one quantized layer -----------------------------------------------------------------------------------


class _NoFit(Exception):
    """The type cannot hold this layer with its codes; kind: shape | groups | codes | scale."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


@dataclass
class _Layer:
    """Per-block view of W = D·(c − Z) for one block size."""

    codes: np.ndarray  # int16 [N, K]
    bits: int
    d: np.ndarray  # float16 [N, K // block]
    z: np.ndarray  # float64 [N, K // block]


def _block_view(q, block: int, what: str) -> _Layer:
    n, k = q.shape
    if k % block:
        raise _NoFit("shape", f"in_features {k} is not a multiple of {block}")
    idx = q.g_idx.numpy().astype(np.int64)
    s = q.scales.numpy().astype(np.float32) * np.float32(2.0**q.shift)
    d = s.astype(np.float16)
    if not (np.isfinite(d).all() and np.array_equal(d.astype(np.float32), s)):
        raise _NoFit("scale", "scale·2^shift does not fit float16")
    z = q.zeros.numpy().astype(np.float64) / 2.0**q.shift
    blocks = idx.reshape(-1, block)
    if (blocks == blocks[:, :1]).all():  # every block inside one group: the usual case (no act-order)
        first = blocks[:, 0]
        return _Layer(q.codes.numpy().astype(np.int16), q.bits, d[:, first], z[:, first])
    dd, zz = d[:, idx].reshape(n, -1, block), z[:, idx].reshape(n, -1, block)  # value check (act-order etc.)
    if not ((dd == dd[..., :1]).all() and (zz == zz[..., :1]).all()):
        raise _NoFit("groups", f"quantization groups are not aligned to {what} blocks of {block} columns "
                     "(act-order without static groups, or a group size that is not a multiple of "
                     f"{block})")  # fmt: skip
    return _Layer(q.codes.numpy().astype(np.int16), q.bits, dd[..., 0], zz[..., 0])


def _encode_codes(q, spec: _Spec) -> tuple[np.ndarray, float]:
    """Bytes [N, row_bytes] of `q` in `spec` keeping the codes, and the predicted max |Δw| (0 = exact)."""
    from ..formats import gguf_blocks as gb

    n, k = q.shape
    if k % spec.row:
        raise _NoFit("shape", f"in_features {k} is not a multiple of {spec.row} ({spec.name.upper()})")
    lay = _block_view(q, spec.block, spec.name.upper())
    top = (1 << lay.bits) - 1
    if spec.offset is not None:
        if not np.array_equal(lay.z, np.round(lay.z)):
            raise _NoFit("codes", f"its zero point is not an integer at {lay.bits} bits (an asymmetric slice); "
                         f"{spec.name.upper()} has a fixed offset")  # fmt: skip
        # per block, n = c + o − Z with d = D, or mirrored n = o + Z − c with d = −D (w = d·(n − o) either way;
        # e.g. a grid [−7s, 8s], zero 7, is Q4_0 with d = −s): take the first that keeps n in the code range
        hi = (1 << spec.bits) - 1
        up = (spec.offset - lay.z >= 0) & (spec.offset - lay.z + top <= hi)
        down = (spec.offset + lay.z - top >= 0) & (spec.offset + lay.z <= hi)
        if not (up | down).all():
            raise _NoFit("codes", f"{lay.bits}-bit codes with these zero points do not fit {spec.name.upper()}'s "
                         f"{spec.bits}-bit codes around {spec.offset}")  # fmt: skip
        sign = np.where(up, 1, -1).astype(np.int16)
        rep = lambda a: np.repeat(a, spec.block, axis=1)  # noqa: E731
        codes = rep(sign) * lay.codes + rep((spec.offset - sign * lay.z).astype(np.int16))
        d = np.where(up, lay.d, -lay.d).astype(np.float16)
        if spec.name == "q4_0":
            return gb.encode_q4_0(codes.astype(np.uint8), d), 0.0
        if spec.name == "q5_0":
            return gb.encode_q5_0(codes.astype(np.uint8), d), 0.0
        if spec.name == "q8_0":
            return gb.encode_q8_0(codes - 128, d), 0.0
        enc = gb.encode_q6_k if spec.name == "q6_k" else gb.encode_q3_k
        res = enc(codes.astype(np.uint8), d.astype(np.float64))
        return res.data, res.max_error
    if lay.bits > spec.bits:
        raise _NoFit("codes", f"{lay.bits}-bit codes do not fit {spec.name.upper()} ({spec.bits} bits)")
    if (lay.d < 0).any():
        raise _NoFit("scale", "negative scales")
    m = -lay.d.astype(np.float64) * lay.z  # w = D·c + m
    if spec.name == "q2_k":
        res = gb.encode_q2_k(lay.codes.astype(np.uint8), lay.d.astype(np.float64), -m)
        return res.data, res.max_error
    m16 = m.astype(np.float16)
    if not np.isfinite(m16).all():
        raise _NoFit("scale", "the block offset −scale·zero does not fit float16")
    err = float(np.abs(m16.astype(np.float64) - m).max(initial=0.0))
    enc = gb.encode_q4_1 if spec.name == "q4_1" else gb.encode_q5_1
    return enc(lay.codes.astype(np.uint8), lay.d, m16), err


def _kquant_uniform(q, spec: _Spec) -> bool:
    """Cheap pre-check for `auto`: a K-quant is exact only if each super-block has one (scale, zero) per row."""
    try:
        lay = _block_view(q, 16, spec.name.upper())
    except _NoFit:
        return False
    if q.shape[1] % 256:
        return False
    d, z = lay.d.reshape(q.shape[0], -1, 16), lay.z.reshape(q.shape[0], -1, 16)
    return bool((d == d[..., :1]).all() and (z == z[..., :1]).all())


@dataclass
class _Encoded:
    data: np.ndarray  # uint8 [N, row_bytes] or float [N, K]
    ggml_type: str  # "q4_0", ..., "f32", "f16"
    method: str
    note: str = ""


def _float_encode(w: np.ndarray, ftype: str) -> np.ndarray:
    return w.astype(np.float32 if ftype == "f32" else np.float16)


def _requantize(w: np.ndarray, qname: str) -> np.ndarray:
    gguf = _gguf()
    return gguf.quants.quantize(np.ascontiguousarray(w, dtype=np.float32), QTYPES[qname].ggml)


def _auto(q) -> tuple[_Encoded | None, list[str]]:
    """Smallest codes-keeping type that is exact (or Q4_1/Q5_1 with rounded offsets); reasons for the rest."""
    reasons = []
    for spec in QTYPES.values():
        if spec.kquant and not _kquant_uniform(q, spec):
            reasons.append(f"{spec.name.upper()}: sub-scales not uniform per 256 columns")
            continue
        try:
            data, err = _encode_codes(q, spec)
        except _NoFit as e:
            reasons.append(f"{spec.name.upper()}: {e.reason}")
            continue
        if err == 0.0 or spec.name in _OFFSET_ROUNDED_OK:
            return _Encoded(data, spec.name, "codes", "offset m rounded to fp16" if err else ""), reasons
    return None, reasons


def _fallback(q, w: np.ndarray, float_type: str, why: str) -> _Encoded:
    if q.shape[1] % 32 == 0:
        return _Encoded(_requantize(w, "q8_0"), "q8_0", "requantized", f"re-quantized from floats: {why}")
    return _Encoded(_float_encode(w, float_type), float_type, "float", f"no block type fits: {why}")


def _encode_layer(name: str, q, w: np.ndarray, qtype: str, float_type: str) -> _Encoded:
    """`q` in `qtype` (or auto), keeping its codes where a type can; `w` = q's dequantized weight (for fallbacks)."""
    if qtype == "auto":
        enc, reasons = _auto(q)
        if enc is not None:
            return enc
        why = next((r for r in reasons if "groups" in r or "multiple" in r), reasons[-1])
        return _fallback(q, w, float_type, why)
    spec = QTYPES[qtype]
    try:
        data, err = _encode_codes(q, spec)
        return _Encoded(data, qtype, "codes", "" if err == 0 else
                        ("offset m rounded to fp16" if not spec.kquant else "sub-scales rounded onto the K-quant grid"))
    except _NoFit as e:
        if e.kind in ("codes", "scale"):
            raise UserError(f"{name}: {qtype.upper()} cannot hold this layer ({e.reason}); use --type auto or a "
                            "wider type (q8_0 holds every symmetric width)") from None  # fmt: skip
        why = f"{qtype.upper()}: {e.reason}"
    enc, _ = _auto(q)  # shape/group mismatch: the nearest type that still keeps the codes, as llama.cpp falls back
    if enc is not None:
        enc.note = (f"fallback from {qtype.upper()} ({why})" + (f"; {enc.note}" if enc.note else ""))
        return enc
    return _fallback(q, w, float_type, why)


# --- export ---------------------------------------------------------------------------------------------------------


def _source(src: Path, bits, bits_config):
    """(checkpoint or None, {layer: bits}, config dict, {name: float tensor}, tokenizer dir)."""
    from ..runtime import open_checkpoint, resolve_bits

    if not src.exists():
        raise UserError(f"{src} does not exist; give a matgptq checkpoint or a model directory")
    if bits is not None and bits_config is not None:
        raise UserError("give either bits or bits_config, not both")
    ckpt = open_checkpoint(src)
    if ckpt is None:
        if bits is not None or bits_config is not None:
            raise UserError(f"{src} is not quantized; --bits/--bits-config apply to quantized checkpoints only")
        from ..models import load_fp_model

        model = load_fp_model(src, torch.float32)
        tensors, seen = {}, set()
        for k, t in model.state_dict().items():
            if t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            tensors[k] = t
        return None, {}, model.config.to_dict(), tensors, src
    widths = resolve_bits(bits_config if bits_config is not None else bits, ckpt)
    return ckpt, widths, ckpt.config, ckpt.tensors, ckpt.path


def export_gguf(src: str | Path, out_file: str | Path, bits: int | None = None,
                bits_config: str | Path | dict | None = None, qtype: str = "auto", overwrite: bool = False, *,
                float_type: str = "f32", embed_type: str | None = None) -> GGUFExport:  # fmt: skip
    """Write `src` (a matgptq parent/slice, GPTQ checkpoint or unquantized Llama) as one GGUF file for llama.cpp.

    bits / bits_config: the slice width for all layers, or a {layer: bits} mix (JSON file or dict, "*" = default).
    qtype: "auto" (per layer, the smallest exact type; see the module doc) or one of QTYPES for every layer.
    float_type: "f32" (exact) or "f16" for tensors no block type holds; embed_type: token_embd/output type
    ("f32", "f16", or "q8_0" re-quantized as llama.cpp's quantizer does; default float_type).
    """
    qtype = qtype.lower()
    if qtype != "auto" and qtype not in QTYPES:
        raise UserError(f"unknown GGUF type '{qtype}'; use auto or one of {', '.join(QTYPES)}")
    if float_type not in FLOAT_TYPES:
        raise UserError(f"float type must be one of {FLOAT_TYPES}, got '{float_type}'")
    embed_type = (embed_type or float_type).lower()
    if embed_type not in EMBED_TYPES:
        raise UserError(f"embedding type must be one of {EMBED_TYPES}, got '{embed_type}'")
    out = Path(out_file)
    check_output(out, overwrite)
    gguf = _gguf()
    src = Path(src)
    ckpt, widths, config, tensors, tok_dir = _source(src, bits, bits_config)
    hp = _hparams(config)
    if ckpt is None and qtype != "auto":
        raise UserError(f"{src} is not quantized: matgptq writes it as {float_type.upper()}; quantize it first or use "
                        "llama.cpp's quantizer on the exported file")  # fmt: skip

    report_warnings: list[str] = []

    def warn(msg: str) -> None:
        report_warnings.append(msg)
        warnings.warn(msg, GGUFExportWarning, stacklevel=3)

    entries: list[tuple[TensorExport, np.ndarray, np.ndarray | None]] = []  # (report row, data, row permutation)

    def add(g: str, hf: str, data: np.ndarray, typ: str, method: str, bits: int | None, ref: np.ndarray,
            perm: np.ndarray | None, note: str = "") -> None:  # fmt: skip
        """Measure the stored tensor against `ref` through gguf-py's dequantizer (before the Q/K row permutation)."""
        back = gguf.quants.dequantize(np.ascontiguousarray(data), getattr(gguf.GGMLQuantizationType, typ.upper()))
        err = float(np.abs(back.reshape(ref.shape).astype(np.float64) - ref).max(initial=0.0))
        top = float(np.abs(ref).max(initial=0.0))
        rel = err / top if top else 0.0
        row = TensorExport(g, hf, typ.upper(), tuple(ref.shape), bits, method, err == 0.0, err, rel, note)
        entries.append((row, data, perm))

    perms = {"self_attn.q_proj": hp["n_head"], "self_attn.k_proj": hp["n_head_kv"]}
    layer_of = {f"{n}.weight": n for n in widths}
    for hf in list(tensors) + list(layer_of):
        g = gguf_tensor_name(hf)
        if g is None:
            raise UserError(f"{src}: tensor {hf} has no GGUF name in the Llama layout; is this a plain Llama model?")
        if hf == "lm_head.weight" and hp["tied"]:
            continue
        m = re.fullmatch(r"model\.layers\.\d+\.(self_attn\.[qk]_proj)\.(weight|bias)", hf)
        perm = None
        if m:
            rows = ckpt.layers[layer_of[hf]].shape[0] if hf in layer_of else tensors[hf].shape[0]
            perm = llama_qk_permutation(rows, perms[m.group(1)])
        if hf in layer_of:
            lname = layer_of[hf]
            q = ckpt.layers[lname].slice(widths[lname])
            ref = q.dequantize(torch.float32).numpy()
            enc = _encode_layer(lname, q, ref, qtype, float_type)
            if enc.method != "codes" or (qtype != "auto" and enc.ggml_type != qtype):
                warn(f"{lname} ({widths[lname]}-bit) written as {enc.ggml_type.upper()}: {enc.note}")
            add(g, hf, enc.data, enc.ggml_type, enc.method, widths[lname], ref, perm, enc.note)
            continue
        t = tensors[hf].detach().float().numpy()
        if t.ndim == 1:
            add(g, hf, t.astype(np.float32), "f32", "float", None, t, perm)
        elif g in ("token_embd.weight", "output.weight"):
            data = _requantize(t, "q8_0") if embed_type == "q8_0" else _float_encode(t, embed_type)
            add(g, hf, data, embed_type, "float" if embed_type in FLOAT_TYPES else "requantized", None, t, perm)
        else:  # an unquantized 2-D weight (unquantized source model)
            add(g, hf, _float_encode(t, float_type), float_type, "float", None, t, perm)

    entries.sort(key=lambda e: _order(e[0].name))
    counts: dict[str, int] = {}
    for row, _, _ in entries:
        if row.bits is not None:
            counts[row.ggml_type.lower()] = counts.get(row.ggml_type.lower(), 0) + int(np.prod(row.shape))
    file_type = max(counts, key=counts.get) if counts else float_type

    report = GGUFExport(out, file_type, 0, [row for row, _, _ in entries], report_warnings)
    with atomic_output(out, overwrite, directory=False) as tmp:
        writer = gguf.GGUFWriter(str(tmp), "llama")
        extra = _add_metadata(writer, hp, src.name)
        writer.add_file_type(_FILE_TYPES[file_type])
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        from .._version import __version__

        writer.add_string("general.quantized_by", f"matgptq {__version__}")
        if widths:
            writer.add_string("matgptq.layer_bits", json.dumps(widths))
        gguf_log = logging.getLogger("gguf")
        level = gguf_log.level
        gguf_log.setLevel(logging.ERROR)  # SpecialVocab's notes on unused template tokens
        try:
            _add_vocab(writer, Path(tok_dir), hp["n_vocab"], warn)
        finally:
            gguf_log.setLevel(level)
        for g, arr in extra:
            writer.add_tensor(g, arr)
            report.tensors.insert(0, TensorExport(g, "(rope scaling)", "F32", arr.shape, None, "float", True, 0.0, 0.0))
        for row, data, perm in entries:
            stored = np.ascontiguousarray(data if perm is None else data[perm])
            if row.ggml_type in ("F32", "F16"):
                writer.add_tensor(row.name, stored)
            else:
                writer.add_tensor(row.name, stored, raw_dtype=getattr(gguf.GGMLQuantizationType, row.ggml_type))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    report.size_bytes = out.stat().st_size
    return report


def export_gguf_cli(args) -> None:
    """`matgptq export SRC --format gguf ...`: export and print the per-tensor report."""
    import sys

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GGUFExportWarning)  # the report lists them
        rep = export_gguf(args.src, args.out, bits=args.bits, bits_config=args.bits_config, qtype=args.type,
                          overwrite=args.overwrite, float_type=getattr(args, "float_type", None) or "f32",
                          embed_type=getattr(args, "embed_type", None))  # fmt: skip
    print(rep.table())
    for w in rep.warnings:
        print(f"warning: {w}", file=sys.stderr)
    exact = sum(t.exact for t in rep.tensors)
    print(f"wrote {rep.path} ({rep.size_bytes / 2**20:.2f} MiB, mostly {rep.file_type.upper()}, types {rep.types()}): "
          f"{exact}/{len(rep.tensors)} tensors bit-exact, max |Δw| {rep.max_abs_err:.3g}")  # fmt: skip


# --- reading back (independent check through gguf-py) ---------------------------------------------------------------


def read_gguf_weights(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a Llama GGUF, dequantized by gguf-py, as float32 under its HF name and layout.

    The Q/K RoPE permutation is undone, so the arrays compare directly with the HF / matgptq weights.
    """
    gguf = _gguf()
    reader = gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.")}
    n_head = int(fields["llama.attention.head_count"])
    n_kv = int(fields.get("llama.attention.head_count_kv", n_head))
    hf_of = {v: k for k, v in _TOP_NAMES.items()}
    block_hf = {v: k for k, v in _BLOCK_NAMES.items()}
    out = {}
    for t in reader.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32).reshape(shape)
        m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", t.name)
        if m:
            name = f"model.layers.{m.group(1)}.{block_hf[m.group(2)]}.{m.group(3)}"
            if m.group(2) in ("attn_q", "attn_k"):
                w = w[np.argsort(llama_qk_permutation(w.shape[0], n_head if m.group(2) == "attn_q" else n_kv))]
        else:
            name = hf_of.get(t.name, t.name)
        out[name] = w
    return out
