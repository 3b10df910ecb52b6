"""GGUF export (llama.cpp) of a matgptq parent, slice or per-layer mix, keeping the integer codes.

The parts: arch.py names and orders the tensors (Llama, Mistral, Qwen2, Qwen3, Phi-3, OLMo 2, Granite, Gemma 2/3,
Qwen3-MoE, Mixtral), experts.py stacks fused experts into 3-D tensors, formats/gguf/tensors.py encodes each one
(which block type keeps a layer's codes), metadata.py (and metadata_arch.py) describes the model, vocab.py its
tokenizer; this module writes the file.

Metadata follows convert_hf_to_gguf.py (docs/formats.md §3.1), Llama's Q/K rows get its RoPE permutation (§3.3,
applied to whole encoded rows, which commutes with the row-wise blocks), norms are F32, embeddings/lm_head `embed_type`
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

from ..._version import __version__
from ...errors import UserError
from ...execution import format_table
from ...formats.gguf import (
    EMBED_TYPES,
    FILE_TYPES,
    FLOAT_TYPES,
    QTYPES,
    embed_type_for,
    encode_layer,
    float_encode,
    gguf_module,
    requantize,
)
from ...formats.mix import WidthSpec, width_spec
from ...fsutil import atomic_output, check_output
from ...models import load_fp_model
from ...runtime import open_checkpoint, resolve_bits
from ...untrusted import read_json
from .arch import ARCHITECTURES, llama_qk_permutation, tensor_order
from .experts import expert_tensors, hf_experts, join_experts, split_experts
from .metadata import add_metadata, hparams
from .metadata_arch import check_model
from .vocab import add_vocab

__all__ = ["export_gguf", "read_gguf_weights", "GGUFExport", "TensorExport", "GGUFExportWarning"]


class GGUFExportWarning(UserWarning):
    """A tensor could not be stored with its codes kept (re-quantized or written as float)."""


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
    nbytes: int = 0  # bytes of the stored tensor data


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
    def bits_per_weight(self) -> float:
        """Tensor data bits per stored weight, over every tensor: the BPW llama.cpp prints for a file."""
        weights = sum(int(np.prod(t.shape)) for t in self.tensors)
        return 8 * sum(t.nbytes for t in self.tensors) / weights if weights else 0.0

    @property
    def max_abs_err(self) -> float:
        return max((t.max_abs_err for t in self.tensors), default=0.0)

    def types(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.ggml_type] = out.get(t.ggml_type, 0) + 1
        return out

    def table(self) -> str:
        rows = [
            [t.name, t.ggml_type, t.bits, t.method, "yes" if t.exact else "no", t.max_abs_err, t.note]
            for t in self.tensors
        ]
        return format_table(["tensor", "type", "bits", "method", "exact", "max |Δw|", "note"], rows)

    def summary(self) -> str:
        """The table in a few lines: tensors per type, how many are exact, the largest |Δw| and where."""
        types = ", ".join(f"{n} {t}" for t, n in sorted(self.types().items(), key=lambda kv: (-kv[1], kv[0])))
        exact = sum(t.exact for t in self.tensors)
        worst = max(self.tensors, key=lambda t: t.max_abs_err, default=None)
        where = f" ({worst.name}, {worst.ggml_type})" if worst is not None and worst.max_abs_err > 0 else ""
        return (
            f"{len(self.tensors)} tensors: {types}\n"
            f"{exact}/{len(self.tensors)} tensors bit-exact, max |Δw| {self.max_abs_err:.3g}{where}"
        )

    def to_json(self) -> dict:
        d = asdict(self)
        d["path"] = str(self.path)
        d["exact"] = self.exact
        d["max_abs_err"] = self.max_abs_err
        return d


# --- export ---------------------------------------------------------------------------------------------------------


def _source(src: Path, bits, bits_config):
    """(checkpoint or None, {layer: bits}, config dict, {name: float tensor}, tokenizer dir)."""
    if not src.exists():
        raise UserError(f"{src} does not exist; give a matgptq checkpoint or a model directory")
    spec = width_spec(bits, bits_config)
    ckpt = open_checkpoint(src)
    if ckpt is None:
        if spec is not None:
            raise UserError(f"{src} is not quantized; --bits/--bits-config apply to quantized checkpoints only")
        model = load_fp_model(src, torch.float32)
        tensors, seen = {}, set()
        for k, t in model.state_dict().items():
            if t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            tensors[k] = t
        return None, {}, read_json(src / "config.json", "re-create the model directory"), tensors, src
    widths = resolve_bits(spec, ckpt)
    return ckpt, widths, ckpt.config, ckpt.tensors, ckpt.path


def _check_types(qtype: str, float_type: str, embed_type: str | None) -> tuple[str, str]:
    """(qtype, embed_type) normalised, or a UserError naming the choices."""
    qtype = qtype.lower()
    if qtype != "auto" and qtype not in QTYPES:
        raise UserError(f"unknown GGUF type '{qtype}'; use auto or one of {', '.join(QTYPES)}")
    if float_type not in FLOAT_TYPES:
        raise UserError(f"float type must be one of {FLOAT_TYPES}, got '{float_type}'")
    embed_type = (embed_type or float_type).lower()
    if embed_type not in EMBED_TYPES:
        raise UserError(f"embedding type must be one of {EMBED_TYPES}, got '{embed_type}'")
    return qtype, embed_type


Entry = tuple[TensorExport, np.ndarray, np.ndarray | None]  # (report row, stored data, Q/K row permutation)


def _measured(
    g: str,
    hf: str,
    data: np.ndarray,
    typ: str,
    method: str,
    bits: int | None,
    ref: np.ndarray,
    perm: np.ndarray | None,
    note: str = "",
) -> Entry:
    """The stored tensor measured against `ref` through gguf-py's dequantizer (before the Q/K row permutation)."""
    gguf = gguf_module()
    back = gguf.quants.dequantize(np.ascontiguousarray(data), getattr(gguf.GGMLQuantizationType, typ.upper()))
    err = float(np.abs(back.reshape(ref.shape).astype(np.float64) - ref).max(initial=0.0))
    top = float(np.abs(ref).max(initial=0.0))
    rel = err / top if top else 0.0
    row = TensorExport(
        g, hf, typ.upper(), tuple(ref.shape), bits, method, err == 0.0, err, rel, note, int(np.asarray(data).nbytes)
    )
    return row, data, perm


