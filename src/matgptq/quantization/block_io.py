"""What the block loop (pipeline.py) takes in and hands out around its solves: the first block's inputs (the model
run on this rank's calibration windows up to its first block, the modules before the blocks visiting the device),
where blocks come from when the model is not in memory (BlockSource) and where finished ones go (BlockSink, with the
tensors `block_tensors` gives), and a killed run taken up again from its resume state (`restore`, resume.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Protocol

import torch
from torch import nn

from ..errors import UserError
from ..execution import shard
from ..formats import QuantizedWeight
from ..models import ArchSpec, get_blocks, set_layer_weight, weight_keys
from .layer import LayerReport
from .passes import Inputs
from .resume import BlockState


class _Captured(Exception):
    """Raised by the first block's stand-in once it has its inputs: nothing after it runs."""


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
            raise _Captured

    blocks[0] = Catcher()
    try:
        for b0 in range(0, windows.shape[0], batch):
            try:
                model(windows[b0 : b0 + batch], use_cache=False)
            except _Captured:
                pass
    finally:
        blocks[0] = first
    return captured


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


def block_inputs(
    model: nn.Module, spec, windows: torch.Tensor, batch: int, device: torch.device, home: torch.device
) -> Inputs:
    """The first block's inputs for every calibration window (the modules before the blocks visit `device`)."""
    if device == home:
        return capture_block_inputs(model, spec, windows, batch)
    with _outside_blocks_on(model, spec, device, home):
        return capture_block_inputs(model, spec, windows.to(device), batch)


def this_rank_windows(windows: torch.Tensor, spec: ArchSpec, needs_data: bool, rank: int, size: int) -> torch.Tensor:
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


def block_tensors(block: nn.Module, prefix: str, quantized: set[str], spec: ArchSpec) -> dict[str, torch.Tensor]:
    """A block's state-dict tensors except its quantized layers' weights, under their full names, on the CPU."""
    weights = weight_keys(quantized, spec)
    return {prefix + k: v.cpu() for k, v in block.state_dict().items() if k not in weights}


def restore(
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
    reports.extend(LayerReport.from_json(r) for r in restored.reports)
    return restored.done
