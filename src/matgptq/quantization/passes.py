"""Forward passes over one decoder block that collect what the solver needs, and no more.

The sequential pipeline (pipeline.py) needs, for each true-sequential group of Linear layers of a block, the Hessian
H = (2/n) Σ x xᵀ of each layer's input over every calibration token, computed with the earlier groups already
quantized; and, at the end of the block, the block's outputs with every group quantized (the next block's inputs).
Three ways to cut the cost of those passes without changing a single result bit:

1. **One Hessian per distinct input.** Layers fed the very same tensor (q/k/v read one normalized input, gate/up
   another) share one accumulator: the same arithmetic on the same operands, done once.
2. **Stop at the group's last Linear.** A pass raises once every layer of its group has seen its input for the batch:
   whatever the block computes after that (attention after q/k/v, the MLP after o) cannot change the Hessians.
3. **Replay the last Linear instead of re-running the block** (`ArchSpec.residual_last`). In the supported blocks the
   output is `residual + last(x)` (Llama/Mistral/Qwen/Phi-3: `residual + down_proj(x)`, GPT-2: `residual + c_proj(x)`;
   dropout is the identity in eval mode). The last group's pass substitutes zeros for that Linear's output, so the block
   returns `residual + 0 = residual` exactly, and keeps x. After the group is quantized, `residual + last(x)` with the
   quantized layer is the same float operation on the same operands as a full re-run (addition commutes exactly in
   IEEE arithmetic), i.e. the next block's inputs bit for bit, for one Linear instead of a whole block. The price is
   holding x ([tokens, intermediate]) instead of a second copy of the hidden states; tests/quantization pin the
   equality against full re-runs for every architecture.

Hessian accumulation (the running mean of IST-DASLab/gptq `add_batch`): for each batch of n_new rows,
H ← H·n_old/(n_old+n_new) + (√(2/n)·X)ᵀ(√(2/n)·X) with n = n_old + n_new, in float32.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from ..models import ArchSpec, get_blocks

Inputs = list[tuple[torch.Tensor, dict]]  # per batch of windows: (hidden states, keyword arguments of the block)


class _StopForward(Exception):
    pass


@dataclass
class PassTimes:
    """Seconds spent, summed over passes: forward compute (excluding hooks) and Hessian accumulation."""

    forward: float = 0.0
    hessian: float = 0.0
    forward_passes: int = 0  # block runs (a stopped run counts as one)


@dataclass
class _Accumulator:
    hessian: torch.Tensor | None = None
    rows: int = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1]).float()
        if self.hessian is None:
            self.hessian = torch.zeros(x.shape[1], x.shape[1])
        n_old, n_new = self.rows, x.shape[0]
        self.hessian.mul_(n_old / (n_old + n_new))
        self.rows = n_old + n_new
        x = x * math.sqrt(2 / self.rows)
        self.hessian.addmm_(x.T, x)


@dataclass
class _Collector:
    """Forward hooks on the layers of one group: shared accumulators, early stop, optional zeroed last output."""

    layers: dict[str, nn.Module]
    times: PassTimes
    stop_early: bool
    replay: str | None = None  # name of the layer whose output is replaced by zeros and whose input is kept
    kept: list[torch.Tensor] = field(default_factory=list)
    owner: dict[str, int] = field(default_factory=dict)  # layer name -> index of its accumulator
    accumulators: list[_Accumulator] = field(default_factory=list)
    _seen: list[tuple[torch.Tensor, int]] = field(default_factory=list)  # this batch's distinct inputs
    _fired: set[str] = field(default_factory=set)  # layers that have run in this batch

    def start_batch(self) -> None:
        self._seen, self._fired = [], set()

    def hook(self, name: str):
        def fn(module, args, output):
            t0 = time.perf_counter()
            x = args[0]
            index = next((i for t, i in self._seen if t is x), None)
            if index is None:  # a new input in this batch: the layer's own accumulator (a new one on first sight)
                index = self.owner.get(name, len(self.accumulators))
                if index == len(self.accumulators):
                    self.accumulators.append(_Accumulator())
                if any(i == index for _, i in self._seen):
                    raise RuntimeError(f"{name} shared its input inconsistently across calibration batches")
                self._seen.append((x, index))
                self.accumulators[index].add(x)
            if self.owner.setdefault(name, index) != index:  # sharing must not change between batches
                raise RuntimeError(f"{name} shared its input inconsistently across calibration batches")
            self._fired.add(name)
            result = None
            if name == self.replay:
                self.kept.append(x.detach())
                result = torch.zeros_like(output)
            self.times.hessian += time.perf_counter() - t0
            if self.stop_early and len(self._fired) == len(self.layers):
                raise _StopForward
            return result

        return fn

    def hessians(self) -> dict[str, torch.Tensor]:
        return {name: self.accumulators[i].hessian for name, i in self.owner.items()}


def block_output(out) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def run_block(block: nn.Module, inputs: Inputs, times: PassTimes | None = None) -> list[torch.Tensor]:
    """The block's outputs for every batch (a plain forward)."""
    t0, outs = time.perf_counter(), []
    for hidden, kwargs in inputs:
        outs.append(block_output(block(hidden, **kwargs)))
    if times is not None:
        times.forward += time.perf_counter() - t0
        times.forward_passes += 1
    return outs


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


@torch.no_grad()
def collect_hessians(block: nn.Module, names: tuple[str, ...], inputs: Inputs, times: PassTimes,
                     replay: str | None = None) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:  # fmt: skip
    """Hessians of the layers `names` of `block` on `inputs`.

    Without `replay` the pass stops at the group's last Linear and returns (hessians, []). With `replay` (the one layer
    of the block's last group, see the module docstring) it runs to the end with that layer's output zeroed, replaces
    each batch's hidden states in `inputs` by the block's residual (so one copy of the activations is alive), and
    returns (hessians, that layer's input per batch) for `replay_outputs`.
    """
    layers = {n: block.get_submodule(n) for n in names}
    collector = _Collector(layers, times, stop_early=replay is None, replay=replay)
    handles = [m.register_forward_hook(collector.hook(n)) for n, m in layers.items()]
    t0, hessian0 = time.perf_counter(), times.hessian
    try:
        for b, (hidden, kwargs) in enumerate(inputs):
            collector.start_batch()
            try:
                residual = block_output(block(hidden, **kwargs))
            except _StopForward:
                continue
            if replay is not None:
                inputs[b] = (residual, kwargs)
    finally:
        for h in handles:
            h.remove()
    times.forward += time.perf_counter() - t0 - (times.hessian - hessian0)
    times.forward_passes += 1
    missing = set(names) - set(collector.owner)
    if missing:
        raise RuntimeError(f"the block never called {sorted(missing)}; its ArchSpec groups are wrong")
    return collector.hessians(), collector.kept


@torch.no_grad()
def replay_outputs(layer: nn.Module, inputs: Inputs, kept: list[torch.Tensor], times: PassTimes) -> None:
    """Turn the residuals left in `inputs` by a replay pass into the block's outputs, `residual + layer(x)`, in place."""
    t0 = time.perf_counter()
    for b, ((residual, kwargs), x) in enumerate(zip(inputs, kept, strict=True)):
        inputs[b] = (residual + layer(x), kwargs)
    kept.clear()
    times.forward += time.perf_counter() - t0
