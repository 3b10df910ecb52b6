"""The layers an inference engine runs as one (vLLM's `qkv_proj` and `gate_up_proj`, a block's fused MoE layer), found
from the model itself, and the mixes that give such a group more than one width.

vLLM loads q/k/v as one stacked matrix and gate/up as another, and a block's experts as one fused MoE layer, each
with one quantization scheme: a checkpoint whose shards of one fused layer differ in width (or are quantized in part)
does not load there. The groups come from a decoder block of the model built on the meta device (no weights, no
memory) and run once on a meta input, so no architecture is written out here:

  * the Linear layers that read the very same tensor and belong to the same module form one group (q/k/v in the
    attention, gate/up in the MLP; a shared expert's gate/up in its own module are a group of their own);
  * the layers of one fused experts module (experts.py) form one group: every expert's projections;
  * every other layer is a group of its own.

Fused experts modules return zeros during the trace: their routing is data-dependent, which the meta device cannot
compute, and their group does not depend on it.

Exported files spell an experts module's layers their own way (formats/compressed_tensors/experts.py,
formats/gptq/experts.py): each expert's `gate_up_proj` as its two row halves `gate_proj` and `up_proj`, and mixtral's
compressed-tensors files put the block under `block_sparse_moe` (models/experts.py FILE_LAYOUTS). `fused_groups` reads
names in whichever of these spellings most of them use, and gives the groups in it: a file's experts module is the one
group vLLM runs as one fused MoE layer, `<block>.mlp.experts` (tests/integrations/test_vllm_config_moe.py).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from contextlib import ExitStack

import torch
from torch import nn

from ..errors import UserError
from .arch import arch_spec, get_blocks


class _Stop(Exception):
    """Raised by the hook that captured the first block's inputs: nothing after them is needed."""


def _first_block_inputs(model: nn.Module, block: nn.Module) -> tuple[tuple, dict]:
    captured: list[tuple[tuple, dict]] = []

    def grab(module, args, kwargs):
        captured.append((args, kwargs))
        raise _Stop

    hook = block.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        model(input_ids=torch.zeros(1, 8, dtype=torch.long, device="meta"))
    except _Stop:
        pass
    finally:
        hook.remove()
    if not captured:
        raise UserError(
            "the model's forward never reached its first decoder block; matgptq cannot find the layers an engine fuses"
        )
    return captured[0]


def _zeros_forward(hidden_states, *args, **kwargs):
    return torch.zeros_like(hidden_states)


def block_groups(model: nn.Module) -> tuple[tuple[str, ...], ...]:
    """The fused groups of `model`'s decoder blocks (block-relative layer names, every quantized layer once), from
    one traced meta forward of the first block (module docstring). `model` may be on the meta device. Where the
    model's forward cannot run on the meta device (GPT-2's mask), the groups of its written-out ArchSpec
    (models/arch.py: the layers that read one tensor) are split by module instead."""
    spec = arch_spec(model)
    expert_layers = {n for fe in spec.experts for n in fe.layers()}
    plain = [n for n in spec.layers if n not in expert_layers]
    try:
        seen = _trace(model, spec, plain)
    except (RuntimeError, NotImplementedError) as e:
        if spec.groups is None:
            raise UserError(
                f"the {model.config.model_type} model's forward does not run on the meta device ({e}), "
                "so matgptq cannot find the layers an engine fuses"
            ) from None
        seen = [(n, group) for group in spec.groups for n in group]
    groups: list[tuple[list[str], object, str]] = []
    for n, x in seen:
        parent = n.rpartition(".")[0]
        same = next((g for g in groups if g[1] is x and g[2] == parent), None)
        if same is not None:
            same[0].append(n)
        else:
            groups.append(([n], x, parent))
    traced = {n for g in groups for n in g[0]}
    found = [tuple(g[0]) for g in groups] + [(n,) for n in plain if n not in traced]
    found += [fe.layers() for fe in spec.experts]
    return tuple(found)


def _trace(model: nn.Module, spec, plain: list[str]) -> list[tuple[str, torch.Tensor]]:
    """(layer, the tensor it read) for the layers `plain` of the first block, in the order they ran."""
    block = get_blocks(model, spec)[0]
    seen: list[tuple[str, torch.Tensor]] = []
    with ExitStack() as stack:
        for fe in spec.experts:  # routing is data-dependent: the experts return zeros (module docstring)
            module = block.get_submodule(fe.path)
            stack.callback(setattr, module, "forward", module.forward)
            module.forward = _zeros_forward
        for n in plain:
            hook = block.get_submodule(n).register_forward_pre_hook(lambda m, args, n=n: seen.append((n, args[0])))
            stack.callback(hook.remove)
        args, kwargs = _first_block_inputs(model, block)
        block(*args, **kwargs)
    ran = [n for n, _ in seen]
    twice = next((n for n in ran if ran.count(n) > 1), None)
    if twice is not None:
        raise UserError(
            f"layer {twice} ran more than once in a decoder block's forward; matgptq cannot tell which "
            "layers an engine fuses"
        )
    return seen


