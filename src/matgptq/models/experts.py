"""Mixture-of-experts blocks whose experts are fused 3-D tensors, quantized one expert projection at a time.

transformers 5 keeps a block's experts in one module (`@use_experts_implementation`) holding `gate_up_proj`
[E, 2I, H] and `down_proj` [E, H, I] (qwen3_moe, mixtral), or the same transposed, [E, H, 2I] and [E, I, H], with
biases `gate_up_proj_bias` [E, 2I], `down_proj_bias` [E, H] and gate/up interleaved (gpt_oss; `is_transposed`,
`has_bias`). Each expert's projection is its own quantized layer, named `<experts>.<e>.<projection>` (e.g.
`mlp.experts.3.gate_up_proj`), whose weight [out, in] is `param[e]` (`param[e].T` when transposed): a view, so
written codes land in the fused storage and the model's own (fused) forward is never changed outside calibration.
The whole [2I, H] matrix of one expert is one layer, so gpt_oss' interleaving of gate and up rows does not matter;
biases are not quantized (they stay float tensors of the checkpoint). The router is not an expert layer: it stays
float, and a router that is an nn.Linear is left out of a block's quantized layers (`is_router`).

During a block's calibration (`calibration_experts`), each expert projection is a small proxy nn.Linear registered
under its name, whose weight is that view, and the experts module computes with them: every expert's gate_up on the
tokens routed to it (in expert order), then every expert's down projection, weighted by its routing weights. The
pipeline's Hessian hooks therefore see, for expert e, exactly the rows X_e of the tokens the router sent to e.
"""

from __future__ import annotations

import re
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import UserError

PROJECTIONS = ("gate_up_proj", "up_proj", "down_proj")  # transformers' fused expert weights (integrations/moe.py)
_NAME = re.compile(r"^(.*)\.(\d+)\.(" + "|".join(PROJECTIONS) + r")$")


@dataclass(frozen=True)
class FusedExperts:
    """One experts module of a decoder block: its path in the block, fused projections (in order of use), count."""

    path: str
    projections: tuple[str, ...]
    count: int
    transposed: bool

    def layers(self) -> tuple[str, ...]:
        """Its quantized layers in the order they compute: every expert's first projection, then every down."""
        return tuple(f"{self.path}.{e}.{p}" for p in self.projections for e in range(self.count))


def find_experts(block: nn.Module, model_type: str) -> tuple[FusedExperts, ...]:
    """The fused experts modules of `block`; a 3-D tensor in a layout not handled here is a UserError."""
    found = []
    for path, module in block.named_modules():
        fused = [n for n, p in module.named_parameters(recurse=False) if p.ndim == 3]
        if not fused:
            continue
        known = hasattr(module, "is_transposed") and isinstance(getattr(module, "num_experts", None), int)
        odd = next((n for n in fused if n not in PROJECTIONS), None)
        if not known or odd or "down_proj" not in fused or len(fused) != 2:
            where = f"{path}.{odd or fused[0]}" if path else odd or fused[0]
            raise UserError(
                f"{model_type} keeps {where} as a fused 3-D tensor in a layout matgptq does not know (it "
                "quantizes transformers' gate_up_proj/down_proj experts)"
            )
        order = tuple(sorted(fused, key=PROJECTIONS.index))
        found.append(FusedExperts(path, order, module.num_experts, bool(module.is_transposed)))
    return tuple(found)


def is_router(name: str, module: nn.Module, experts: tuple[FusedExperts, ...]) -> bool:
    """A Linear beside an experts module with one output per expert: the router, which stays float."""
    parent = name.rpartition(".")[0]
    return any(
        parent == fe.path.rpartition(".")[0] and getattr(module, "out_features", None) == fe.count for fe in experts
    )


def parse(name: str, experts: tuple[FusedExperts, ...]) -> tuple[str, FusedExperts, int, str] | None:
    """(experts module path as in `name`, its FusedExperts, expert, projection) for an expert layer name (relative to
    a block or full), else None."""
    m = _NAME.match(name)
    if m is None:
        return None
    path, e, proj = m.group(1), int(m.group(2)), m.group(3)
    fe = next((f for f in experts if path == f.path or path.endswith("." + f.path)), None)
    if fe is None or proj not in fe.projections or e >= fe.count:
        return None
    return path, fe, e, proj


def expert_weight(root: nn.Module, name: str, experts: tuple[FusedExperts, ...]) -> torch.Tensor | None:
    """The [out, in] view of expert layer `name` in its fused parameter under `root`, or None for other names."""
    found = parse(name, experts)
    if found is None:
        return None
    path, fe, e, proj = found
    slot = getattr(root.get_submodule(path), proj).data[e]
    return slot.T if fe.transposed else slot


def fused_keys(names: set[str], experts: tuple[FusedExperts, ...]) -> set[str]:
    """The fused parameters (state-dict keys) every expert of which is among the quantized layer `names`: a
    checkpoint stores their experts as quantized layers only. A parameter with some experts left out (--skip) is
    stored whole, its quantized experts overwritten on load."""
    by_key: dict[str, set[int]] = {}
    counts: dict[str, int] = {}
    for n in names:
        if (found := parse(n, experts)) is not None:
            key = f"{found[0]}.{found[3]}"
            by_key.setdefault(key, set()).add(found[2])
            counts[key] = found[1].count
    return {k for k, es in by_key.items() if len(es) == counts[k]}


