"""What vLLM's own config code makes of an export's fused layers, without loading a weight: run by
tests/integrations/test_vllm_config.py with .venv-vllm's python (`make vllm-test`).

    python tests/integrations/vllm_config_child.py SPEC.json OUT.json

SPEC: {name: export directory}. For each export, vLLM's model class for its `architectures` gives the fused layers
(`packed_modules_mapping`: qkv_proj = q, k, v ...), and every fused layer the file's shards make is resolved as vLLM's
loader resolves a layer (compressed-tensors: `CompressedTensorsConfig.get_scheme_dict`; GPTQ: `get_linear_quant_method`
and `override_config`, the `dynamic` rules), and so is each of its shards on its own. A mixture-of-experts block's
per-expert Linears `<p>.experts.<e>.<proj>` are one fused MoE layer `<p>.experts` (vLLM's RoutedExperts), resolved by
the quantization config's own `get_quant_method` on a stand-in RoutedExperts (its expert names: the model class's,
`CKPT_NAMES`; its hidden and intermediate sizes from config.json), the method class it picks recorded instead of
built (`_recorded`). The model class's `hf_to_vllm_mapper` renames are applied to the config first, as vLLM's
`configure_quant_config` does. OUT: {name: {fused layer: {"fused": what the fused layer gets, "shards": {shard: what
it would get alone}, and for an MoE layer "method": the method class vLLM picked}}}, each a short string: the weight
bits and group size, "float" (not quantized), or "error: ..." where vLLM raises. (The MoE layer is named by the
file's names: a GPTQ export of mixtral, under `mlp` where vLLM's Mixtral has `block_sparse_moe`, is not modelled.)
"""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path

from safetensors import safe_open


def shards_of(directory: Path) -> set[str]:
    """The module names whose weights the file holds (quantized or not)."""
    names = set()
    for file in directory.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            for key in f.keys():
                names.add(
                    re.sub(
                        r"\.(weight|weight_packed|weight_scale|weight_zero_point|weight_shape|qweight|qzeros|"
                        r"scales|g_idx|bias)$",
                        "",
                        key,
                    )
                )
    return names


def fused_layers(names: set[str], mapping: dict[str, list[str]]) -> dict[str, list[str]]:
    """{fused layer: its shards} for every fused layer whose shards are all in `names`, and every MoE block's fused
    experts layer `<p>.experts` with its per-expert Linears (expert by expert, gate/up/down as the file names them)."""
    out = {}
    for name in sorted(names):
        parent, _, leaf = name.rpartition(".")
        for fused, parts in mapping.items():
            if leaf == parts[0] and all(f"{parent}.{p}" in names for p in parts):
                out[f"{parent}.{fused}"] = [f"{parent}.{p}" for p in parts]
    experts: dict[str, list[tuple[int, str]]] = {}
    for name in names:
        if (m := EXPERT.match(name)) is not None:
            experts.setdefault(m.group(1), []).append((int(m.group(2)), name))
    return out | {layer: [n for _, n in sorted(found)] for layer, found in sorted(experts.items())}


EXPERT = re.compile(r"^(.+\.experts)\.(\d+)\.[^.]+$")
# The names a model class's RoutedExperts gives expert e's gate, up and down projections (`ckpt_names`): vLLM's
# defaults (fused_moe/layer.py; Qwen3-MoE's), and mixtral.py's ("w1", "w2", "w3" as gate, down, up).
CKPT_NAMES = {"MixtralForCausalLM": ("w1", "w3", "w2")}
DEFAULT_CKPT_NAMES = ("gate_proj", "up_proj", "down_proj")


class _Recorded:
    """What a quantization config's `get_quant_method` built for a RoutedExperts: the method class's name and the
    config or weight scheme it was given."""

    def __init__(self, cls: str, quant):
        self.cls, self.quant = cls, quant


def _recorded(module, name: str, make=lambda *args: args[0]) -> None:
    """Replace `module.<name>` (a MoE method class) by one that records `make(args)` instead of building kernels."""
    setattr(module, name, lambda *args, **kw: _Recorded(name, None if name.startswith("Unquantized") else make(*args)))


def routed_experts(config: dict):
    """A stand-in vLLM RoutedExperts (its type, checkpoint names and the sizes its config checks read)."""
    from types import SimpleNamespace

    from vllm.model_executor.layers.fused_moe import RoutedExperts

    layer = RoutedExperts.__new__(RoutedExperts)
    names = CKPT_NAMES.get(config["architectures"][0], DEFAULT_CKPT_NAMES)
    layer.__dict__.update(ckpt_gate_proj_name=names[0], ckpt_up_proj_name=names[1], ckpt_down_proj_name=names[2])
    inter = config.get("moe_intermediate_size", config.get("intermediate_size"))
    layer.__dict__["moe_config"] = SimpleNamespace(
        hidden_dim=config["hidden_size"], intermediate_size_per_partition_unpadded=inter
    )
    return layer


