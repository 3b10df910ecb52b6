"""Sequential, memory-bounded quantization of a decoder-only HF model, one block at a time.

1. Run the calibration windows up to the first block and keep its inputs (and the keyword arguments the model passes
   to blocks: masks, position embeddings).
2. For each block and each true-sequential group of Linear layers: run the block on the current inputs with forward
   hooks accumulating each layer's Hessian H = (2/n) Σ x xᵀ, quantize the group, and write the dequantized weights
   back (MatGPTQ: the master width) so later groups and blocks see quantized inputs.
3. Re-run the block to produce the next block's inputs. Only one block's activations and Hessians are alive at a time.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from ..errors import UserError
from ..formats import QuantizedWeight
from ..models import ArchSpec, arch_spec, get_blocks, set_weight_matrix, weight_matrix
from .config import Method, QuantConfig
from .grid import NearestRounding, Rounding
from .multibit import MatryoshkaRounding
from .solver import QuantResult, gptq_quantize, rtn_quantize


@dataclass
class LayerReport:
    name: str
    shape: tuple[int, int]
    rel_error: dict[int, float]  # width -> ‖(W − Ŵ)X‖² / ‖WX‖² on the calibration inputs (rows subsampled)
    damp: float
    seconds: float


class _StopForward(Exception):
    pass


def make_rounding(cfg: QuantConfig) -> Rounding:
    if cfg.method is Method.MATGPTQ:
        return MatryoshkaRounding(cfg.bits, cfg.target_bits, cfg.bit_weights)
    return NearestRounding(cfg.bits)


def check_finite(model: nn.Module) -> None:
    for name, p in model.named_parameters():
        if not torch.isfinite(p).all():
            raise UserError(f"the model weight {name} contains NaN or Inf values; fix or re-export the model first")


@torch.no_grad()
def capture_block_inputs(model: nn.Module, spec: ArchSpec, windows: torch.Tensor, batch: int):
    """Inputs of the first block for every batch of windows: list of (hidden_states, kwargs)."""
    blocks = get_blocks(model, spec)
    first = blocks[0]
    captured: list[tuple[torch.Tensor, dict]] = []

    class Catcher(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = first

        def forward(self, hidden_states, *args, **kwargs):
            captured.append((hidden_states, kwargs))
            raise _StopForward

    blocks[0] = Catcher()
    try:
        for b0 in range(0, windows.shape[0], batch):
            try:
                model(windows[b0 : b0 + batch], use_cache=False)
            except _StopForward:
                pass
    finally:
        blocks[0] = first
    return captured


def _run_block(block: nn.Module, inputs) -> list[torch.Tensor]:
    outs = []
    for hidden, kwargs in inputs:
        out = block(hidden, **kwargs)
        outs.append(out[0] if isinstance(out, tuple) else out)
    return outs


@torch.no_grad()
def _collect_hessians(block: nn.Module, names: tuple[str, ...], inputs) -> dict[str, torch.Tensor]:
    hessians: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}

    def hook(name):
        def fn(module, args, output):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
            n_old, n_new = counts.get(name, 0), x.shape[0]
            h = hessians.get(name)
            if h is None:
                h = hessians[name] = torch.zeros(x.shape[1], x.shape[1])
            h.mul_(n_old / (n_old + n_new))
            counts[name] = n_old + n_new
            x = x * math.sqrt(2 / counts[name])
            h.addmm_(x.T, x)

        return fn

    handles = [block.get_submodule(n).register_forward_hook(hook(n)) for n in names]
    try:
        _run_block(block, inputs)
    finally:
        for h in handles:
            h.remove()
    return hessians


def _relative_error(w: torch.Tensor, deq: torch.Tensor, h: torch.Tensor, max_rows: int = 128) -> float:
    rows = torch.linspace(0, w.shape[0] - 1, min(max_rows, w.shape[0])).long()
    w, e = w[rows].float(), (w[rows] - deq[rows]).float()
    den = torch.einsum("nk,kl,nl->", w, h, w)
    return float(torch.einsum("nk,kl,nl->", e, h, e) / den) if den > 0 else 0.0


def _to_weight(res: QuantResult, bits: int) -> QuantizedWeight:
    return QuantizedWeight(res.codes, res.scales, res.zeros, res.g_idx, bits, 0, res.perm)


@torch.no_grad()
def quantize_model(
    model: nn.Module, windows: torch.Tensor, cfg: QuantConfig, batch_tokens: int = 4096, progress: bool = True,
    rounding: Rounding | None = None,
) -> tuple[dict[str, QuantizedWeight], list[LayerReport]]:
    """Quantize every block Linear of `model` in place (weights become the dequantized master codes).

    `rounding` overrides the code choice derived from `cfg` (used by ablation scripts).
    """
    spec = arch_spec(model.config.model_type)
    check_finite(model)
    rounding = rounding or make_rounding(cfg)
    blocks = get_blocks(model, spec)
    groups = spec.groups if cfg.true_sequential else (tuple(n for g in spec.groups for n in g),)
    needs_data = cfg.method is not Method.RTN
    batch = max(1, batch_tokens // windows.shape[1])
    inputs = capture_block_inputs(model, spec, windows, batch) if needs_data else []

    layers: dict[str, QuantizedWeight] = {}
    reports: list[LayerReport] = []
    bar = tqdm(total=len(blocks) * sum(len(g) for g in groups), desc="quantize", unit="layer", disable=not progress)
    skipped = lambda full: any(re.search(p, full) for p in cfg.skip)  # noqa: E731
    for i, block in enumerate(blocks):
        for all_names in groups:
            group = tuple(n for n in all_names if not skipped(f"{spec.blocks}.{i}.{n}"))
            bar.update(len(all_names) - len(group))
            if not group:
                continue
            hessians = _collect_hessians(block, group, inputs) if needs_data else {}
            for name in group:
                full = f"{spec.blocks}.{i}.{name}"
                module = block.get_submodule(name)
                w = weight_matrix(module, spec).float()
                t0 = time.perf_counter()
                if needs_data:
                    res = gptq_quantize(
                        w, hessians[name], rounding, group_size=cfg.group_size, sym=cfg.sym,
                        act_order=cfg.act_order, static_groups=cfg.static_groups, mse=cfg.mse,
                        damp=cfg.damp, block_size=cfg.block_size, signed=cfg.signed_scale,
                    )  # fmt: skip
                else:
                    res = rtn_quantize(w, rounding, cfg.group_size, cfg.sym, cfg.mse, cfg.signed_scale)
                qw = _to_weight(res, cfg.bits)
                seconds = time.perf_counter() - t0
                errors = {}
                if needs_data:
                    errors = {r: _relative_error(w, qw.slice(r).dequantize(), hessians[name]) for r in cfg.target_bits}
                set_weight_matrix(module, spec, qw.dequantize())
                layers[full] = qw
                reports.append(LayerReport(full, tuple(w.shape), errors, res.damp, seconds))
                err_txt = " ".join(f"{r}b={e:.2e}" for r, e in errors.items())
                bar.set_postfix_str(f"{full} {err_txt}".strip())
                bar.update(1)
            del hessians
        if needs_data:
            inputs = [(out, kw) for out, (_, kw) in zip(_run_block(block, inputs), inputs)]
    bar.close()
    return layers, reports