def _encode(
    hf: str,
    lname: str | None,
    g: str,
    perm,
    ckpt,
    widths: dict,
    tensors: dict,
    types: tuple[str, str, str],
    warn,
    arch=ARCHITECTURES["llama"],
) -> Entry:
    """One tensor's GGUF entry: quantized layer `lname`'s weight with its codes where a block type holds them, a norm
    as F32, the embeddings/output as `embed_type`, any other (unquantized source) weight as the float type."""
    qtype, float_type, embed_type = types
    if lname is not None:
        q = ckpt.layers[lname].slice(widths[lname])
        ref = q.dequantize(torch.float32).numpy()
        enc = encode_layer(lname, q, ref, qtype, float_type)
        if enc.method != "codes" or (qtype != "auto" and enc.ggml_type != qtype):
            warn(f"{lname} ({widths[lname]}-bit) written as {enc.ggml_type.upper()}: {enc.note}")
        return _measured(g, hf, enc.data, enc.ggml_type, enc.method, widths[lname], ref, perm, enc.note)
    t = tensors[hf].detach().float().numpy()
    if t.ndim == 1 or g.endswith("ffn_gate_inp.weight"):  # as the converter stores it (Gemma's norms: 1 + w; routers)
        t = arch.stored_norm(g, t)
        return _measured(g, hf, t.astype(np.float32), "f32", "float", None, t, perm)
    if g in ("token_embd.weight", "output.weight"):
        typ = embed_type
        if typ == "auto":
            typ = embed_type_for(t.shape[1], float_type) if ckpt is not None else float_type
        data = float_encode(t, typ) if typ in FLOAT_TYPES else requantize(t, typ)
        return _measured(g, hf, data, typ, "float" if typ in FLOAT_TYPES else "requantized", None, t, perm)
    return _measured(g, hf, float_encode(t, float_type), float_type, "float", None, t, perm)


