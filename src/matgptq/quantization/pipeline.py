"""Sequential, memory-bounded quantization of a decoder-only HF model, one block at a time.

1. Run the calibration windows up to the first block and keep its inputs (and the keyword arguments the model passes
   to blocks: masks, position embeddings), one tensor per batch of windows.
2. For each block and each true-sequential group of Linear layers: one pass of the block on the current inputs
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
   continues from the first unfinished block.
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

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Callable, NamedTuple, Protocol

import torch
from torch import nn
from tqdm.auto import tqdm

from ..errors import UserError
from ..execution import combine_hessians, release_free_memory, shard, share, world
from ..formats import QuantizedWeight
from ..models import ArchSpec, arch_spec, get_blocks, set_layer_weight, set_weight_matrix, weight_keys, weight_matrix
from ..models.experts import calibration_experts
from .algorithm.grid import Rounding
from .config import GPTQConfig, MethodConfig
from .experts import expert_hessians
from .layer import LayerReport, make_rounding, solve_layer
from .narrow import cast_inputs, twin
from .passes import (
    Inputs,
    PassTimes,
    attention_cache,
    capture_block_inputs,
    collect_hessians,
    replay_outputs,
    run_block,
    trace_groups,
)
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


class BlockSink(Protocol):
    """Where finished blocks go (formats.staged.StagedCheckpoint): quantized layers and other tensors, on the CPU."""

    def write_block(self, block: int, layers: dict[str, QuantizedWeight], tensors: dict[str, torch.Tensor]) -> None: ...

    def read_layers(self, block: int, width: Callable[[str], int]) -> dict[str, QuantizedWeight]: ...


class BlockSource(Protocol):
    """Where blocks come from when the model is not in memory (models.lazy.LazyModel)."""

    def load_block(self, i: int, device: torch.device) -> nn.Module: ...

    def free_block(self, i: int) -> None: ...

    def free_outside(self) -> None: ...

    def load_outside(self) -> None: ...


def check_finite(model: nn.Module) -> None:
    for name, p in model.named_parameters():
        if not torch.isfinite(p).all():
            raise UserError(f"the model weight {name} contains NaN or Inf values; fix or re-export the model first")


@contextmanager
def _outside_blocks_on(model: nn.Module, spec, device: torch.device, home: torch.device):
    """The modules outside the decoder blocks (embeddings, rotary tables, ...) on `device` for the duration, then
    back `home`; the blocks stay where they are."""
    parent, _, attr = spec.blocks.rpartition(".")
    holder = model.get_submodule(parent) if parent else model
    blocks = getattr(holder, attr)
    setattr(holder, attr, nn.ModuleList())
    try:
        model.to(device)
        setattr(holder, attr, blocks)
        yield
    finally:
        setattr(holder, attr, nn.ModuleList())
        model.to(home)
        setattr(holder, attr, blocks)


def block_tensors(block: nn.Module, prefix: str, quantized: set[str], spec: ArchSpec) -> dict[str, torch.Tensor]:
    """A block's state-dict tensors except its quantized layers' weights, under their full names, on the CPU."""
    weights = weight_keys(quantized, spec)
    return {prefix + k: v.cpu() for k, v in block.state_dict().items() if k not in weights}


@dataclass
class _Run:
    """What every block of one quantize_model call shares."""

    spec: ArchSpec
    cfg: MethodConfig
    rounding: Rounding
    groups: tuple[tuple[str, ...], ...] | None  # None: traced from the first block quantized (passes.trace_groups)
    needs_data: bool
    rows: int  # calibration tokens on this rank
    rank: int
    size: int
    times: StageTimes
    bar: tqdm
    expert_layers: frozenset[str] = frozenset()  # the block's fused experts' layers (models/experts.py)
    passes_dtype: torch.dtype | None = None  # the passes' dtype where it is not the weights' (narrow.py)


def _block_inputs(
    model: nn.Module, spec, windows: torch.Tensor, batch: int, device: torch.device, home: torch.device
) -> Inputs:
    """The first block's inputs for every calibration window (the modules before the blocks visit `device`)."""
    if device == home:
        return capture_block_inputs(model, spec, windows, batch)
    with _outside_blocks_on(model, spec, device, home):
        return capture_block_inputs(model, spec, windows.to(device), batch)


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
    groups = _groups(spec, cfg, needs_data)
    windows = _this_rank(windows, spec, needs_data, rank, size)
    home = next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))
    device = torch.device(device) if device is not None else home
    batch_tokens = batch_tokens or batch_tokens_on(device)
    batch = max(1, batch_tokens // windows.shape[1])
    inputs: Inputs = (
        cast_inputs(_block_inputs(model, spec, windows, batch, device, home), passes_dtype) if needs_data else []
    )
    if source is not None:
        source.free_outside()  # not needed again until the checkpoint is written (models/lazy.py)
    per_block = len(spec.layers)
    bar = tqdm(total=len(blocks) * per_block, desc="quantize", unit="layer", disable=not progress or rank > 0)
    run = _Run(
        spec,
        cfg,
        rounding or make_rounding(cfg),
        groups,
        needs_data,
        sum(h.shape[0] * h.shape[1] for h, _ in inputs),
        rank,
        size,
        StageTimes(),
        bar,
        frozenset(n for fe in spec.experts for n in fe.layers()),
        passes_dtype,
    )
    layers: dict[str, QuantizedWeight] = {}
    reports: list[LayerReport] = []
    start = _restore(model, spec, state, sink, source, cfg.width_of, len(blocks), inputs, reports)
    bar.update(start * per_block)
    for i in range(start, len(blocks)):
        block = source.load_block(i, device) if source is not None else blocks[i].to(device)
        done, inputs = _quantize_block(run, block, i, inputs, reports)
        prefix = f"{spec.blocks}.{i}."
        if sink is not None:
            sink.write_block(i, done, block_tensors(block, prefix, {n[len(prefix) :] for n in done}, spec))
        else:
            layers.update(done)
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


def _this_rank(windows: torch.Tensor, spec: ArchSpec, needs_data: bool, rank: int, size: int) -> torch.Tensor:
    """The calibration windows this process calibrates on (all of them in a single process)."""
    if size > 1 and spec.experts:
        raise UserError("mixture-of-experts models are quantized in one process: run without torchrun")
    if size == 1 or not needs_data:
        return windows
    if windows.shape[0] < size:
        raise UserError(
            f"{windows.shape[0]} calibration windows for {size} processes leave some without work; "
            "use fewer processes or more --nsamples"
        )
    return shard(windows, rank, size)


def _groups(spec: ArchSpec, cfg: MethodConfig, needs_data: bool) -> tuple[tuple[str, ...], ...] | None:
    """A block's groups: all layers at once without true-sequential, one layer at a time without data (RTN), the
    architecture's own where written out, else None (traced from the block's forward)."""
    if needs_data and not cfg.true_sequential:
        return (spec.layers,)
    if spec.groups is None and not needs_data:
        return tuple((n,) for n in spec.layers)
    return spec.groups


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


def _restore(
    model,
    spec,
    state: BlockState | None,
    sink: BlockSink | None,
    source: BlockSource | None,
    width: Callable[[str], int],
    n_blocks: int,
    inputs: Inputs,
    reports: list,
) -> int:
    """Continue a killed run: its reports, the next block's inputs (in place) and, for a model in memory, its
    finished layers written back into the model (read from the sink); returns the first block to quantize."""
    restored = state.load(n_blocks, len(inputs), like=[x for x, _ in inputs]) if state is not None else None
    if restored is None:
        return 0
    for b, hidden in enumerate(restored.hidden):
        inputs[b] = (hidden.to(inputs[b][0].device), inputs[b][1])
    if source is None:  # a lazy model's finished blocks are never read again
        for i in range(restored.done):
            for name, q in sink.read_layers(i, width).items():
                set_layer_weight(model, name, spec, q.dequantize())
    reports.extend(
        LayerReport(
            r["name"],
            tuple(r["shape"]),
            {int(k): v for k, v in r["rel_error"].items()},
            r["damp"],
            r["seconds"],
            r.get("tokens"),
            r.get("starved"),
        )
        for r in restored.reports
    )
    return restored.done
