"""Sequential, memory-bounded quantization of a decoder-only HF model, one block at a time.

1. Run the calibration windows up to the first block and keep its inputs (and the keyword arguments the model passes
   to blocks: masks, position embeddings), one tensor per batch of windows.
2. For each block and each true-sequential group of Linear layers: one pass of the block on the current inputs
   collects each layer's Hessian H = (2/n) Σ x xᵀ (passes.py: one per distinct input, stopped at the group's last
   Linear); quantize the group and write the dequantized weights back (MatGPTQ: the master width) so later groups and
   blocks see quantized inputs.
   Once the attention's output projection is quantized, the attention's output is computed once and stands in for
   the attention module in the block's later passes (passes.py).
3. The next block's inputs: the last group's pass already left `residual` and the last Linear's input, so the output
   is `residual + last(x)` (passes.py), or, where that does not hold, a plain re-run of the block. Only one block's
   activations and Hessians are alive at a time.
4. With a `BlockState` (resume.py), each finished block's weights and the next block's inputs are saved, and a
   killed run continues from the first unfinished block.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
from torch import nn
from tqdm.auto import tqdm

from ..errors import UserError
from ..formats import QuantizedWeight
from ..models import arch_spec, get_blocks, set_weight_matrix, weight_matrix
from .config import Method, QuantConfig, Variant
from .grid import NearestRounding, Rounding
from .multibit import MatryoshkaRounding, PerWidthRounding
from .refit import refit_scales
from .distributed import combine_hessians, share, shard, world
from .resume import BlockState
from .passes import (
    Inputs, PassTimes, attention_cache, capture_block_inputs, collect_hessians, replay_outputs, run_block,
)  # fmt: skip
from .kquant_scales import ScaleLattice, lattice_for
from .solver import QuantResult, gptq_quantize, rtn_quantize


@dataclass
class LayerReport:
    name: str
    shape: tuple[int, int]
    rel_error: dict[int, float]  # width -> ‖(W − Ŵ)X‖² / ‖WX‖² on the calibration inputs (rows subsampled)
    damp: float
    seconds: float


@dataclass
class StageTimes(PassTimes):
    """Where a run's seconds went (benchmarks): forward passes, Hessian accumulation, solver, error report."""

    solver: float = 0.0
    report: float = 0.0


class QuantizeOutput(NamedTuple):
    layers: dict[str, QuantizedWeight]  # full module name -> codes
    reports: list[LayerReport]
    times: StageTimes


def make_rounding(cfg: QuantConfig) -> Rounding:
    if cfg.method is Method.MATGPTQ:
        per_width = cfg.variant is not Variant.PAPER
        return (PerWidthRounding if per_width else MatryoshkaRounding)(cfg.bits, cfg.target_bits, cfg.bit_weights)
    return NearestRounding(cfg.bits)


def with_width_scales(qw: QuantizedWeight, w: torch.Tensor, h: torch.Tensor, damp: float,
                      widths: tuple[int, ...], lattice: ScaleLattice | None = None,
                      group_size: int = -1) -> QuantizedWeight:  # fmt: skip
    """The parent with its own least-squares scales (refit.py) for each target width below the master, in
    `width_scales`; other widths (interpolated ones, the master) slice on the master scale. The master keeps the scale
    its codes were chosen on, so what later layers see is the same as without the refit. Refitting only R's widths
    keeps the cost to |R| − 1 passes of H (every width 2..c−1 would be c − 2: ~2× GPTQ-8's solver time at 4096²)."""
    if not widths:
        return qw
    fit = refit_scales(w, h, qw.codes, qw.scales, qw.zeros, qw.g_idx, qw.bits, widths, damp)
    if lattice is not None:  # each width's scales on its own K-quant lattice (kquant_scales.py)
        fit = {r: lattice.snap(s, lattice.super_scales(s, group_size)) for r, s in fit.items()}
    return replace(qw, width_scales=fit)


