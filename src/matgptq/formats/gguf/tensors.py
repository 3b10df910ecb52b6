"""Weights → GGUF tensors: which block type holds a quantized layer with its integer codes kept, and its bytes.

A quantized layer at r bits is W = D·(c − Z) with D = scale·2^shift (an fp16 value: ×2^k is exact) and
Z = zero / 2^shift (docs/formats.md §2.8). A GGUF block type holds it *with the codes kept* when every GGUF block (32
columns; 16 for the sub-scales of K-quants) lies inside one quantization group, and (docs/formats.md §3.6):

- offset types, w = d·(n − o): Q4_0 (o = 8), Q5_0 (16), Q8_0 (128, stored as int8 n − 128), Q3_K (4), Q6_K (32):
  n = c + o − Z must be an integer in the type's code range for every code 0..2^r − 1, and d = D (or, per block,
  mirrored: n = o + Z − c, d = −D, which holds a grid [−7s, 8s] or a negative scale).
- min types, w = d·n + m: Q4_1, Q5_1 (n = c, d = D, m = −D·Z rounded to fp16: the only error, ≤ 2^-11·|m|) and
  Q2_K, Q4_K, Q5_K (sub-scale D, sub-min D·Z).

Legacy types are bit-exact. K-quants store each sub-block's D as fp32(d)·sc, one fp16 d per 256 columns and a small
integer sc (and the min likewise): exact when a super-block's scales are equal (per channel) or lie on the K-quant
lattice (`quantize --kquant`, quantization/algorithm/kquant_scales.py; formats/gguf/blocks.py finds the exact d), otherwise D
is rounded onto that grid and the error is measured and reported.

`auto` takes, per layer, the smallest of Q2_K, Q3_K, Q4_0, Q4_K, Q4_1, Q5_0, Q5_K, Q5_1, Q6_K, Q8_0 that keeps the
codes and is exact, accepting for Q4_1/Q5_1 the fp16 rounding of the offset (so asymmetric 4/5-bit layers become
Q4_1/Q5_1 at 5.0/6.0 bits per weight rather than the exact Q8_0 at 8.5). Symmetric 2/3/4-bit → Q4_0 (Q2_K/Q3_K on
the lattice or per channel), 5 → Q5_0, 6 → Q8_0 (Q6_K on the lattice or per channel), 8 → Q8_0, all bit-exact.

Layers no block type can hold with their codes (act-order without static groups, so a 32-block mixes groups; group
sizes that are not a multiple of 32 (16 for K-quants)) are **re-quantized to Q8_0 from the dequantized weights**
with a warning (error ≤ half a Q8_0 step, reported); layers whose in_features is not a multiple of 32 (e.g. 172)
cannot be blocked at all and are written as float (`float_type`, F32 = exact) with a warning, as llama.cpp's own
quantizer does (it falls back to F16). An explicit `qtype` that cannot hold a layer's codes (too many bits, an
asymmetric grid on a symmetric type) is a UserError; a shape/group mismatch falls back as `auto` would, with a warning.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ...errors import UserError
from . import blocks as gb
from .quantize import quantize_q6_k
from .types import QTYPES, BlockType, gguf_module

_OFFSET_ROUNDED_OK = {"q4_1", "q5_1"}  # auto accepts fp16 rounding of their block offset m


def embed_type_for(cols: int, float_type: str) -> str:
    """llama.cpp's type for the output matrix (and a tied token_embd) in its Q4_0/Q4_K_M/Q3_K_M/… presets
    (llama-quant.cpp llama_tensor_get_type): Q6_K, or Q8_0 when a row is not a multiple of 256 (e.g. 576);
    the float type when not even Q8_0's 32 divides it. Used here for token_embd and output alike."""
    return "q6_k" if cols % 256 == 0 else "q8_0" if cols % 32 == 0 else float_type


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
        raise _NoFit(
            "groups",
            f"quantization groups are not aligned to {what} blocks of {block} columns "
            "(act-order without static groups, or a group size that is not a multiple of "
            f"{block})",
        )
    return _Layer(q.codes.numpy().astype(np.int16), q.bits, dd[..., 0], zz[..., 0])


