"""What vLLM's own config code makes of an export's fused layers, without loading a weight: run by
tests/integrations/test_vllm_config.py with .venv-vllm's python (`make vllm-test`).

    python tests/integrations/vllm_config_child.py SPEC.json OUT.json

SPEC: {name: export directory}. For each export, vLLM's model class for its `architectures` gives the fused layers
(`packed_modules_mapping`: qkv_proj = q, k, v ...), and every fused layer the file's shards make is resolved as vLLM's
loader resolves a layer (compressed-tensors: `CompressedTensorsConfig.get_scheme_dict`; GPTQ: `get_linear_quant_method`
and `override_config`, the `dynamic` rules), and so is each of its shards on its own. OUT: {name: {fused layer:
{"fused": what the fused layer gets, "shards": {shard: what it would get alone}}}}, each a short string: the weight
bits and group size, "float" (not quantized), or "error: ..." where vLLM raises.
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
                names.add(re.sub(r"\.(weight|weight_packed|weight_scale|weight_zero_point|weight_shape|qweight|qzeros|"
                                 r"scales|g_idx|bias)$", "", key))  # fmt: skip
    return names


def fused_layers(names: set[str], mapping: dict[str, list[str]]) -> dict[str, list[str]]:
    """{fused layer: its shards} for every fused layer whose shards are all in `names`."""
    out = {}
    for name in sorted(names):
        parent, _, leaf = name.rpartition(".")
        for fused, parts in mapping.items():
            if leaf == parts[0] and all(f"{parent}.{p}" in names for p in parts):
                out[f"{parent}.{fused}"] = [f"{parent}.{p}" for p in parts]
    return out


def ct_resolver(qc: dict, mapping: dict):
    import torch
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig

    config = CompressedTensorsConfig.from_config(qc)
    config.packed_modules_mapping = mapping

    def resolve(name: str) -> str:
        scheme = config.get_scheme_dict(torch.nn.Linear(1, 1), name)
        if scheme is None or scheme.get("weights") is None:
            return "float"
        w = scheme["weights"]
        return f"{w.num_bits} bits, group {w.group_size}, {'sym' if w.symmetric else 'asym'}"

    return resolve


def gptq_resolver(qc: dict, mapping: dict):
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.quantization.auto_gptq import AutoGPTQConfig
    from vllm.model_executor.layers.quantization.utils.gptq_utils import get_linear_quant_method

    config = AutoGPTQConfig.from_config(qc)
    config.packed_modules_mapping = mapping
    layer = LinearBase.__new__(LinearBase)  # only its type is read

    def resolve(name: str) -> str:
        method = get_linear_quant_method(copy.deepcopy(config), layer, name, lambda c: c)
        if not isinstance(method, AutoGPTQConfig):
            return "float"
        return f"{method.weight_bits} bits, group {method.group_size}, {'sym' if method.is_sym else 'asym'}"

    return resolve


def examine(directory: Path) -> dict:
    from vllm.model_executor.models.registry import ModelRegistry

    config = json.loads((directory / "config.json").read_text())
    qc = config["quantization_config"]
    mapping = dict(getattr(ModelRegistry._try_load_model_cls(config["architectures"][0]), "packed_modules_mapping", {}))
    resolver = ct_resolver if qc["quant_method"] == "compressed-tensors" else gptq_resolver
    resolve = resolver(qc, mapping)

    def safe(name: str) -> str:
        try:
            return resolve(name)
        except Exception as e:  # noqa: BLE001 - what vLLM raises is the result
            return f"error: {type(e).__name__}: {' '.join(str(e).split())}"

    return {fused: {"fused": safe(fused), "shards": {s: safe(s) for s in parts}}
            for fused, parts in fused_layers(shards_of(directory), mapping).items()}  # fmt: skip


def main() -> None:
    spec, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    out.write_text(json.dumps({name: examine(Path(d)) for name, d in spec.items()}, indent=1))


if __name__ == "__main__":
    main()
