"""GGUF export (llama.cpp) of a matgptq parent, slice or per-layer mix, keeping the integer codes: the source's
tensors, each encoded and measured, and the report. The format's parts are formats/gguf/'s: arch.py names and
orders the tensors (Llama, Mistral, Qwen2, Qwen3, Phi-3, OLMo 2, Granite, Gemma 2/3, Qwen3-MoE, Mixtral), experts.py
stacks fused experts into 3-D tensors, tensors.py encodes each one (which block type keeps a layer's codes),
metadata.py (and metadata_arch.py) describes the model, vocab.py its tokenizer, writer.py writes the file.

Metadata follows convert_hf_to_gguf.py (docs/formats.md §3.1), Llama's Q/K rows get its RoPE permutation (§3.3),
norms are F32, embeddings/lm_head `embed_type` (default `float_type` = F32). The file is written atomically and every
tensor is read back through gguf-py's dequantizer to measure max |Δw| against matgptq's dequantized weight for the
report (report.py).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import torch

from ...errors import UserError
from ...formats.gguf import (
    ARCHITECTURES,
    EMBED_TYPES,
    FLOAT_TYPES,
    QTYPES,
    embed_type_for,
    encode_layer,
    float_encode,
    gguf_module,
    llama_qk_permutation,
    requantize,
    write_gguf,
)
from ...formats.gguf.arch import tensor_order
from ...formats.gguf.experts import expert_tensors, split_experts
from ...formats.gguf.metadata import hparams
from ...formats.gguf.metadata_arch import check_model
from ...formats.mix import WidthSpec, width_spec
from ...fsutil import atomic_output, check_output
from ...models import load_fp_model
from ...runtime import open_checkpoint, resolve_bits
from ...untrusted import read_json
from ..tested import GPTQMODEL
from .report import GGUFExport, GGUFExportWarning, TensorExport

__all__ = ["export_gguf", "GGUFExport", "TensorExport", "GGUFExportWarning"]

# model types whose GGUF export is refused with a reason and an alternative (before formats/gguf/arch.py's gguf_arch)
REFUSED = {
    "gpt_oss": "GGUF export of gpt_oss is not supported: its llama.cpp graph (attention sinks, biased and "
    "clamped SwiGLU experts with interleaved gate/up rows) is not mapped or tested here; use export "
    f"--format gptq_v1/gptq_v2 ({GPTQMODEL} and matgptq.load run it)"
}


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
    if config.get("model_type") in REFUSED:
        raise UserError(REFUSED[config["model_type"]])
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
    stored = [(row.name, row.ggml_type, data, perm) for row, data, perm in entries]
    with atomic_output(out, overwrite, directory=False) as tmp:
        extra = write_gguf(tmp, hp, src.name, report.file_type, widths, tok_dir, stored, warn)
    for g, arr in extra:
        report.tensors.insert(
            0, TensorExport(g, "(rope scaling)", "F32", arr.shape, None, "float", True, 0.0, 0.0, nbytes=arr.nbytes)
        )
    report.size_bytes = out.stat().st_size
    return report