def ct_resolver(qc: dict, mapping: dict, rename, hf: dict):
    import torch
    from vllm.model_executor.layers.quantization.compressed_tensors import compressed_tensors_moe as moe
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
        compressed_tensors_moe_wna16 as wna16,
    )

    config = CompressedTensorsConfig.from_config(qc)
    if rename is not None:
        config.apply_vllm_mapper(rename)
    config.packed_modules_mapping = mapping
    _recorded(wna16, "CompressedTensorsWNA16MoEMethod")  # (weight_quant, input_quant, moe_config)
    _recorded(moe.compressed_tensors_moe, "UnquantizedFusedMoEMethod")
    experts = routed_experts(hf)

    def words(w) -> str:
        return "float" if w is None else f"{w.num_bits} bits, group {w.group_size}, {'sym' if w.symmetric else 'asym'}"

    def resolve(name: str) -> str:
        scheme = config.get_scheme_dict(torch.nn.Linear(1, 1), name)
        return words(None if scheme is None else scheme.get("weights"))

    def resolve_moe(name: str) -> tuple[str, str]:
        got = config.get_quant_method(experts, name)
        return words(got.quant), got.cls

    return resolve, resolve_moe


def gptq_resolver(qc: dict, mapping: dict, rename, hf: dict):
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.quantization import auto_gptq, moe_wna16
    from vllm.model_executor.layers.quantization.auto_gptq import AutoGPTQConfig
    from vllm.model_executor.layers.quantization.utils.gptq_utils import get_linear_quant_method

    config = AutoGPTQConfig.from_config(qc)
    if rename is not None:
        config.apply_vllm_mapper(rename)
    config.packed_modules_mapping = mapping
    layer = LinearBase.__new__(LinearBase)  # only its type is read
    _recorded(auto_gptq, "AutoGPTQMoEMethod")  # (its cloned config, with the `dynamic` overrides, moe_config)
    _recorded(moe_wna16, "MoeWNA16Method")  # (its MoeWNA16Config: the file's base bits and group size)
    for module in (auto_gptq, moe_wna16):
        _recorded(module, "UnquantizedFusedMoEMethod")
    experts = routed_experts(hf)

    def words(c) -> str:
        if c is None:
            return "float"
        sym = c.is_sym if isinstance(c, AutoGPTQConfig) else not c.has_zp
        return f"{c.weight_bits} bits, group {c.group_size}, {'sym' if sym else 'asym'}"

    def resolve(name: str) -> str:
        method = get_linear_quant_method(copy.deepcopy(config), layer, name, lambda c: c)
        return words(method if isinstance(method, AutoGPTQConfig) else None)

    def resolve_moe(name: str) -> tuple[str, str]:
        got = copy.deepcopy(config).get_quant_method(experts, name)
        return words(got.quant), got.cls

    return resolve, resolve_moe


def examine(directory: Path) -> dict:
    from vllm.model_executor.models.registry import ModelRegistry

    config = json.loads((directory / "config.json").read_text())
    qc = config["quantization_config"]
    cls = ModelRegistry._try_load_model_cls(config["architectures"][0])
    mapping = dict(getattr(cls, "packed_modules_mapping", {}))
    mapper = getattr(cls, "hf_to_vllm_mapper", None)
    resolver = ct_resolver if qc["quant_method"] == "compressed-tensors" else gptq_resolver
    resolve, resolve_moe = resolver(qc, mapping, None if mapper is None else mapper.get_rename_mapper(), config)

    def safe(resolve, name: str):
        try:
            return resolve(name)
        except Exception as e:  # noqa: BLE001 - what vLLM raises is the result
            return f"error: {type(e).__name__}: {' '.join(str(e).split())}"

    out = {}
    for fused, parts in fused_layers(shards_of(directory), mapping).items():
        out[fused] = {"shards": {s: safe(resolve, s) for s in parts}}
        if EXPERT.match(parts[0]):
            got = safe(resolve_moe, fused)
            scheme, method = (got, "raised") if isinstance(got, str) else got
            out[fused] |= {"fused": scheme, "method": method}
        else:
            out[fused]["fused"] = safe(resolve, fused)
    return out


def main() -> None:
    spec, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    out.write_text(json.dumps({name: examine(Path(d)) for name, d in spec.items()}, indent=1))


if __name__ == "__main__":
    main()
