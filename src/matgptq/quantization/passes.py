"""Forward passes over one decoder block that collect what the solver needs, and no more.

The sequential pipeline (pipeline.py) needs, for each true-sequential group of Linear layers of a block, the Hessian
H = (2/n) Σ x xᵀ of each layer's input over every calibration token, computed with the earlier groups already
quantized; and, at the end of the block, the block's outputs with every group quantized (the next block's inputs).
Four ways to cut the cost of those passes without changing a single result bit:

1. **One Hessian per distinct input.** Layers fed the very same tensor (q/k/v read one normalized input, gate/up
   another) share one accumulator: the same arithmetic on the same operands, done once.
2. **Stop before the group's last Linear runs.** The Hessians need the layers' inputs only, so they are taken in
   forward *pre*-hooks, and a pass raises as soon as every layer of its group has been seen for the batch: neither
   the group's last Linear nor anything after it (attention after q/k/v, the MLP after o) is computed. From the
   second batch on, a pass stops as soon as every layer's input has been seen: the first batch shows which layers
   read one tensor (q/k/v, gate/up), so none of them runs at all (the block's code, hence the sharing, is the same
   for every batch).
3. **Replay the attention's output projection** (`ArchSpec.attention_out`). In the supported blocks the attention
   module's output is `(o(y), weights)`: o (o_proj, GPT-2's c_proj followed by an eval-mode dropout, the identity)
   is its last operation. The o group's pass substitutes zeros for o's output, checks that the attention module
   returns that very tensor, and keeps y. Once o is quantized, `o(y)` is computed once per batch, and the later
   passes of the block substitute it for the whole attention module (its weights are discarded by every block
   listed), so q/k/v, the attention and o run once per block instead of once per later group. Same operands, same
   operations: the very same bits as a re-run.
4. **Replay the last Linear instead of re-running the block** (`ArchSpec.residual_last`). In the supported blocks the
   output is `residual + last(x)` (Llama/Mistral/Qwen/Phi-3: `residual + down_proj(x)`, GPT-2: `residual + c_proj(x)`;
   dropout is the identity in eval mode). The last group's pass substitutes zeros for that Linear's output (without
   computing it), so the block returns `residual + 0 = residual` exactly, and keeps x. After the group is quantized,
   `residual + last(x)` with the quantized layer is the same float operation on the same operands as a full re-run
   (addition commutes exactly in IEEE arithmetic), i.e. the next block's inputs bit for bit, for one Linear instead of
   a whole block. The price is holding x ([tokens, intermediate]) instead of a second copy of the hidden states,
   in one buffer for all batches: kept batch by batch, the copies were interleaved on the heap with the pass's
   freed temporaries, which could then not be handed back (a higher peak of resident memory:
   docs/decisions/code-constants.md).

tests/quantization/test_passes.py pins the equality of all four against the plain pipeline for every architecture.

The Hessians are accumulated batch by batch (hessian.py).
"""

from __future__ import annotations

import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn

from .algorithm.hessian import Accumulator

Inputs = list[tuple[torch.Tensor, dict]]  # per batch of windows: (hidden states, keyword arguments of the block)


class _StopForward(Exception):
    pass


@dataclass
class PassTimes:
    """Seconds spent, summed over passes: forward compute (excluding hooks) and Hessian accumulation."""

    forward: float = 0.0
    hessian: float = 0.0
    forward_passes: int = 0  # block runs (a stopped run counts as one)


class Collected(NamedTuple):
    hessians: dict[str, torch.Tensor]  # layer name -> its Hessian (layers that share an input share the tensor)
    kept: list[torch.Tensor]  # per batch, the input of the zeroed layer
    arity: int  # length of the output tuple of the module the pass ended at (0: it ran to the block's end)
    rows: dict[str, int]  # layer name -> the rows (tokens) its Hessian averages


@dataclass
class AttentionCache:
    """The attention module's output per batch with its output projection quantized (module docstring, point 3);
    `forward` stands in for the module's own in the later passes of the block."""

    module: nn.Module
    outputs: list[torch.Tensor]
    arity: int  # length of the module's output tuple; the elements after the first (attention weights) become None
    batch: int = 0  # the batch being run
    last: bool = False  # the block's last pass: each batch's output is let go as it is handed out

    def forward(self, *args, **kwargs):
        out = self.outputs[self.batch]
        if self.last:
            self.outputs[self.batch] = None
        return (out,) + (None,) * (self.arity - 1)


