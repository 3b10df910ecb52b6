"""Which modules of a decoder-only HF model are quantized, and in which order (true-sequential groups).

`arch_spec(model)` finds them from the model itself: the decoder blocks are the ModuleList of
`config.num_hidden_layers` modules of one class, and the quantized layers a block's Linear (or GPT-2 Conv1D)
modules. The order and grouping of those layers (a group: the layers that read one tensor) come from the block's own
forward, traced on the calibration inputs (quantization/block_groups.py `trace_groups`). ARCHITECTURES holds overrides:
the groups written out, and the shortcuts the pipeline may take for blocks known to allow them (`residual_last`,
`attention_out`). lm_head and the embeddings are never quantized. Experts fused into 3-D tensors (mixture-of-experts
blocks) are quantized one expert projection at a time, each its own layer `<experts>.<e>.<projection>` (experts.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import UserError
from .experts import FusedExperts, expert_weight, find_experts, fused_keys, is_router

_LLAMA_GROUPS = (
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("self_attn.o_proj",),
    ("mlp.gate_proj", "mlp.up_proj"),
    ("mlp.down_proj",),
)


@dataclass(frozen=True)
class ArchSpec:
    blocks: str  # dotted path of the nn.ModuleList of decoder blocks
    # Linear names inside a block, in true-sequential order; None: traced from the block's forward (discovered)
    groups: tuple[tuple[str, ...], ...] | None
    conv1d: bool = False  # GPT-2 style Conv1D: weight stored [in, out]
    # The block's output is `residual + last(x)` for the one Linear of the last group (true for every block listed
    # here: the MLP's output projection feeds only the final residual add). Lets the pipeline replay that Linear
    # instead of re-running the block (quantization/passes.py); False for blocks with a norm after the MLP.
    residual_last: bool = True
    # The Linear whose output is the attention module's output (its parent module): `(o(y), weights)`. Lets the
    # pipeline compute the attention once per block instead of once per later group (quantization/passes.py).
    attention_out: str | None = "self_attn.o_proj"
    linears: tuple[str, ...] = ()  # the quantized layers of a block in module order, for a discovered spec
    experts: tuple[FusedExperts, ...] = ()  # a block's fused experts modules (their layers are in `linears`)

    @property
    def layers(self) -> tuple[str, ...]:
        """A block's quantized layers: in true-sequential order where the groups are known, else in module order."""
        return tuple(n for g in self.groups for n in g) if self.groups is not None else self.linears


ARCHITECTURES: dict[str, ArchSpec] = {
    "llama": ArchSpec("model.layers", _LLAMA_GROUPS),
    "mistral": ArchSpec("model.layers", _LLAMA_GROUPS),
    "qwen2": ArchSpec("model.layers", _LLAMA_GROUPS),
    "qwen3": ArchSpec("model.layers", _LLAMA_GROUPS),
    "phi3": ArchSpec(
        "model.layers", (("self_attn.qkv_proj",), ("self_attn.o_proj",), ("mlp.gate_up_proj",), ("mlp.down_proj",))
    ),
    "gpt2": ArchSpec(
        "transformer.h",
        (("attn.c_attn",), ("attn.c_proj",), ("mlp.c_fc",), ("mlp.c_proj",)),
        conv1d=True,
        attention_out="attn.c_proj",
    ),
}


def arch_spec(model: nn.Module) -> ArchSpec:
    """The blocks and layers to quantize in `model` (it may be on the meta device): its override, or discovered."""
    model_type = getattr(model.config, "model_type", type(model).__name__)
    return ARCHITECTURES.get(model_type) or discover(model, model_type)


def discover(model: nn.Module, model_type: str) -> ArchSpec:
    """The decoder blocks (the ModuleList of `num_hidden_layers` modules of one class) and their Linear/Conv1D
    layers, plus one layer per expert projection of fused experts (a router Linear excluded); groups are left to the
    trace."""
    n = getattr(model.config, "num_hidden_layers", None)
    lists = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.ModuleList) and len(m) > 0 and (n is None or len(m) == n) and len({type(b) for b in m}) == 1
    ]
    if not lists:
        raise UserError(
            f"no list of {n or 'identical'} decoder blocks found in the {model_type} model; it is not a "
            "decoder-only transformer matgptq can quantize (add an ArchSpec to models/arch.py "
            "ARCHITECTURES)"
        )
    blocks, block = lists[0][0], lists[0][1][0]
    experts = find_experts(block, model_type)
    if experts and any(
        {k for k, _ in b.named_parameters()} != {k for k, _ in block.named_parameters()} for b in lists[0][1]
    ):
        raise UserError(
            f"the {model_type} decoder blocks differ (some without experts, e.g. mlp_only_layers); "
            "matgptq quantizes mixture-of-experts models whose blocks are all alike"
        )
    conv1d = [name for name, m in block.named_modules() if type(m).__name__ == "Conv1D"]
    linears = tuple(
        name
        for name, m in block.named_modules()
        if (isinstance(m, nn.Linear) and not is_router(name, m, experts)) or name in conv1d
    )
    linears += tuple(name for fe in experts for name in fe.layers())
    if not linears:
        raise UserError(f"the {model_type} decoder blocks ({blocks}) hold no Linear layers to quantize")
    return ArchSpec(
        blocks, None, conv1d=bool(conv1d), residual_last=False, attention_out=None, linears=linears, experts=experts
    )


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


def layer_weight(root: nn.Module, name: str, spec: ArchSpec) -> torch.Tensor:
    """Layer `name`'s weight under `root` (the model, or a block for a block-relative name) as [out, in]: a
    module's, or a view of an expert's slot in a fused parameter."""
    slot = expert_weight(root, name, spec.experts)
    return slot if slot is not None else weight_matrix(root.get_submodule(name), spec)


def set_layer_weight(root: nn.Module, name: str, spec: ArchSpec, w: torch.Tensor) -> None:
    """Overwrite layer `name`'s weight with `w` [out, in], in place (an expert's: its slot of the fused parameter)."""
    slot = expert_weight(root, name, spec.experts)
    if slot is None:
        set_weight_matrix(root.get_submodule(name), spec, w)
    else:
        slot.copy_(w.to(slot.device, slot.dtype))


@contextmanager
def weight_swapped(root: nn.Module, name: str, spec: ArchSpec, w: torch.Tensor):
    """Layer `name` computes with `w` [out, in] for the duration; its own weight is put back after."""
    saved = layer_weight(root, name, spec).clone()
    set_layer_weight(root, name, spec, w)
    try:
        yield
    finally:
        set_layer_weight(root, name, spec, saved)


def weight_keys(names: set[str], spec: ArchSpec) -> set[str]:
    """The state-dict keys of quantized layers' weights: `<name>.weight`, and the fused parameters whose experts are
    all quantized (experts.py `fused_keys`); a checkpoint stores these as quantized layers, not as tensors."""
    plain = {f"{n}.weight" for n in names}
    return plain | fused_keys(names, spec.experts) if spec.experts else plain


def quantized_layer_names(model: nn.Module, spec: ArchSpec) -> list[str]:
    """Full module names of every quantized Linear, block by block in `spec.layers` order (the pipeline's, except
    for a discovered spec, whose traced order may differ from module order)."""
    return [f"{spec.blocks}.{i}.{name}" for i in range(len(get_blocks(model, spec))) for name in spec.layers]