def meta_model(config) -> nn.Module:
    """The transformers causal LM of `config`, every parameter and buffer on the meta device."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


_GATE_UP = re.compile(r"^(.*\.experts\.\d+)\.gate_up_proj$")


def _halves(layer: str) -> tuple[str, ...]:
    """An expert's `gate_up_proj` as exported files write it, `gate_proj` and `up_proj`; any other layer itself."""
    m = _GATE_UP.match(layer)
    return (layer,) if m is None else (f"{m.group(1)}.gate_proj", f"{m.group(1)}.up_proj")


def _sparse_moe(layer: str) -> tuple[str, ...]:
    """`_halves`, an experts module under `mlp` put under `block_sparse_moe` (mixtral's files)."""
    return tuple(re.sub(r"^mlp\.(?=experts\.)", "block_sparse_moe.", n) for n in _halves(layer))


SPELLINGS = (lambda layer: (layer,), _halves, _sparse_moe)  # block-relative layer -> its names in a file (docstring)


def fused_groups(config, names: Iterable[str]) -> list[tuple[str, ...]]:
    """The quantized layers `names` (full module names) grouped as an engine fuses them; a name outside the decoder
    blocks' layers is a group of its own. Groups keep the order of `names`' first members, and are spelled as most of
    `names` are (the model's layers, or an exported file's: module docstring). `config`: a transformers config, or a
    checkpoint's config.json as a dict (its quantization_config is not read)."""
    if isinstance(config, dict):
        from transformers import AutoConfig

        config = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "quantization_config"})
    model = meta_model(config)
    spec = arch_spec(model)
    names = list(names)
    where = []  # (name, block index, block-relative layer) or (name, None, None) outside the blocks
    for name in names:
        head, _, rest = name.partition(f"{spec.blocks}.")
        index, _, layer = rest.partition(".")
        where.append((name, index, layer) if not head and index.isdigit() else (name, None, None))
    groups = block_groups(model)
    spelled = [
        {n: g for g in (tuple(m for layer in group for m in spell(layer)) for group in groups) for n in g}
        for spell in SPELLINGS
    ]
    relative = max(spelled, key=lambda r: sum(layer in r for _, _, layer in where))  # ties: the model's own names
    out: dict[tuple[str, ...], None] = {}  # insertion-ordered
    for name, index, layer in where:
        group = relative.get(layer)
        out[(name,) if group is None else tuple(f"{spec.blocks}.{index}.{n}" for n in group)] = None
    return list(out)


def mixed_groups(groups: Iterable[tuple[str, ...]], widths: Mapping[str, int | None]) -> list[dict[str, int | None]]:
    """The groups whose layers do not share one width: {layer: width} for each (None: the layer is not quantized,
    or absent from `widths`)."""
    mixed = []
    for group in groups:
        got = {n: widths.get(n) for n in group}
        if len(set(got.values())) > 1:
            mixed.append(got)
    return mixed


def fused_name(group: Iterable[str]) -> str:
    """The module the group's layers share (`model.layers.3.self_attn`, `model.layers.3.mlp.experts`: the name of the
    fused MoE layer vLLM builds), or "" where they share none."""
    split = [n.split(".")[:-1] for n in group]
    common = []
    for parts in zip(*split):
        if len(set(parts)) > 1:
            break
        common.append(parts[0])
    return ".".join(common)


def describe(group: Mapping[str, int | None]) -> str:
    """`model.layers.3.self_attn.{q_proj: 3, k_proj: 4, v_proj: 4}`: one mixed group in a line's words. A group of
    more than 4 layers (a block's experts) names the layers off its most common width, then how many more are at it:
    `model.layers.1.mlp.experts.{2.gate_proj: 8, 2.up_proj: 8, … 10 more: 4}`, or `…experts.{all 12: 8}`."""
    prefix = fused_name(group)

    def part(n: str, w: int | None) -> str:
        return f"{n.removeprefix(prefix + '.') if prefix else n}: {w if w is not None else 'float'}"

    parts = [part(n, w) for n, w in group.items()]
    if len(parts) > 4 and len(set(group.values())) == 1:
        w = next(iter(group.values()))
        parts = [f"all {len(parts)}: {w if w is not None else 'float'}"]
    elif len(parts) > 4:
        common = Counter(group.values()).most_common(1)[0][0]
        shown = [n for n, w in group.items() if w != common][:3]
        rest = {w for n, w in group.items() if n not in shown}
        at = f": {w if (w := rest.pop()) is not None else 'float'}" if len(rest) == 1 else ""
        parts = [part(n, group[n]) for n in shown] + [f"… {len(group) - len(shown)} more{at}"]
    return f"{prefix}.{{{', '.join(parts)}}}" if prefix else "{" + ", ".join(parts) + "}"
