"""Which modules of a decoder-only HF model are quantized, and in which order (true-sequential groups).

Each supported `model_type` names its list of decoder blocks and, inside a block, the Linear layers in groups that can
be quantized together (a group only sees inputs produced by already-quantized groups when `true_sequential`).
lm_head and the embeddings are never listed: they stay unquantized.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..errors import UserError

_LLAMA_GROUPS = (
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("self_attn.o_proj",),
    ("mlp.gate_proj", "mlp.up_proj"),
    ("mlp.down_proj",),
)


@dataclass(frozen=True)
class ArchSpec:
    blocks: str  # dotted path of the nn.ModuleList of decoder blocks
    groups: tuple[tuple[str, ...], ...]  # Linear names inside a block, in true-sequential order
    conv1d: bool = False  # GPT-2 style Conv1D: weight stored [in, out]
    # The block's output is `residual + last(x)` for the one Linear of the last group (true for every block listed
    # here: the MLP's output projection feeds only the final residual add). Lets the pipeline replay that Linear
    # instead of re-running the block (quantization/passes.py); False for blocks with a norm after the MLP.
    residual_last: bool = True
    # The Linear whose output is the attention module's output (its parent module): `(o(y), weights)`. Lets the
    # pipeline compute the attention once per block instead of once per later group (quantization/passes.py).
    attention_out: str | None = "self_attn.o_proj"


ARCHITECTURES: dict[str, ArchSpec] = {
    "llama": ArchSpec("model.layers", _LLAMA_GROUPS),
    "mistral": ArchSpec("model.layers", _LLAMA_GROUPS),
    "qwen2": ArchSpec("model.layers", _LLAMA_GROUPS),
    "qwen3": ArchSpec("model.layers", _LLAMA_GROUPS),
    "phi3": ArchSpec(
        "model.layers",
        (("self_attn.qkv_proj",), ("self_attn.o_proj",), ("mlp.gate_up_proj",), ("mlp.down_proj",)),
    ),
    "gpt2": ArchSpec("transformer.h", (("attn.c_attn",), ("attn.c_proj",), ("mlp.c_fc",), ("mlp.c_proj",)), conv1d=True,
                    attention_out="attn.c_proj"),
}


def arch_spec(model_type: str) -> ArchSpec:
    if model_type not in ARCHITECTURES:
        raise UserError(
            f"model type '{model_type}' is not supported (supported: {', '.join(sorted(ARCHITECTURES))}); "
            "add an ArchSpec to matgptq.models.arch.ARCHITECTURES naming its block list and Linear layer groups"
        )
    return ARCHITECTURES[model_type]


def get_blocks(model: nn.Module, spec: ArchSpec) -> nn.ModuleList:
    return model.get_submodule(spec.blocks)


def weight_matrix(module: nn.Module, spec: ArchSpec) -> torch.Tensor:
    """The weight as [out, in] (Conv1D stores it transposed)."""
    return module.weight.data.T if spec.conv1d else module.weight.data


def set_weight_matrix(module: nn.Module, spec: ArchSpec, w: torch.Tensor) -> None:
    """Overwrite the weight with `w` [out, in], in place: a model loaded from safetensors holds its weights in a
    private (copy-on-write) memory map, so writing in place replaces the file's pages instead of adding a second
    copy of every layer to the process (the file itself is never written)."""
    new = (w.T if spec.conv1d else w).to(module.weight.device, module.weight.dtype)
    if new.shape == module.weight.shape:
        module.weight.data.copy_(new)
    else:
        module.weight.data = new.contiguous()


def quantized_layer_names(model: nn.Module, spec: ArchSpec) -> list[str]:
    """Full module names of every quantized Linear, in pipeline order."""
    return [f"{spec.blocks}.{i}.{name}" for i in range(len(get_blocks(model, spec))) for grp in spec.groups for name in grp]