class ExpertLinear(nn.Linear):
    """A Linear whose weight (and bias) are views of one expert's slot in fused parameters (no storage of its own)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        nn.Module.__init__(self)
        self.out_features, self.in_features = weight.shape
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)


def _proxies(module: nn.Module, fe: FusedExperts) -> list[nn.Module]:
    """Per expert, a module holding one ExpertLinear per projection (views of the fused parameters)."""
    holders = []
    for e in range(fe.count):
        holder = nn.Module()
        for proj in fe.projections:
            w = getattr(module, proj).data[e]
            bias = getattr(module, f"{proj}_bias", None) if getattr(module, "has_bias", False) else None
            holder.add_module(proj, ExpertLinear(w.T if fe.transposed else w, None if bias is None else bias.data[e]))
        holders.append(holder)
    return holders


def _routed_forward(module: nn.Module, holders: list[nn.Module], first: str):
    """The experts' forward through the proxies: out = Σ_(e, slot) w_slot · down_e(act(first_e(x))) over the
    (expert, top-k slot) pairs of each token, all first projections before any down projection."""

    def forward(hidden_states, *routing, **named):
        given = (*routing, *named.values())  # (top-k expert indices, their weights), by position or by name
        index = next(t for t in given if not t.is_floating_point())
        weights = next(t for t in given if t.is_floating_point())
        out = torch.zeros_like(hidden_states)
        routed = [torch.nonzero(index == e, as_tuple=True) for e in range(len(holders))]  # (tokens, top-k slots)
        mids = []
        for holder, (tokens, _) in zip(holders, routed):
            h = getattr(holder, first)(hidden_states[tokens]) if tokens.numel() else None
            mids.append(None if h is None else module._apply_gate(h) if first == "gate_up_proj" else module.act_fn(h))
        for holder, (tokens, slots), mid in zip(holders, routed, mids):
            if mid is None:
                continue
            y = holder.down_proj(mid)
            if getattr(module, "has_post_expert_norm", False):
                y = module.post_expert_norm(y)
            out.index_add_(0, tokens, (y * weights[tokens, slots, None]).to(out.dtype))
        return out

    return forward


@contextmanager
def calibration_experts(block: nn.Module, experts: tuple[FusedExperts, ...]):
    """For the duration: every expert projection of `block` is a proxy Linear under its layer name, and the experts
    modules compute through them (module docstring); afterwards the block is as it was (its weights as written)."""
    touched = []
    try:
        for fe in experts:
            module = block.get_submodule(fe.path)
            holders = _proxies(module, fe)
            for e, holder in enumerate(holders):
                module.add_module(str(e), holder)
            touched.append((module, fe))
            module.forward = _routed_forward(module, holders, fe.projections[0])
        yield
    finally:
        for module, fe in touched:
            for e in range(fe.count):
                del module._modules[str(e)]
            del module.forward


@contextmanager
def experts_as_layers(blocks: nn.ModuleList, experts: tuple[FusedExperts, ...]):
    """`calibration_experts` in every block of `blocks` at once: each expert projection of the model is a module
    under its layer name, seeing the tokens routed to it (a search's per-layer hooks and weight swaps)."""
    with ExitStack() as stack:
        for block in blocks:
            stack.enter_context(calibration_experts(block, experts))
        yield


# Per-expert layouts of fused experts in checkpoint files (transformers' conversion_mapping.py merges them the same
# way on load): where the files put the experts module's parent (None: where the model does), and per fused
# projection the per-expert tensors whose rows are concatenated: [e] = cat(pieces), stacked over the experts.
FILE_LAYOUTS = (
    (None, {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}),  # qwen2_moe, qwen3_moe, …
    ("block_sparse_moe", {"gate_up_proj": ("w1", "w3"), "down_proj": ("w2",)}),  # mixtral
)
_FUSED = re.compile(r"^(.*)\.experts\.(gate_up_proj|down_proj)$")


def file_names(name: str) -> tuple[str, ...]:
    """The names checkpoint files may give the model tensor `name`: its own, and mixtral's `block_sparse_moe`."""
    return (name, name.replace(".mlp.", ".block_sparse_moe.", 1)) if ".mlp." in name else (name,)


def per_expert_keys(name: str, count: int, stored) -> list[list[str]] | None:
    """For the fused parameter `name` (`<parent>.experts.<projection>`, `count` experts), the file keys of each
    expert's pieces in one of FILE_LAYOUTS, all of which `stored` (a key -> bool test) holds; else None."""
    m = _FUSED.match(name)
    if m is None:
        return None
    for parent, pieces in FILE_LAYOUTS:
        where = m.group(1) if parent is None else f"{m.group(1).rpartition('.')[0]}.{parent}"
        keys = [[f"{where}.experts.{e}.{piece}.weight" for piece in pieces[m.group(2)]] for e in range(count)]
        if all(stored(k) for ks in keys for k in ks):
            return keys
    return None