def _encode_codes(q, spec: BlockType) -> tuple[np.ndarray, float]:
    """Bytes [N, row_bytes] of `q` in `spec` keeping the codes, and the predicted max |Δw| (0 = exact)."""
    n, k = q.shape
    if k % spec.row:
        raise _NoFit("shape", f"in_features {k} is not a multiple of {spec.row} ({spec.name.upper()})")
    lay = _block_view(q, spec.block, spec.name.upper())
    top = (1 << lay.bits) - 1
    if spec.offset is not None:
        if not np.array_equal(lay.z, np.round(lay.z)):
            raise _NoFit(
                "codes",
                f"its zero point is not an integer at {lay.bits} bits (an asymmetric slice); "
                f"{spec.name.upper()} has a fixed offset",
            )
        # per block, n = c + o − Z with d = D, or mirrored n = o + Z − c with d = −D (w = d·(n − o) either way;
        # e.g. a grid [−7s, 8s], zero 7, is Q4_0 with d = −s): take the first that keeps n in the code range
        hi = (1 << spec.bits) - 1
        up = (spec.offset - lay.z >= 0) & (spec.offset - lay.z + top <= hi)
        down = (spec.offset + lay.z - top >= 0) & (spec.offset + lay.z <= hi)
        if not (up | down).all():
            raise _NoFit(
                "codes",
                f"{lay.bits}-bit codes with these zero points do not fit {spec.name.upper()}'s "
                f"{spec.bits}-bit codes around {spec.offset}",
            )
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
    if spec.kquant:  # w = d·sc·c − dmin·m_j: sub-scale D, sub-min D·Z
        enc = {"q2_k": gb.encode_q2_k, "q4_k": gb.encode_q4_k, "q5_k": gb.encode_q5_k}[spec.name]
        res = enc(lay.codes.astype(np.uint8), lay.d.astype(np.float64), -m)
        return res.data, res.max_error
    m16 = m.astype(np.float16)
    if not np.isfinite(m16).all():
        raise _NoFit("scale", "the block offset −scale·zero does not fit float16")
    err = float(np.abs(m16.astype(np.float64) - m).max(initial=0.0))
    enc = gb.encode_q4_1 if spec.name == "q4_1" else gb.encode_q5_1
    return enc(lay.codes.astype(np.uint8), lay.d, m16), err


@dataclass
class _Encoded:
    data: np.ndarray  # uint8 [N, row_bytes] or float [N, K]
    ggml_type: str  # "q4_0", ..., "f32", "f16"
    method: str
    note: str = ""


def float_encode(w: np.ndarray, ftype: str) -> np.ndarray:
    return w.astype(np.float32 if ftype == "f32" else np.float16)


def requantize(w: np.ndarray, qname: str) -> np.ndarray:
    """A float tensor in a block type as llama.cpp's quantizer makes it: gguf-py's ports of the legacy types, and
    formats/gguf/quantize.py for Q6_K (gguf-py has no K-quant quantizer); both byte-equal to llama.cpp's (tested)."""
    if qname == "q6_k":
        return quantize_q6_k(w)
    gguf = gguf_module()
    return gguf.quants.quantize(np.ascontiguousarray(w, dtype=np.float32), QTYPES[qname].ggml)


PROBE_ROWS = 8  # auto rejects a K-quant from this many rows first (the exact-d search costs time on every row)


def _rows(q, n: int):
    return replace(q, codes=q.codes[:n], scales=q.scales[:n], zeros=q.zeros[:n])


