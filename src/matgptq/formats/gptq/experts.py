"""GPTQ names and per-expert layout of fused mixture-of-experts layers (models/experts.py; docs/formats.md §2.9).

matgptq quantizes each expert of transformers 5's fused experts as its own layer, `<p>.experts.<e>.gate_up_proj`
(weight [2I, H]) and `<p>.experts.<e>.down_proj` ([H, I]). GPTQModel loads a quantized MoE model through
Defuser, which gives every expert plain Linears `<p>.experts.<e>.gate_proj`, `.up_proj`, `.down_proj` (mixtral under
`mlp`, as transformers 5 names its block, not `block_sparse_moe`), so a GPTQ export stores those:

    gate_proj = rows [0, I) of gate_up_proj,   up_proj = rows [I, 2I),   down_proj unchanged.

That is transformers' own split (qwen3_moe, mixtral: `linear(x, gate_up_proj[e]).chunk(2, dim=-1)` → gate, up) and
Defuser's (`param.chunk(2)` along the output dimension). Rows are output features, each with its own scales and zeros
in every group, so the split is exact: the halves' codes, scales and zeros are the rows of the parent's, and g_idx
(one entry per input column) is the same for both. For gpt_oss the halves are not gate and up (its rows interleave
them; the model de-interleaves after computing both), but Defuser splits and re-joins them the same way, and the
per-expert biases `gate_up_proj_bias` [E, 2I] / `down_proj_bias` [E, H] become `<e>.gate_proj.bias` / `.up_proj.bias`
/ `.down_proj.bias`.
"""

from __future__ import annotations

import re
from dataclasses import replace

import torch

from ...errors import UserError
from ..quantized import QuantizedWeight
from .constants import MOE_TYPES

_LAYER = re.compile(r"^(.+\.experts)\.(\d+)\.(gate_up_proj|up_proj|down_proj)$")
_BIAS = re.compile(r"^(.+\.experts)\.(gate_up_proj|down_proj)_bias$")
SPLIT = {"gate_up_proj": ("gate_proj", "up_proj")}  # fused projection -> its row halves, in order


def is_expert(name: str) -> bool:
    """Whether `name` is one expert's projection of a fused experts tensor (models/experts.py's layer names)."""
    return _LAYER.match(name) is not None


def check_moe(src, model_type: str | None, names) -> None:
    """Refuse, in one line, an MoE checkpoint whose GPTQ export no tested reader loads."""
    expert = next((n for n in names if is_expert(n)), None)
    if expert is None:
        return
    if model_type not in MOE_TYPES:
        raise UserError(
            f"{src} quantizes fused experts ({expert}) of {model_type}, for which no GPTQ reader was "
            f"tested (GPTQ export of experts: {', '.join(MOE_TYPES)}); load the checkpoint with "
            "matgptq.load"
        )


def gptq_names(name: str) -> tuple[str, ...]:
    """The GPTQ layer names that `name` is written as (the module docstring): itself, or gate_up's two halves."""
    m = _LAYER.match(name)
    if m is None or m.group(3) not in SPLIT:
        return (name,)
    return tuple(f"{m.group(1)}.{m.group(2)}.{part}" for part in SPLIT[m.group(3)])


def _rows(q: QuantizedWeight, rows: slice) -> QuantizedWeight:
    """The output rows `rows` of `q`: codes, scales, zeros (and per-width scales) of those rows; g_idx is per input
    column and the same for every half (copied: each half's file tensor is its own)."""
    widths = None if q.width_scales is None else {r: s[rows] for r, s in q.width_scales.items()}
    return replace(
        q,
        codes=q.codes[rows].contiguous(),
        scales=q.scales[rows].contiguous(),
        zeros=q.zeros[rows].contiguous(),
        g_idx=q.g_idx.clone(),
        width_scales=widths,
    )


def row_parts(n: int, count: int, interleaved: bool = False) -> list[slice]:
    """The rows of each of `count` parts of n output rows: consecutive blocks (the halves above), or, `interleaved`,
    every count-th row from row i (gpt_oss' gate and up, as compressed-tensors exports split them:
    formats/compressed_tensors/experts.py). Rows are independent, so either split is exact."""
    step = n // count
    return [slice(i, None, count) if interleaved else slice(i * step, (i + 1) * step) for i in range(count)]


