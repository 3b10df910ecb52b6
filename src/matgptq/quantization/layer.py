"""One layer's codes from its method's config: the solver (GPTQ with the collected Hessian, or RTN without), the
scale refit, MatGPTQ's per-width scales, and the layer's report. The block loop (pipeline.py) calls `solve_layer`."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from ..formats import QuantizedWeight
from .algorithm.grid import NearestRounding, Rounding
from .algorithm.kquant_scales import ScaleLattice, lattice_for
from .algorithm.multibit import MatryoshkaRounding, PerWidthRounding
from .algorithm.refit import refit_master, refit_scales
from .algorithm.solver import QuantResult, gptq_quantize, rtn_quantize
from .config import GPTQConfig, MatGPTQConfig, MethodConfig, Variant


@dataclass
class LayerReport:
    name: str
    shape: tuple[int, int]
    rel_error: dict[int, float]  # width -> ‖(W − Ŵ)X‖² / ‖WX‖² on the calibration inputs (rows subsampled)
    damp: float
    seconds: float
    tokens: int | None = None  # fused experts only: the calibration tokens routed to the expert (experts.py)
    starved: bool | None = None  # fused experts only: its Hessian was shrunk towards the experts' mean (experts.py)

    @classmethod
    def from_json(cls, r: dict) -> LayerReport:
        """A report as `asdict` wrote it to a resume state or a checkpoint's matgptq.json (JSON keys are strings)."""
        rel = {int(k): v for k, v in r["rel_error"].items()}
        return cls(r["name"], tuple(r["shape"]), rel, r["damp"], r["seconds"], r.get("tokens"), r.get("starved"))


def make_rounding(cfg: MethodConfig) -> Rounding:
    """How codes are chosen from a column's values: nearest on one width, or MatGPTQ's multi-width choice."""
    if isinstance(cfg, MatGPTQConfig):
        per_width = cfg.variant is not Variant.PAPER
        return (PerWidthRounding if per_width else MatryoshkaRounding)(cfg.bits, cfg.target_bits, cfg.bit_weights)
    return NearestRounding(cfg.bits)


def with_width_scales(
    qw: QuantizedWeight,
    w: torch.Tensor,
    h: torch.Tensor,
    damp: float,
    widths: tuple[int, ...],
    lattice: ScaleLattice | None = None,
    group_size: int = -1,
) -> QuantizedWeight:
    """The parent with its own least-squares scales (refit.py) for each target width below the master, in
    `width_scales`; other widths (interpolated ones, the master) slice on the master scale. The master keeps the scale
    its codes were chosen on, so what later layers see is the same as without the refit. Refitting only R's widths
    keeps the cost to |R| − 1 passes of H (every width 2..c−1 would be c − 2)."""
    if not widths:
        return qw
    fit = refit_scales(w, h, qw.codes, qw.scales, qw.zeros, qw.g_idx, qw.bits, widths, damp)
    if lattice is not None:  # each width's scales on its own K-quant lattice (kquant_scales.py)
        fit = {r: lattice.snap(s, lattice.super_scales(s, group_size)) for r, s in fit.items()}
    return replace(qw, width_scales=fit)


def relative_error(w: torch.Tensor, deq: torch.Tensor, h: torch.Tensor, max_rows: int = 128) -> float:
    """‖(W − Ŵ)X‖² / ‖WX‖² = tr(E H Eᵀ) / tr(W H Wᵀ) over up to `max_rows` evenly spaced rows."""
    rows = torch.linspace(0, w.shape[0] - 1, min(max_rows, w.shape[0]), device=w.device).long()
    w, e = w[rows].float(), (w[rows] - deq[rows]).float()
    den = torch.einsum("nk,kl,nl->", w, h, w)
    return float(torch.einsum("nk,kl,nl->", e, h, e) / den) if den > 0 else 0.0


def _solved(
    w: torch.Tensor, h: torch.Tensor | None, rounding: Rounding, cfg: MethodConfig, lattice: ScaleLattice | None
) -> QuantResult:
    """The solver's result: GPTQ on the Hessian `h`, or round-to-nearest without one."""
    if h is None:
        return rtn_quantize(w, rounding, cfg.group_size, cfg.sym, cfg.mse, cfg.signed_scale, lattice)
    return gptq_quantize(
        w,
        h,
        rounding,
        group_size=cfg.group_size,
        sym=cfg.sym,
        act_order=cfg.act_order,
        static_groups=cfg.static_groups,
        mse=cfg.mse,
        damp=cfg.damp,
        block_size=cfg.block_size,
        signed=cfg.signed_scale,
        lattice=lattice,
        mse_weighted=cfg.mse_weighted,
        group_order=cfg.group_act_order,
    )


def solve_layer(
    w: torch.Tensor, h: torch.Tensor | None, name: str, rounding: Rounding, cfg: MethodConfig
) -> tuple[QuantizedWeight, LayerReport, float]:
    """Layer `name`'s codes for its float weight `w` (GPTQ with the Hessian `h`, RTN with None), its report, and the
    seconds its error report took. A layer of a width mix is solved as a one-width run at its own width would."""
    if cfg.layer_bits:
        cfg = cfg.for_layer(name)
        rounding = make_rounding(cfg)
    lattice = lattice_for(cfg.kquant, cfg.group_size, w.shape[1])
    t0 = time.perf_counter()
    res = _solved(w, h, rounding, cfg, lattice)
    qw = QuantizedWeight(res.codes, res.scales, res.zeros, res.g_idx, cfg.bits, 0, res.perm)
    if isinstance(cfg, GPTQConfig) and cfg.refit_scales:
        snap = None if lattice is None else (lambda s: lattice.snap(s, lattice.super_scales(s, cfg.group_size)))
        qw = replace(qw, scales=refit_master(w, h, qw.codes, qw.scales, qw.zeros, qw.g_idx, cfg.bits, res.damp, snap))
    if isinstance(cfg, MatGPTQConfig) and cfg.variant is Variant.PER_WIDTH_SCALES:
        qw = with_width_scales(qw, w, h, res.damp, cfg.target_bits[:-1], lattice, cfg.group_size)
    seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    errors = {r: relative_error(w, qw.slice(r).dequantize(), h) for r in cfg.widths} if h is not None else {}
    return qw, LayerReport(name, tuple(w.shape), errors, res.damp, seconds), time.perf_counter() - t1