def _entries(src: Path, ckpt, widths: dict, tensors: dict, hp: dict, types: tuple[str, str, str], warn) -> list[Entry]:
    """Every tensor of the file, encoded and measured, in convert_hf_to_gguf's order."""
    arch = hp["arch"]
    perms = {"self_attn.q_proj": hp["n_head"], "self_attn.k_proj": hp["n_head_kv"]}
    tensors, names, groups = split_experts(tensors, widths)
    layer_of = {f"{n}.weight": n for n in names}
    entries = _expert_entries(groups, ckpt, widths, types, warn)
    for hf in list(tensors) + list(layer_of):
        g = arch.tensor_name(hf)
        if g is None:
            raise UserError(
                f"{src}: tensor {hf} has no GGUF name in llama.cpp's {arch.name} layout; this variant of "
                "the architecture is not supported"
            )
        if (hf == "lm_head.weight" and hp["tied"]) or hf in arch.drop:
            continue
        m = re.fullmatch(r"model\.layers\.\d+\.(self_attn\.[qk]_proj)\.(weight|bias)", hf)
        perm = None
        if m and arch.permute_qk:
            rows = ckpt.layers[layer_of[hf]].shape[0] if hf in layer_of else tensors[hf].shape[0]
            perm = llama_qk_permutation(rows, perms[m.group(1)])
        entries.append(_encode(hf, layer_of.get(hf), g, perm, ckpt, widths, tensors, types, warn, arch))
    return sorted(entries, key=lambda e: tensor_order(e[0].name))


def _expert_entries(groups, ckpt, widths: dict, types: tuple[str, str, str], warn) -> list[Entry]:
    """The 3-D expert tensors of each fused projection (experts.py), measured as any other tensor."""
    entries = []
    for grp in groups:
        for suffix, data, typ, method, bits, ref, note in expert_tensors(grp, ckpt, widths, types[0], types[1], warn):
            entries.append(
                _measured(
                    f"blk.{grp.block}.{suffix}.weight", f"{grp.hf} ({suffix})", data, typ, method, bits, ref, None, note
                )
            )
    return entries


def _file_type(entries: list[Entry], float_type: str) -> str:
    """The type holding most quantized weights (llama.cpp's `general.file_type`), else the float type."""
    counts: dict[str, int] = {}
    for row, _, _ in entries:
        if row.bits is not None:
            counts[row.ggml_type.lower()] = counts.get(row.ggml_type.lower(), 0) + int(np.prod(row.shape))
    return max(counts, key=counts.get) if counts else float_type


def _write(
    path: Path, report: GGUFExport, entries: list[Entry], hp: dict, name: str, widths: dict, tok_dir, warn
) -> None:
    """The GGUF file: metadata, tokenizer, then every tensor (Q/K rows permuted as llama.cpp expects)."""
    gguf = gguf_module()
    writer = gguf.GGUFWriter(str(path), hp["arch"].name)
    extra = add_metadata(writer, hp, name)
    writer.add_file_type(FILE_TYPES[report.file_type])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_string("general.quantized_by", f"matgptq {__version__}")
    if widths:
        writer.add_string("matgptq.layer_bits", json.dumps(widths))
    gguf_log = logging.getLogger("gguf")
    level = gguf_log.level
    gguf_log.setLevel(logging.ERROR)  # SpecialVocab's notes on unused template tokens
    try:
        add_vocab(writer, Path(tok_dir), hp["n_vocab"], warn)
    finally:
        gguf_log.setLevel(level)
    for g, arr in extra:
        writer.add_tensor(g, arr)
        report.tensors.insert(
            0, TensorExport(g, "(rope scaling)", "F32", arr.shape, None, "float", True, 0.0, 0.0, nbytes=arr.nbytes)
        )
    for row, data, perm in entries:
        stored = np.ascontiguousarray(data if perm is None else data[perm])
        if row.ggml_type in ("F32", "F16"):
            writer.add_tensor(row.name, stored)
        else:
            writer.add_tensor(row.name, stored, raw_dtype=getattr(gguf.GGMLQuantizationType, row.ggml_type))
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:  # also when the disk fills: the file is closed before its temporary directory is removed
        writer.close()