def _auto(q) -> tuple[_Encoded | None, dict[str, str]]:
    """Smallest codes-keeping type that is exact (or Q4_1/Q5_1 with rounded offsets); reasons for the rest."""
    reasons = {}
    for spec in QTYPES.values():
        try:
            if spec.kquant and q.shape[0] > PROBE_ROWS and _encode_codes(_rows(q, PROBE_ROWS), spec)[1]:
                data, err = None, 1.0  # a few rows already off the lattice: the whole layer cannot be exact
            else:
                data, err = _encode_codes(q, spec)
        except _NoFit as e:
            reasons[spec.name] = f"{spec.name.upper()}: {e.reason}"
            continue
        if err == 0.0 or spec.name in _OFFSET_ROUNDED_OK:
            return _Encoded(data, spec.name, "codes", "offset m rounded to fp16" if err else ""), reasons
        reasons[spec.name] = f"{spec.name.upper()}: scales not on its super-block lattice (quantize with --kquant)"
    return None, reasons


def auto_type(q, float_type: str = "f32") -> str:
    """The type `--type auto` writes quantized weight `q` in: the codes-keeping type `_auto` finds, else
    `_fallback_type`'s."""
    enc, _ = _auto(q)
    return enc.ggml_type if enc is not None else _fallback_type(q.shape[1], float_type)


def tensor_bits(ggml_type: str, rows: int, cols: int) -> int:
    """Bits of a rows × cols tensor in `ggml_type` (gguf-py's GGML_QUANT_SIZES: weights and bytes per block)."""
    gguf = gguf_module()
    block, nbytes = gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, ggml_type.upper())]
    if cols % block:
        raise ValueError(f"{cols} columns are not whole {ggml_type.upper()} blocks of {block}")
    return 8 * rows * (cols // block) * nbytes


def _fallback_type(cols: int, float_type: str) -> str:
    """A layer no type holds with its codes: Q8_0 re-quantized from floats, or the float type when not even 32 divides
    in_features."""
    return "q8_0" if cols % 32 == 0 else float_type


def _fallback(q, w: np.ndarray, float_type: str, why: str) -> _Encoded:
    if _fallback_type(q.shape[1], float_type) == "q8_0":
        return _Encoded(requantize(w, "q8_0"), "q8_0", "requantized", f"re-quantized from floats: {why}")
    return _Encoded(float_encode(w, float_type), float_type, "float", f"no block type fits: {why}")


def encode_layer(name: str, q, w: np.ndarray, qtype: str, float_type: str) -> _Encoded:
    """`q` in `qtype` (or auto), keeping its codes where a type can; `w` = q's dequantized weight (for fallbacks)."""
    if qtype == "auto":
        enc, reasons = _auto(q)
        if enc is not None:
            return enc
        legacy = [r for name, r in reasons.items() if not QTYPES[name].kquant]  # K-quants only add "not 256"
        why = next((r for r in legacy if "groups" in r), None) or next(
            (r for r in legacy if "multiple" in r), legacy[-1]
        )
        return _fallback(q, w, float_type, why)
    spec = QTYPES[qtype]
    try:
        data, err = _encode_codes(q, spec)
        return _Encoded(
            data,
            qtype,
            "codes",
            ""
            if err == 0
            else ("offset m rounded to fp16" if not spec.kquant else "sub-scales rounded onto the K-quant grid"),
        )
    except _NoFit as e:
        if e.kind in ("codes", "scale"):
            raise UserError(
                f"{name}: {qtype.upper()} cannot hold this layer ({e.reason}); use --type auto or a "
                "wider type (q8_0 holds every symmetric width)"
            ) from None
        why = f"{qtype.upper()}: {e.reason}"
    enc, _ = _auto(q)  # shape/group mismatch: the nearest type that still keeps the codes, as llama.cpp falls back
    if enc is not None:
        enc.note = f"fallback from {qtype.upper()} ({why})" + (f"; {enc.note}" if enc.note else "")
        return enc
    return _fallback(q, w, float_type, why)
