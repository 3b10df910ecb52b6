"""A GGUF file for llama.cpp written through gguf-py's GGUFWriter (write_gguf), and read back through its GGUFReader
and dequantizer under the Hugging Face names (read_gguf_weights), the independent check of every export.

What the file holds (docs/formats.md §3): the metadata convert_hf_to_gguf.py writes (metadata.py, §3.1), the
tokenizer (vocab.py), `general.quantized_by` and, for a per-layer mix, `matgptq.layer_bits`; then the extra tensors
the metadata asks for (RoPE factors) and every tensor as encoded (tensors.py, experts.py), in convert_hf_to_gguf's
order (arch.py), Llama's Q/K rows in its RoPE permutation (§3.3, applied to whole encoded rows, which commutes with
the row-wise blocks).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np

from ..._version import __version__
from .arch import ARCHITECTURES, llama_qk_permutation
from .experts import hf_experts, join_experts
from .metadata import add_metadata
from .types import FILE_TYPES, gguf_module
from .vocab import add_vocab

Tensor = tuple[str, str, np.ndarray, np.ndarray | None]  # (GGUF name, ggml type, stored data, Q/K row permutation)


def write_gguf(
    path: Path, hp: dict, name: str, file_type: str, widths: dict, tok_dir, tensors: list[Tensor], warn
) -> list[tuple[str, np.ndarray]]:
    """The GGUF file `path` of the model `hp` (metadata.hparams) named `name`: metadata, tokenizer, then the extra
    tensors and `tensors` (Q/K rows permuted as llama.cpp expects). The extra tensors (GGUF name, F32 data)."""
    gguf = gguf_module()
    writer = gguf.GGUFWriter(str(path), hp["arch"].name)
    extra = add_metadata(writer, hp, name)
    writer.add_file_type(FILE_TYPES[file_type])
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
    for g, ggml_type, data, perm in tensors:
        stored = np.ascontiguousarray(data if perm is None else data[perm])
        if ggml_type in ("F32", "F16"):
            writer.add_tensor(g, stored)
        else:
            writer.add_tensor(g, stored, raw_dtype=getattr(gguf.GGMLQuantizationType, ggml_type))
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:  # also when the disk fills: the file is closed before its temporary directory is removed
        writer.close()
    return extra


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
