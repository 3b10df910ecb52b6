"""GPTQ export (v1 "gptq" and v2 "gptq_v2") of matgptq parents, slices and per-layer mixes: which layers at which
width, the settings recorded, the warnings; the bytes (tensors per layer, config, files) are formats/gptq/writer.py's,
read back by formats/gptq/reader.py (docs/formats.md §2). Which readers run a written file: exporters/readers.py.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from ..errors import UserError
from ..formats.gptq import (
    V1,
    V2,
    check_moe,
    gptq_widths,
    layer_tensors,
    quantization_config,
    save_gptq,
    split_biases,
    split_layer,
    trivial_g_idx,
)
from ..models.fused import fused_groups, fused_name
from ..quantization import GPTQConfig, MethodConfig, config_from_json
from .source import quantized_source

FORMATS = {"gptq_v1": V1, "gptq_v2": V2}  # CLI name -> checkpoint_format


def _solver(cfg: MethodConfig) -> dict:
    """The solver's settings a GPTQ config records, where the method has them."""
    extra = {k: getattr(cfg, k) for k in ("true_sequential", "static_groups") if hasattr(cfg, k)}
    extra["damp_percent"] = getattr(cfg, "damp", GPTQConfig.damp)
    return extra


def _warn_padded(padded: dict[str, tuple[int, int, int]]) -> None:
    name, (r, n, k) = next(iter(padded.items()))
    warnings.warn(
        f"{len(padded)} layer(s) have features that do not fill whole int32 words (e.g. {name}: {n} out × {k} in "
        f"at {r} bits) and are zero-padded as GPTQModel pads them. GPTQModel's generic torch kernel reads them "
        '(backend=BACKEND.GPTQ_TORCH; in transformers: GPTQConfig(bits=..., backend="gptq_torch")); kernels '
        "that need multiples of 16-128 do not (transformers' default 4-bit CPU kernel, ExLlama/Triton/Machete on "
        "GPU)",
        stacklevel=3,
    )


def export_gptq(src, out, fmt: str, bits: int | None = None, bits_config=None, overwrite: bool = False) -> Path:
    """Write the (sliced) checkpoint `src` as a GPTQ directory `out`; fmt is "gptq_v1" or "gptq_v2"."""
    if fmt not in FORMATS:
        raise UserError(f"unknown GPTQ format {fmt!r}; use one of {sorted(FORMATS)}")
    ckpt, widths = quantized_source(src, out, bits, bits_config, overwrite)
    check_moe(src, ckpt.config.get("model_type"), widths)
    qmeta = ckpt.meta.get("quantization") or {}
    if "group_size" not in qmeta:
        raise UserError(f"{src} does not record its group size (matgptq.json quantization.group_size); re-quantize it")
    cfg = config_from_json(qmeta)
    if cfg.skip:
        raise UserError(
            f"{src} leaves block Linears unquantized (--skip {' '.join(cfg.skip)}); GPTQ loaders expect every "
            "block Linear quantized: re-quantize without --skip, or use --format gguf"
        )
    group_size = cfg.group_size
    tensors = split_biases({k: v.contiguous() for k, v in ckpt.tensors.items()})  # experts: formats/gptq/experts.py
    all_sym, desc_act, padded = True, False, {}
    for name, r in widths.items():
        for part, q in split_layer(name, ckpt.layers[name].slice(r)).items():
            layer, sym, pad = layer_tensors(part, q, v1=fmt == "gptq_v1")
            all_sym &= sym
            if pad:
                padded[part] = (r, *q.shape)
            desc_act |= not torch.equal(layer["g_idx"], trivial_g_idx(q.shape[1], group_size))
            tensors.update({f"{part}.{k}": v for k, v in layer.items()})
    layer_widths = gptq_widths(widths)
    groups = fused_groups(ckpt.config, layer_widths) if len(set(layer_widths.values())) > 1 else []
    groups = [(fused_name(g), g) for g in groups]
    qc = quantization_config(FORMATS[fmt], layer_widths, group_size, desc_act, all_sym, _solver(cfg), groups)
    if padded:
        _warn_padded(padded)
    return save_gptq(out, tensors, ckpt.config, qc, ckpt.path, overwrite)
