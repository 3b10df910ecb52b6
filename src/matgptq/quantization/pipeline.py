"""Sequential, memory-bounded quantization of a decoder-only HF model, one block at a time.

1. Run the calibration windows up to the first block and keep its inputs (and the keyword arguments the model passes
   to blocks: masks, position embeddings), one tensor per batch of windows (block_io.py).
2. For each block and each true-sequential group of Linear layers (block_groups.py): one pass of the block on the current inputs
   collects each layer's Hessian H = (2/n) Σ x xᵀ (passes.py: one per distinct input, stopped at the group's last
   Linear); quantize the group and write the dequantized weights back (MatGPTQ: the master width) so later groups and
   blocks see quantized inputs.
   Once the attention's output projection is quantized, the attention's output is computed once and stands in for
   the attention module in the block's later passes (passes.py).
   Experts fused into 3-D tensors (mixture-of-experts blocks) are one layer per expert projection, seen through
   proxy Linears while their block is calibrated (models/experts.py): expert e's Hessian is that of the tokens
   routed to it, with a stated policy for experts that see too few (experts.py); the router is never quantized.
3. The next block's inputs: the last group's pass already left `residual` and the last Linear's input, so the output
   is `residual + last(x)` (passes.py), or, where that does not hold, a plain re-run of the block. Only one block's
   activations and Hessians are alive at a time.
4. With a `sink` (formats/staged.py), each finished block's checkpoint tensors are written at once and not kept;
   with a `BlockState` (resume.py) too, the next block's inputs are saved after every block, and a killed run
   continues from the first unfinished block (block_io.restore).
5. With a `source` (models/lazy.py), the model's blocks stay on disk: block i is read onto the device when it is
   quantized and released after, and the tensors outside the blocks are released once the first block's inputs are
   computed and read again at the end, so memory holds one block's weights, not the model's.
6. With a `passes_dtype` (bfloat16 for a float32 model), each block's passes run on a copy of it in that dtype while
   the solver reads, and the checkpoint takes, the block's own weights (narrow.py).

Devices: with `device` (default: where the model is), the modules outside the blocks visit it
for the first block's inputs, each block is moved there (or read there) while it is quantized and leaves again, and
the calibration activations, Hessians and the solver live there; finished layers go to the CPU. On the CPU nothing
moves: the computation is the one without devices, bit for bit.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import torch
from torch import nn
from tqdm.auto import tqdm

from ..errors import UserError
from ..execution import combine_hessians, release_free_memory, share, world
from ..formats import QuantizedWeight
from ..models import ArchSpec, arch_spec, get_blocks, set_weight_matrix, weight_matrix
from ..models.experts import calibration_experts
from .algorithm.grid import Rounding
from .block_groups import groups_for, trace_groups
from .block_io import BlockSink, BlockSource, block_inputs, block_tensors, restore, this_rank_windows
from .config import GPTQConfig, MethodConfig
from .experts import expert_hessians
from .layer import LayerReport, make_rounding, solve_layer
from .narrow import cast_inputs, twin
from .passes import Inputs, PassTimes, attention_cache, collect_hessians, replay_outputs, run_block
from .resume import BlockState

# Calibration tokens per forward batch (whole windows, at least one). Each batch's activations are a pass's
# temporaries. On the CPU 1024 had the least CPU time and, with 512, the lowest peak memory of the sizes tried
# (docs/decisions/code-constants.md); on a GPU larger batches keep the kernels busy:
# 4096 there (not measured).
BATCH_TOKENS = 1024
BATCH_TOKENS_GPU = 4096


def batch_tokens_on(device: torch.device) -> int:
    """The default calibration tokens per forward batch on `device` (BATCH_TOKENS above)."""
    return BATCH_TOKENS if device.type == "cpu" else BATCH_TOKENS_GPU


@dataclass
class StageTimes(PassTimes):
    """Where a run's seconds went (benchmarks): forward passes, Hessian accumulation, solver, error report."""

    solver: float = 0.0
    report: float = 0.0


class QuantizeOutput(NamedTuple):
    layers: dict[str, QuantizedWeight]  # full module name -> codes (empty with a sink: they went there)
    reports: list[LayerReport]
    times: StageTimes


def check_finite(model: nn.Module) -> None:
    for name, p in model.named_parameters():
        if not torch.isfinite(p).all():
            raise UserError(f"the model weight {name} contains NaN or Inf values; fix or re-export the model first")