@dataclass
class _Collector:
    """Forward pre-hooks on the layers of one group: shared accumulators, early stop, the zeroed layer's input kept."""

    layers: dict[str, nn.Module]
    times: PassTimes
    stop_early: bool
    zeroed: str | None = None  # the layer whose output is replaced by zeros (not computed) and whose input is kept
    kept: list[torch.Tensor] = field(default_factory=list)
    owner: dict[str, int] = field(default_factory=dict)  # layer name -> index of its accumulator
    accumulators: list[Accumulator] = field(default_factory=list)
    arity: int = 0  # length of the output tuple of the module the pass ends at (`until`)
    _zeros: torch.Tensor | None = None  # this batch's substituted output of the zeroed layer
    _seen: list[tuple[torch.Tensor, int]] = field(default_factory=list)  # this batch's distinct inputs
    _fired: set[str] = field(default_factory=set)  # layers that have been called in this batch
    kept_rows: int = 0  # rows of all batches' inputs: the kept inputs' buffer is allocated once for them
    _buffer: torch.Tensor | None = None
    _used: int = 0  # rows of the buffer filled

    def start_batch(self) -> None:
        self._seen, self._fired, self._zeros = [], set(), None

    def hook(self, name: str):
        def fn(module, args):
            t0 = time.perf_counter()
            x = args[0]
            index = next((i for t, i in self._seen if t is x), None)
            if index is None:  # a new input in this batch: the layer's own accumulator (a new one on first sight)
                index = self.owner.get(name, len(self.accumulators))
                if index == len(self.accumulators):
                    self.accumulators.append(Accumulator())
                if any(i == index for _, i in self._seen):
                    raise RuntimeError(f"{name} shared its input inconsistently across calibration batches")
                self._seen.append((x, index))
                self.accumulators[index].add(x)
            if self.owner.setdefault(name, index) != index:  # sharing must not change between batches
                raise RuntimeError(f"{name} shared its input inconsistently across calibration batches")
            self._fired.add(name)
            if name == self.zeroed:
                self._keep(x.detach())
            self.times.hessian += time.perf_counter() - t0
            if self.stop_early and (len(self._fired) == len(self.layers) or self._rest_shared()):
                raise _StopForward

        return fn

    def _keep(self, x: torch.Tensor) -> None:
        """Keep a copy of this batch's input of the zeroed layer in one buffer for every batch, allocated at the first
        (module docstring, point 4: one tensor per batch would be interleaved on the heap with the pass's freed
        temporaries, which then cannot be handed back). The zeroed layer reads one row per token of the block's
        input (its output is the block's or the attention's), so `kept_rows` rows hold every batch."""
        n = x[..., 0].numel()
        if self._buffer is None:
            self._buffer = torch.empty(self.kept_rows, x.shape[-1], dtype=x.dtype, device=x.device)
        view = self._buffer[self._used : self._used + n].view(x.shape)
        view.copy_(x)
        self._used += n
        self.kept.append(view)

    def _rest_shared(self) -> bool:
        """Every layer of the group, fired or not, reads an input already accumulated in this batch. Known from the
        second batch on (the first records who shares what and checks it); from then on, layers that share the
        first one's input (k and v after q, up after gate) are not run just to be seen."""
        seen = {i for _, i in self._seen}
        return len(self.owner) == len(self.layers) and all(self.owner[n] in seen for n in self.layers)

    def zeros(self, x: torch.Tensor) -> torch.Tensor:
        """Stands in for the zeroed layer's forward: its output shape, all zeros, nothing computed."""
        layer = self.layers[self.zeroed]
        out_features = getattr(layer, "out_features", None) or layer.nf  # nn.Linear, or transformers' Conv1D
        self._zeros = torch.zeros(*x.shape[:-1], out_features, dtype=x.dtype, device=x.device)
        return self._zeros

    def end(self, module, args, output):
        """Forward hook of the module the pass ends at: its output must be the zeroed layer's, untouched."""
        if not (isinstance(output, tuple) and output[0] is self._zeros):
            raise RuntimeError(
                f"the output of {type(module).__name__} is not its {self.zeroed}'s output; "
                "its ArchSpec.attention_out is wrong"
            )
        self.arity = len(output)
        raise _StopForward

    def hessians(self) -> dict[str, torch.Tensor]:
        return {name: self.accumulators[i].hessian for name, i in self.owner.items()}

    def rows(self) -> dict[str, int]:
        return {name: self.accumulators[i].rows for name, i in self.owner.items()}


