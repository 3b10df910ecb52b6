"""A block's true-sequential groups: which of its Linear layers are solved together, each group's Hessians taken
with the groups before it already quantized (pipeline.py). Without true-sequential every layer is one group; without
calibration data (RTN) each layer is its own; otherwise the architecture's groups as models/arch.py writes them out,
or, where it does not, the groups traced from the block's own forward on the first batch (`trace_groups`).
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import UserError
from ..models import ArchSpec
from ..models.experts import FusedExperts, parse
from .config import MethodConfig
from .passes import Inputs


def groups_for(spec: ArchSpec, cfg: MethodConfig, needs_data: bool) -> tuple[tuple[str, ...], ...] | None:
    """A block's groups: all layers at once without true-sequential, one layer at a time without data (RTN), the
    architecture's own where written out, else None (traced from the block's forward)."""
    if needs_data and not cfg.true_sequential:
        return (spec.layers,)
    if spec.groups is None and not needs_data:
        return tuple((n,) for n in spec.layers)
    return spec.groups


@torch.no_grad()
def trace_groups(
    block: nn.Module, names: tuple[str, ...], inputs: Inputs, experts: tuple[FusedExperts, ...] = ()
) -> tuple[tuple[str, ...], ...]:
    """A block's true-sequential groups from its own forward on the first batch: its layers in the order they run,
    consecutive layers that read the very same tensor in one group (q/k/v, gate/up), as the groups written out in
    models/arch.py ARCHITECTURES. Every layer must run exactly once, except fused experts' layers (models/experts.py:
    run under `calibration_experts`), which run at most once, each on its own tokens: one group per projection of an
    experts module, every expert in it, those the batch routed no token to included."""
    family = _families(names, experts)
    order: list[tuple[str, torch.Tensor]] = []
    hooks = [
        block.get_submodule(n).register_forward_pre_hook(lambda m, args, n=n: order.append((n, args[0]))) for n in names
    ]
    try:
        hidden, kwargs = inputs[0]
        block(hidden, **kwargs)
    finally:
        for hook in hooks:
            hook.remove()
    ran = [n for n, _ in order]
    odd = next((n for n in names if ran.count(n) != 1 and not (n in family and ran.count(n) == 0)), None)
    if odd is not None:
        raise UserError(
            f"layer {odd} of a decoder block ran {ran.count(odd)} times in its forward, not once; "
            "matgptq cannot order it (add an ArchSpec to models/arch.py ARCHITECTURES)"
        )
    groups: list[tuple[list[str], object]] = []
    for n, x in order:
        key = family.get(n, x)
        if groups and groups[-1][1] is key:
            groups[-1][0].append(n)
        else:
            groups.append(([n], key))
    for n in names:  # experts the first batch routed nothing to: in their projection's group
        if n in family and n not in ran:
            group = next((g for g, key in groups if key is family[n]), None)
            groups.append(([n], family[n])) if group is None else group.append(n)
    rank = {n: i for i, n in enumerate(names)}  # an experts group in expert order, the others as they ran
    return tuple(tuple(sorted(g, key=rank.get) if isinstance(key, str) else g) for g, key in groups)


def _families(names: tuple[str, ...], experts: tuple[FusedExperts, ...]) -> dict[str, str]:
    """Fused experts' layer -> its projection (`<experts>.*.<projection>`, one object per projection)."""
    canonical: dict[str, str] = {}
    out = {}
    for n in names:
        if (found := parse(n, experts)) is not None:
            key = f"{found[0]}.*.{found[3]}"
            out[n] = canonical.setdefault(key, key)
    return out