@dataclass
class _Run:
    """What every block of one quantize_model call shares."""

    spec: ArchSpec
    cfg: MethodConfig
    rounding: Rounding
    groups: (
        tuple[tuple[str, ...], ...] | None
    )  # None: traced from the first block quantized (block_groups.trace_groups)
    needs_data: bool
    rows: int  # calibration tokens on this rank
    rank: int
    size: int
    bar: tqdm
    passes_dtype: torch.dtype | None = None  # the passes' dtype where it is not the weights' (narrow.py)
    times: StageTimes = field(default_factory=StageTimes)
    expert_layers: frozenset[str] = field(init=False)  # the block's fused experts' layers (models/experts.py)

    def __post_init__(self) -> None:
        self.expert_layers = frozenset(n for fe in self.spec.experts for n in fe.layers())


def _quantize_group(
    run: _Run,
    blocks: tuple[nn.Module, nn.Module],
    i: int,
    g: int,
    group: tuple[str, ...],
    inputs: Inputs,
    attention,
    done: dict[str, QuantizedWeight],
    reports: list[LayerReport],
):
    """Solve one true-sequential group of block `i` and write its weights back; (replayed the block's output, the
    attention cache for the next group). A single Linear whose output is the block's (`residual + last(x)`) or the
    attention's is replayed or cut at instead of re-running the block (passes.py points 3-4). `blocks`: (the block,
    its passes' twin: itself, or a copy in run.passes_dtype, narrow.py); the solver reads the block's weights."""
    block, calib = blocks
    spec, cfg = run.spec, run.cfg
    single = group[0] if run.needs_data and cfg.true_sequential and len(group) == 1 else None
    replay = single if spec.residual_last and g == len(run.groups) - 1 else None
    cut = single if single == spec.attention_out and g < len(run.groups) - 1 else None
    until = cut.rpartition(".")[0] if cut else None
    experts = frozenset(n for n in group if n in run.expert_layers)
    if replay is not None and attention is not None:
        attention.last = True  # the block's last pass: its attention outputs are let go batch by batch
    collected = (
        collect_hessians(calib, group, inputs, run.times, replay or cut, until, attention, experts)
        if run.needs_data
        else None
    )
    release_free_memory()  # before the solves: what the pass freed
    if run.size > 1 and run.needs_data:
        combine_hessians(collected.hessians, run.rows)
    routed = expert_hessians(collected.hessians, collected.rows, group, spec.experts) if experts and collected else {}
    owners = [j % run.size for j in range(len(group))]
    results = [
        _solve(
            block, spec, f"{spec.blocks}.{i}.{name}", name, collected, run.rounding, cfg, run.times, routed.get(name)
        )
        if owner == run.rank
        else None
        for name, owner in zip(group, owners)
    ]
    if run.size > 1:
        results = share(results, owners)
    for name, (qw, report) in zip(group, results):
        module = block.get_submodule(name)
        # the codes go to the weight's device, not a float32 matrix; exact products there: the same bits everywhere
        set_weight_matrix(module, spec, qw.to(module.weight.device).dequantize())
        if calib is not block:
            set_weight_matrix(calib.get_submodule(name), spec, weight_matrix(module, spec))
        done[report.name] = qw
        reports.append(report)
        err_txt = " ".join(f"{r}b={e:.2e}" for r, e in report.rel_error.items())
        run.bar.set_postfix_str(f"{report.name} {err_txt}".strip())
        run.bar.update(1)
    release_free_memory()  # what the solves freed, before the replay or the next pass
    if replay is not None:
        replay_outputs(calib.get_submodule(replay), inputs, collected.kept, run.times)
    if cut is not None:
        attention = attention_cache(calib.get_submodule(until), calib.get_submodule(cut), collected, run.times)
    return replay is not None, attention


def _quantize_block(run: _Run, block: nn.Module, i: int, inputs: Inputs, reports: list[LayerReport]):
    """Quantize every group of block `i` in order; (its layers, the next block's inputs)."""
    done: dict[str, QuantizedWeight] = {}
    replayed, attention = False, None
    calib = twin(block, run.passes_dtype) if run.needs_data else block
    with ExitStack() as stack:  # fused experts: one proxy Linear per expert projection, in the block and its twin
        for b in (block,) if calib is block else (block, calib):
            stack.enter_context(calibration_experts(b, run.spec.experts))
        if run.groups is None:
            run.groups = trace_groups(calib, run.spec.layers, inputs, run.spec.experts)
        for g, all_names in enumerate(run.groups):
            group = tuple(n for n in all_names if not run.cfg.skips(f"{run.spec.blocks}.{i}.{n}"))
            run.bar.update(len(all_names) - len(group))
            if group:
                was_replayed, attention = _quantize_group(
                    run, (block, calib), i, g, group, inputs, attention, done, reports
                )
                replayed |= was_replayed
                release_free_memory()  # what the group's passes and solves freed (execution/memory.py)
    if run.needs_data and not replayed:
        inputs = [(out, kw) for out, (_, kw) in zip(run_block(calib, inputs, run.times), inputs)]
    return done, inputs