def export_gguf(
    src: str | Path,
    out_file: str | Path,
    bits: int | None = None,
    bits_config: WidthSpec | None = None,
    qtype: str = "auto",
    overwrite: bool = False,
    *,
    float_type: str = "f32",
    embed_type: str | None = None,
) -> GGUFExport:
    """Write `src` (a matgptq parent/slice, GPTQ checkpoint or unquantized model) as one GGUF file for llama.cpp.

    bits / bits_config: the slice width for all layers, or a {layer: bits} mix (JSON file or dict, "*" = default).
    qtype: "auto" (per layer, the smallest exact type; see the module doc) or one of QTYPES for every layer.
    float_type: "f32" (exact) or "f16" for tensors no block type holds; embed_type: token_embd/output type
    ("f32", "f16", or "q8_0"/"q6_k" re-quantized as llama.cpp's quantizer does; "auto": llama.cpp's preset rule,
    formats/gguf/tensors.embed_type_for, for quantized sources; default float_type: every tensor exact).
    """
    qtype, embed_type = _check_types(qtype, float_type, embed_type)
    out = Path(out_file)
    check_output(out, overwrite)
    gguf_module()
    src = Path(src)
    ckpt, widths, config, tensors, tok_dir = _source(src, bits, bits_config)
    hp = hparams(config)
    check_model(hp, tok_dir)
    if ckpt is None and qtype != "auto":
        raise UserError(
            f"{src} is not quantized: matgptq writes it as {float_type.upper()}; quantize it first or use "
            "llama.cpp's quantizer on the exported file"
        )
    report_warnings: list[str] = []

    def warn(msg: str) -> None:
        report_warnings.append(msg)
        warnings.warn(msg, GGUFExportWarning, stacklevel=5)  # the caller of export_gguf

    entries = _entries(src, ckpt, widths, tensors, hp, (qtype, float_type, embed_type), warn)
    report = GGUFExport(out, _file_type(entries, float_type), 0, [row for row, _, _ in entries], report_warnings)
    with atomic_output(out, overwrite, directory=False) as tmp:
        _write(tmp, report, entries, hp, src.name, widths, tok_dir, warn)
    report.size_bytes = out.stat().st_size
    return report


# --- reading back (independent check through gguf-py) ---------------------------------------------------------------


def read_gguf_weights(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF written for one of arch.py's architectures, dequantized by gguf-py, as float32
    under its HF name and layout (the Llama Q/K RoPE permutation undone), to compare with the HF / matgptq weights;
    3-D expert tensors as one [out, in] weight per expert, `model.layers.<i>.mlp.experts.<e>.<projection>.weight`."""
    gguf = gguf_module()
    reader = gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.")}
    name = fields["general.architecture"]
    moe = f"{name}.expert_count" in fields  # Mixtral is `llama` with experts
    arch = next(a for a in ARCHITECTURES.values() if a.name == name and moe == ("mlp.gate" in a.block_names))
    n_head = int(fields[f"{name}.attention.head_count"])
    n_kv = int(fields.get(f"{name}.attention.head_count_kv", n_head))
    out, experts = {}, {}
    for t in reader.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32).reshape(shape)
        if (found := hf_experts(t.name)) is not None:  # [E, rows, cols]: per expert, under its layer's name
            experts.setdefault(found[:2], {})[found[2]] = w
            continue
        m = re.fullmatch(r"blk\.\d+\.(attn_q|attn_k)\.(weight|bias)", t.name)
        if m and arch.permute_qk:
            w = w[np.argsort(llama_qk_permutation(w.shape[0], n_head if m.group(1) == "attn_q" else n_kv))]
        if arch.norm_shift and t.name.endswith("norm.weight"):  # Gemma's 1 + w (not bit-exact: w's low bits)
            w = w - np.float32(arch.norm_shift)
        out[arch.hf_name(t.name)] = w
    return {**out, **join_experts(experts)}
