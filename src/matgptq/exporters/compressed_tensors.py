"""compressed-tensors export (`pack-quantized`, docs/formats.md §5) of matgptq parents, slices and per-layer mixes:
which layers at which width, the `ignore` list (the model's other Linears, the routers of its experts), the
warnings; the bytes (packing, each layer's tensors, the config, the files) are formats/compressed_tensors/'s, read
back by its reader. Which readers run a written file: exporters/readers.py.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from ..formats.compressed_tensors import (
    CtLayer,
    CtMoE,
    Groups,
    ct_layer,
    ct_moe,
    quantization_config,
    save_compressed_tensors,
)
from ..quantization import config_from_json
from .source import quantized_source


def routers(model: torch.nn.Module) -> list[str]:
    """The routers of `model`'s experts modules (a sibling module whose weight has one row per expert), in module
    order: float, and listed in `ignore` as llm-compressor lists them."""
    found = []
    for name, module in model.named_modules():
        fused = [p for p in module.parameters(recurse=False) if p.ndim == 3]
        parent, _, own = name.rpartition(".")
        if not fused or not parent:
            continue
        for child, sibling in model.get_submodule(parent).named_children():
            weight = getattr(sibling, "weight", None)
            if child != own and isinstance(weight, torch.Tensor) and weight.shape[0] == fused[0].shape[0]:
                found.append(f"{parent}.{child}")
    return found


def other_linears(config: dict, quantized: set[str], moe: CtMoE | None = None, float_experts=()) -> list[str]:
    """The model's Linear modules that are not quantized (lm_head, --skip layers), in module order: `ignore`; with
    experts (`moe`), also their routers and the float per-expert Linears `float_experts`, under their file names."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    float_modules = set(routers(model)) if moe else set()
    names = []
    for n, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and n not in quantized or n in float_modules:
            names.append(n)
        names += [e for e in float_experts if e.rpartition(".")[0].rpartition(".")[0] == n]  # <n>.<e>.<proj>
    names = moe.aliases([moe.file_name(n) for n in names]) if moe else names
    return names or ["lm_head"]


def _warn_ragged(ragged: dict[str, CtLayer]) -> None:
    name, layer = next(iter(ragged.items()))
    warnings.warn(
        f"{len(ragged)} layer(s) have {layer.ragged_from}-column groups that do not tile their rows (e.g. {name}: "
        f"{layer.codes.shape[1]} columns); they are written exactly with group size {layer.group_size} (each scale "
        f"repeated {layer.ragged_from // layer.group_size}×)",
        stacklevel=3,
    )


def export_compressed_tensors(src, out, bits: int | None = None, bits_config=None, overwrite: bool = False) -> Path:
    """Write the (sliced) checkpoint `src` as a compressed-tensors `pack-quantized` directory `out`."""
    ckpt, widths = quantized_source(src, out, bits, bits_config, overwrite)
    moe = ct_moe(src, ckpt.config.get("model_type"), widths)  # None without fused experts
    tensors = {k: v.contiguous() for k, v in ckpt.tensors.items()}
    float_experts: list[str] = []
    if moe is not None:
        tensors, float_experts = moe.tensors(tensors, widths)
    groups: Groups = {}
    ragged = {}
    record = ckpt.meta.get("quantization") or {}
    cfg = config_from_json(record)
    group_size = cfg.group_size if "group_size" in record else None  # None: each layer's own (ct_layer)
    for name, r in widths.items():
        q = ckpt.layers[name].slice(r)
        for part, w in (moe.layers(name, q) if moe else {name: q}).items():  # experts: per-expert gate/up/down
            layer = ct_layer(part, w, group_size)
            groups.setdefault(layer.scheme, []).append(part)
            tensors.update(layer.tensors(part))
            if layer.ragged_from:
                ragged[part] = layer
    if ragged:
        _warn_ragged(ragged)
    actorder = "weight" if getattr(cfg, "act_order", False) else None  # GPTQ's column order: calibration only
    groups = {scheme: moe.aliases(names) for scheme, names in groups.items()} if moe else groups
    qc = quantization_config(groups, other_linears(ckpt.config, set(widths), moe, float_experts), actorder)
    return save_compressed_tensors(out, tensors, ckpt.config, qc, ckpt.path, overwrite)