@contextmanager
def _substituted(module: nn.Module, forward):
    """`module` computes `forward` instead of its own for the duration (its hooks still run)."""
    module.forward = forward
    try:
        yield
    finally:
        del module.forward


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
def collect_hessians(
    block: nn.Module,
    names: tuple[str, ...],
    inputs: Inputs,
    times: PassTimes,
    zeroed: str | None = None,
    until: str | None = None,
    attention: AttentionCache | None = None,
    optional: frozenset[str] = frozenset(),
) -> Collected:
    """Hessians of the layers `names` of `block` on `inputs`, and the input of the `zeroed` layer per batch.

    Without `zeroed` the pass stops before the group's last Linear runs and nothing is kept. With `zeroed` (the
    one layer of its group, see the module docstring) that layer's output is zeros and its input is kept; the pass
    ends at the module `until` (the attention, point 3: its output must be the zeros) or, with `until=None`, at the
    end of the block (point 4): each batch's hidden states in `inputs` are then replaced by the block's residual, so
    one copy of the activations is alive. `attention` stands in for the attention module (point 3). Layers in
    `optional` (fused experts) may never be called: they then have no Hessian.
    """
    layers = {n: block.get_submodule(n) for n in names}
    collector = _Collector(
        layers, times, stop_early=zeroed is None, zeroed=zeroed, kept_rows=sum(h[..., 0].numel() for h, _ in inputs)
    )
    t0, hessian0 = time.perf_counter(), times.hessian
    with ExitStack() as stack:
        for n, m in layers.items():
            stack.callback(m.register_forward_pre_hook(collector.hook(n)).remove)
        if zeroed is not None:
            stack.enter_context(_substituted(layers[zeroed], collector.zeros))
        if until is not None:
            stack.callback(block.get_submodule(until).register_forward_hook(collector.end).remove)
        if attention is not None:
            stack.enter_context(_substituted(attention.module, attention.forward))
        for b, (hidden, kwargs) in enumerate(inputs):
            collector.start_batch()
            if attention is not None:
                attention.batch = b
            try:
                residual = block_output(block(hidden, **kwargs))
            except _StopForward:
                continue
            if zeroed is not None:
                inputs[b] = (residual, kwargs)
    times.forward += time.perf_counter() - t0 - (times.hessian - hessian0)
    times.forward_passes += 1
    missing = set(names) - set(collector.owner) - optional
    if missing:
        raise RuntimeError(f"the block never called {sorted(missing)}; its ArchSpec groups are wrong")
    if until is not None and collector.arity == 0:
        raise RuntimeError(f"the block never returned from {until}; its ArchSpec.attention_out is wrong")
    return Collected(collector.hessians(), collector.kept, collector.arity, collector.rows())


@torch.no_grad()
def attention_cache(module: nn.Module, layer: nn.Module, collected: Collected, times: PassTimes) -> AttentionCache:
    """The attention module's outputs, `layer(y)` for the kept inputs y of its (now quantized) output projection."""
    t0 = time.perf_counter()
    outputs = [layer(y) for y in collected.kept]
    collected.kept.clear()
    times.forward += time.perf_counter() - t0
    return AttentionCache(module, outputs, collected.arity)


@torch.no_grad()
def replay_outputs(layer: nn.Module, inputs: Inputs, kept: list[torch.Tensor], times: PassTimes) -> None:
    """Turn the residuals left in `inputs` by a replay pass into the block's outputs, `residual + layer(x)`, in place;
    the kept inputs are let go."""
    t0 = time.perf_counter()
    if len(kept) != len(inputs):
        raise ValueError(f"{len(kept)} kept inputs for {len(inputs)} batches")
    for b, (residual, kwargs) in enumerate(inputs):
        inputs[b] = (residual + layer(kept[b]), kwargs)
    kept.clear()
    times.forward += time.perf_counter() - t0