def split_layer(name: str, q: QuantizedWeight, interleaved: bool = False) -> dict[str, QuantizedWeight]:
    """{GPTQ name: weight} of layer `name`: a fused gate_up split into its gate and up row halves (`interleaved`:
    its even and odd rows, `row_parts`), else itself."""
    names = gptq_names(name)
    if len(names) == 1:
        return {name: q}
    n = q.shape[0]
    if n % len(names):
        raise UserError(f"{name} has {n} output rows, which do not split into {len(names)} equal halves")
    return {part: _rows(q, rows) for part, rows in zip(names, row_parts(n, len(names), interleaved))}


def gptq_widths(widths: dict[str, int]) -> dict[str, int]:
    """{GPTQ layer: width} from matgptq's {layer: width}: each half of a gate_up keeps the gate_up's width."""
    return {part: r for name, r in widths.items() for part in gptq_names(name)}


def split_biases(tensors: dict[str, torch.Tensor], interleaved: bool = False) -> dict[str, torch.Tensor]:
    """`tensors` with fused expert biases ([E, out], gpt_oss) replaced by one bias per expert and GPTQ layer, split
    as `split_layer` splits the rows."""
    out = {}
    for key, value in tensors.items():
        m = _BIAS.match(key)
        if m is None:
            out[key] = value
            continue
        for e in range(value.shape[0]):
            parts = gptq_names(f"{m.group(1)}.{e}.{m.group(2)}")
            for part, rows in zip(parts, row_parts(value.shape[1], len(parts), interleaved)):
                out[f"{part}.bias"] = value[e, rows].contiguous()
    return out


# --- reading back (reader.py): the inverse, so matgptq.load runs its own MoE exports ---------------

_HALF = re.compile(r"^(.+\.experts)\.(\d+)\.(gate_proj|up_proj)$")
_EXPERT_BIAS = re.compile(r"^(.+\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.bias$")


def _join_pair(fused: str, gate: QuantizedWeight, up: QuantizedWeight) -> QuantizedWeight:
    """One fused gate_up layer from its two GPTQ halves (gate rows first); they must share width and g_idx."""
    if gate.bits != up.bits or gate.shift != up.shift or not torch.equal(gate.g_idx, up.g_idx):
        raise UserError(
            f"{fused}: its gate_proj and up_proj halves differ in width or input-group order (g_idx), "
            "but matgptq runs them as one fused layer; re-export them with one width and one act-order"
        )
    return replace(
        gate,
        codes=torch.cat([gate.codes, up.codes]),
        scales=torch.cat([gate.scales, up.scales]),
        zeros=torch.cat([gate.zeros, up.zeros]),
        width_scales=None,
    )


def join_layers(layers: dict[str, QuantizedWeight]) -> dict[str, QuantizedWeight]:
    """GPTQ layers with each expert's gate_proj and up_proj joined into the fused layer `<e>.gate_up_proj`."""
    halves: dict[str, dict[str, QuantizedWeight]] = {}
    out = {}
    for name, q in layers.items():
        m = _HALF.match(name)
        if m is None:
            out[name] = q
        else:
            halves.setdefault(f"{m.group(1)}.{m.group(2)}.gate_up_proj", {})[m.group(3)] = q
    for fused, pair in halves.items():
        if set(pair) != {"gate_proj", "up_proj"}:
            missing = ({"gate_proj", "up_proj"} - set(pair)).pop()
            raise UserError(
                f"{fused.removesuffix('gate_up_proj')}{missing} is not stored quantized beside its other "
                "half; the checkpoint is incomplete"
            )
        out[fused] = _join_pair(fused, pair["gate_proj"], pair["up_proj"])
    return out


def join_biases(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` with per-expert biases stacked back into the fused `<p>.experts.{gate_up,down}_proj_bias` [E, out]."""
    out, parts = {}, {}
    for key, value in tensors.items():
        m = _EXPERT_BIAS.match(key)
        if m is None:
            out[key] = value
            continue
        proj = "down_proj" if m.group(3) == "down_proj" else "gate_up_proj"
        parts.setdefault(f"{m.group(1)}.{proj}_bias", {})[(int(m.group(2)), m.group(3))] = value
    for key, pieces in parts.items():
        order = sorted(pieces, key=lambda ep: (ep[0], ep[1] == "up_proj"))  # per expert: gate before up
        count = 1 + max(e for e, _ in order)
        rows = [torch.cat([pieces[ep] for ep in order if ep[0] == e]) for e in range(count)]
        out[key] = torch.stack(rows)
    return out


def join_experts(model_type: str | None, layers: dict, tensors: dict) -> tuple[dict, dict]:
    """(layers, tensors) of a GPTQ checkpoint of an MoE type in MOE_TYPES in matgptq's fused-expert names; others
    unchanged."""
    if model_type not in MOE_TYPES:
        return layers, tensors
    return join_layers(layers), join_biases(tensors)
