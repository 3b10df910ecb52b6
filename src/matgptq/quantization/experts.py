"""Fused experts' Hessians (models/experts.py), and the policy for experts that see too few calibration tokens.

Expert e of a projection P (gate_up or down of one experts module) sees only the n_e tokens the router sends to it,
so the pipeline's Hessian H_e = (2/n_e) Σ_{t→e} x_t x_tᵀ is estimated from n_e rows: of rank ≤ n_e < K for few
tokens (K: P's input width), and missing for an expert that got none. Policy: an expert with n_e < K is *starved*,
and its Hessian is shrunk towards P's token-weighted mean over the block's experts,

    H_e ← (n_e·H_e + (K − n_e)·H̄) / K,        H̄ = Σ_j n_j·H_j / Σ_j n_j,

the mean standing in for the K − n_e rows it lacks (H̄ alone for n_e = 0); an expert with n_e ≥ K keeps its own H_e.
For gate_up every expert reads the same hidden states, so H̄ is the Hessian of all routed tokens; for down the experts'
input spaces differ and H̄ is only a prior of the right scale. If no expert of P saw a token, P's experts have no
Hessian and are rounded to nearest. Each expert layer's report records `tokens` (n_e) and `starved`, so matgptq.json
says which experts the policy hit (quantization/run.py also lists them under `experts`).
"""

from __future__ import annotations

import torch

from ..models.experts import FusedExperts, parse


def expert_hessians(
    hessians: dict[str, torch.Tensor], rows: dict[str, int], group: tuple[str, ...], experts: tuple[FusedExperts, ...]
) -> dict[str, tuple[int, bool]]:
    """Apply the policy to the expert layers of `group` (their Hessians in `hessians`, replaced, not changed in
    place); returns each expert layer's (tokens, starved)."""
    projections: dict[tuple[str, str], list[str]] = {}
    for n in group:
        if (found := parse(n, experts)) is not None:
            projections.setdefault((found[0], found[3]), []).append(n)
    info: dict[str, tuple[int, bool]] = {}
    for layers in projections.values():
        seen = [n for n in layers if rows.get(n, 0) > 0]
        if not seen:
            info.update({n: (0, True) for n in layers})
            continue
        total = sum(rows[n] for n in seen)
        mean = sum(hessians[n] * (rows[n] / total) for n in seen)
        k = mean.shape[0]
        for n in layers:
            tokens = rows.get(n, 0)
            if tokens < k:
                own = hessians[n] * (tokens / k) if tokens else 0
                hessians[n] = mean * ((k - tokens) / k) + own
            info[n] = (tokens, tokens < k)
    return info