def check_finite(model: nn.Module) -> None:
    for name, p in model.named_parameters():
        if not torch.isfinite(p).all():
            raise UserError(f"the model weight {name} contains NaN or Inf values; fix or re-export the model first")


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
    rounding: Rounding | None = None, state: BlockState | None = None,
) -> QuantizeOutput:
    """Quantize every block Linear of `model` in place (weights become the dequantized master codes).

    `rounding` overrides the code choice derived from `cfg` (used by ablation scripts); `state` saves progress after
    every block and continues a killed run (resume.py).
    """
    spec = arch_spec(model.config.model_type)
    check_finite(model)
    rounding = rounding or make_rounding(cfg)
    blocks = get_blocks(model, spec)
    groups = spec.groups if cfg.true_sequential else (tuple(n for g in spec.groups for n in g),)
    needs_data = cfg.method is not Method.RTN
    batch = max(1, batch_tokens // windows.shape[1])
    rank, size = world()
    if size > 1 and needs_data:
        if windows.shape[0] < size:
            raise UserError(f"{windows.shape[0]} calibration windows for {size} processes leave some without work; "
                            "use fewer processes or more --nsamples")  # fmt: skip
        windows = shard(windows, rank, size)
    inputs: Inputs = capture_block_inputs(model, spec, windows, batch) if needs_data else []
    rows = sum(h.shape[0] * h.shape[1] for h, _ in inputs)  # calibration tokens on this rank

    layers: dict[str, QuantizedWeight] = {}
    reports: list[LayerReport] = []
    times = StageTimes()
    bar = tqdm(total=len(blocks) * sum(len(g) for g in groups), desc="quantize", unit="layer",
               disable=not progress or rank > 0)  # fmt: skip
    skipped = lambda full: any(re.search(p, full) for p in cfg.skip)  # noqa: E731
    start = _restore(model, spec, state, len(blocks), inputs, layers, reports, bar)
    for i, block in enumerate(blocks):
        if i < start:
            continue
        replayed, attention = False, None
        for g, all_names in enumerate(groups):
            group = tuple(n for n in all_names if not skipped(f"{spec.blocks}.{i}.{n}"))
            bar.update(len(all_names) - len(group))
            if not group:
                continue
            # one Linear whose output is the block's (`residual + last(x)`) or the attention's: passes.py points 3-4
            single = group[0] if needs_data and cfg.true_sequential and len(group) == 1 else None
            replay = single if spec.residual_last and g == len(groups) - 1 else None
            cut = single if single == spec.attention_out and g < len(groups) - 1 else None
            until = cut.rpartition(".")[0] if cut else None
            collected = collect_hessians(block, group, inputs, times, replay or cut, until, attention) \
                if needs_data else None  # fmt: skip
            if size > 1 and needs_data:
                combine_hessians(collected.hessians, rows)
            owners = [j % size for j in range(len(group))]
            results = [_solve(block, spec, f"{spec.blocks}.{i}.{name}", name, collected, rounding, cfg, times)
                       if owner == rank else None for name, owner in zip(group, owners)]  # fmt: skip
            if size > 1:
                results = share(results, owners)
            for name, (qw, report) in zip(group, results):
                set_weight_matrix(block.get_submodule(name), spec, qw.dequantize())
                layers[report.name] = qw
                reports.append(report)
                err_txt = " ".join(f"{r}b={e:.2e}" for r, e in report.rel_error.items())
                bar.set_postfix_str(f"{report.name} {err_txt}".strip())
                bar.update(1)
            if replay is not None:
                replay_outputs(block.get_submodule(replay), inputs, collected.kept, times)
                replayed = True
            if cut is not None:
                attention = attention_cache(block.get_submodule(until), block.get_submodule(cut), collected, times)
            del collected
        if needs_data and not replayed:
            inputs = [(out, kw) for out, (_, kw) in zip(run_block(block, inputs, times), inputs)]
        if state is not None:
            prefix = f"{spec.blocks}.{i}."
            state.save(i + 1, {n: q for n, q in layers.items() if n.startswith(prefix)}, reports, [h for h, _ in inputs])
    bar.close()
    return QuantizeOutput(layers, reports, times)


def _solve(block, spec, full: str, name: str, collected, rounding: Rounding, cfg: QuantConfig,
           times: StageTimes) -> tuple[QuantizedWeight, LayerReport]:  # fmt: skip
    """One layer's codes (GPTQ with the collected Hessian, or RTN without) and its report."""
    w = weight_matrix(block.get_submodule(name), spec).float()
    lattice = lattice_for(cfg.kquant, cfg.group_size, w.shape[1])
    t0 = time.perf_counter()
    if collected is not None:
        res = gptq_quantize(
            w, collected.hessians[name], rounding, group_size=cfg.group_size, sym=cfg.sym, act_order=cfg.act_order,
            static_groups=cfg.static_groups, mse=cfg.mse, damp=cfg.damp, block_size=cfg.block_size,
            signed=cfg.signed_scale, lattice=lattice,
        )  # fmt: skip
    else:
        res = rtn_quantize(w, rounding, cfg.group_size, cfg.sym, cfg.mse, cfg.signed_scale, lattice)
    qw = _to_weight(res, cfg.bits)
    if collected is not None and cfg.method is Method.MATGPTQ and cfg.variant is Variant.PER_WIDTH_SCALES:
        qw = with_width_scales(qw, w, collected.hessians[name], res.damp, cfg.target_bits[:-1], lattice,
                               cfg.group_size)  # fmt: skip
    seconds = time.perf_counter() - t0
    times.solver += seconds
    errors = {}
    if collected is not None:
        t1 = time.perf_counter()
        errors = {r: _relative_error(w, qw.slice(r).dequantize(), collected.hessians[name]) for r in cfg.target_bits}
        times.report += time.perf_counter() - t1
    return qw, LayerReport(full, tuple(w.shape), errors, res.damp, seconds)


def _restore(model, spec, state: BlockState | None, n_blocks: int, inputs: Inputs, layers: dict, reports: list,
             bar) -> int:  # fmt: skip
    """Continue a killed run: its finished layers (written back into the model), reports and the next block's inputs
    (in place); returns the first block to quantize."""
    restored = state.load(n_blocks, len(inputs)) if state is not None else None
    if restored is None:
        return 0
    for b, hidden in enumerate(restored.hidden):
        inputs[b] = (hidden, inputs[b][1])
    for name, q in restored.layers.items():
        set_weight_matrix(model.get_submodule(name), spec, q.dequantize())
    layers.update(restored.layers)
    reports.extend(LayerReport(r["name"], tuple(r["shape"]), {int(k): v for k, v in r["rel_error"].items()},
                               r["damp"], r["seconds"]) for r in restored.reports)  # fmt: skip
    bar.update(len(restored.layers))
    return restored.done