@torch.no_grad()
def quantize_model(
    model: nn.Module,
    windows: torch.Tensor,
    cfg: MethodConfig,
    batch_tokens: int | None = None,
    progress: bool = True,
    rounding: Rounding | None = None,
    state: BlockState | None = None,
    device: torch.device | None = None,
    source: BlockSource | None = None,
    sink: BlockSink | None = None,
    passes_dtype: torch.dtype | None = None,
) -> QuantizeOutput:
    """Quantize every block Linear of `model` in place (weights become the dequantized master codes).

    `rounding` overrides the code choice derived from `cfg` (used by ablation scripts); `sink` takes each finished
    block instead of the returned `layers`; `state` (needs a sink) saves progress after every block and continues a
    killed run (resume.py); `source` supplies the blocks of a model not in memory; `device`: where to compute
    (module docstring); `passes_dtype`: the calibration passes' dtype where it is not the weights' (narrow.py).
    """
    spec = arch_spec(model)
    if source is None:
        check_finite(model)  # a lazy model's files were checked when it was opened
    if state is not None and sink is None:
        raise ValueError("a resumable run needs a sink for its finished blocks")
    blocks = get_blocks(model, spec)
    needs_data, (rank, size) = isinstance(cfg, GPTQConfig), world()
    groups = groups_for(spec, cfg, needs_data)
    windows = this_rank_windows(windows, spec, needs_data, rank, size)
    home = next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))
    device = torch.device(device) if device is not None else home
    batch_tokens = batch_tokens or batch_tokens_on(device)
    inputs = _first_inputs(model, spec, windows, batch_tokens, (device, home), passes_dtype) if needs_data else []
    if source is not None:
        source.free_outside()  # not needed again until the checkpoint is written (models/lazy.py)
    per_block = len(spec.layers)
    bar = tqdm(total=len(blocks) * per_block, desc="quantize", unit="layer", disable=not progress or rank > 0)
    rows = sum(h.shape[0] * h.shape[1] for h, _ in inputs)
    run = _Run(spec, cfg, rounding or make_rounding(cfg), groups, needs_data, rows, rank, size, bar, passes_dtype)
    layers: dict[str, QuantizedWeight] = {}
    reports: list[LayerReport] = []
    start = restore(model, spec, state, sink, source, cfg.width_of, len(blocks), inputs, reports)
    bar.update(start * per_block)
    for i in range(start, len(blocks)):
        block = source.load_block(i, device) if source is not None else blocks[i].to(device)
        done, inputs = _quantize_block(run, block, i, inputs, reports)
        _hand_over(spec, i, block, done, sink, layers)
        if state is not None:
            state.save(i + 1, reports, [h for h, _ in inputs])
        if source is not None:
            source.free_block(i)
        elif device != home:
            blocks[i].to(home)
    bar.close()
    if source is not None:
        inputs.clear()
        source.load_outside()
    return QuantizeOutput(layers, reports, run.times)


def _first_inputs(
    model: nn.Module,
    spec: ArchSpec,
    windows: torch.Tensor,
    batch_tokens: int,
    devices: tuple[torch.device, torch.device],
    passes_dtype: torch.dtype | None,
) -> Inputs:
    """The first block's inputs in forward batches of whole windows (`batch_tokens` tokens, at least one window),
    computed on `devices[0]` from the model at `devices[1]` (block_io.block_inputs), in the passes' dtype."""
    batch = max(1, batch_tokens // windows.shape[1])
    return cast_inputs(block_inputs(model, spec, windows, batch, *devices), passes_dtype)


def _hand_over(
    spec: ArchSpec,
    i: int,
    block: nn.Module,
    done: dict[str, QuantizedWeight],
    sink: BlockSink | None,
    layers: dict[str, QuantizedWeight],
) -> None:
    """Finished block `i`: its codes and other tensors to the sink, or without one its codes to `layers`."""
    prefix = f"{spec.blocks}.{i}."
    if sink is not None:
        sink.write_block(i, done, block_tensors(block, prefix, {n[len(prefix) :] for n in done}, spec))
    else:
        layers.update(done)


def _solve(
    block,
    spec,
    full: str,
    name: str,
    collected,
    rounding: Rounding,
    cfg: MethodConfig,
    times: StageTimes,
    routed: tuple[int, bool] | None = None,
) -> tuple[QuantizedWeight, LayerReport]:
    """Layer `name` of `block` (full module name `full`) solved (layer.py), its codes on the CPU; `routed`: a fused
    expert's (tokens, starved), recorded in its report (experts.py)."""
    w = weight_matrix(block.get_submodule(name), spec).float()
    qw, report, report_seconds = solve_layer(
        w, collected.hessians.get(name) if collected else None, full, rounding, cfg
    )
    if routed is not None:
        report = replace(report, tokens=routed[0], starved=routed[1])
    times.solver += report.seconds
    times.report += report_seconds
    return qw.to("cpu"), report
