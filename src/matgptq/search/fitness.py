"""Fitness of a mix: KL(unquantized ‖ candidate) on calibration windows, the candidate built in memory from a parent.

    F(mix; W) = (1 / |W|·(L − 1)) Σ_{w ∈ W} Σ_{t=1}^{L−1} Σ_v p_v(w, t) (log p_v(w, t) − log q_v(w, t))

with p the unquantized model's and q the candidate's next-token distribution at the predicted positions of the
windows W (length L): the mean per-token KL of `evaluation.perplexity.score`, and EvoPress' fitness (prior-art §2:
KL(teacher ‖ student) on log-softmaxes). The teacher is `evaluation.teacher.Teacher`: the reference's final hidden
states spilled to a temporary file plus its head, so the reference distribution is recomputed exactly, chunk by chunk,
and memory does not grow with the calibration tokens (128k vocabulary, 500k tokens, hidden 4096: 8 GB of disk, one
batch of hidden states and one CHUNK_ELEMENTS chunk in RAM — instead of 500k × 128k × 2 bytes = 128 GB of fp16 logits).

A candidate is made by `runtime.set_bits`, which re-slices only the layers whose width changed (no file reads).

Prefix cache (issue #10 item 4). A mutation changes a few layers; every block before the first changed one computes
exactly what the stage's reference mix computed. `prefix_cache(mix, windows)` runs that mix once and keeps each
batch's output of every block; a candidate whose first changed block is j then runs blocks j.. only — blocks 0..j−1
are swapped, for that call, for a module that returns the cached output of block j−1. Same batches, same arithmetic:
the KL is bit-identical to a full pass (tested). Memory: blocks × windows × L × hidden × 4 bytes; above
`cache_limit` bytes (default 1 GiB) no cache is made and candidates run in full.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..evaluation.teacher import CHUNK_ELEMENTS, Teacher, body_and_head
from ..models import arch_spec, get_blocks
from ..runtime import set_bits

Mix = tuple[int, ...]  # one width per layer, in the parent's layer order


class _Replay(nn.Module):
    """Stands in for a decoder block: returns a stored output, whatever it is given."""

    def __init__(self, output) -> None:
        super().__init__()
        self.output = output

    def forward(self, *args, **kwargs):
        return self.output


@dataclass
class PrefixCache:
    """Block outputs of `mix` on `windows`, per batch: outputs[batch][block]."""

    mix: Mix
    windows: tuple[int, ...]
    outputs: list[list[torch.Tensor]]


class Fitness:
    """Scores mixes of a loaded parent (`matgptq.load`) against a teacher built on `windows` [n, L]."""

    def __init__(self, model, teacher: Teacher, windows: torch.Tensor, names: tuple[str, ...], batch_size: int = 8,
                 cache_limit: int = 1 << 30) -> None:  # fmt: skip
        if tuple(teacher.windows_shape) != tuple(windows.shape):
            raise ValueError("the teacher was built on other windows")
        self.model, self.teacher, self.windows, self.names = model, teacher, windows, tuple(names)
        self.batch_size, self.cache_limit = batch_size, cache_limit
        self.body, self.head = body_and_head(model)
        spec = arch_spec(model.config.model_type)
        self.blocks = get_blocks(model, spec)
        prefix = spec.blocks + "."
        self.block_of = tuple(int(n[len(prefix):].split(".")[0]) if n.startswith(prefix) else 0 for n in self.names)
        self.evaluations = 0  # candidate scorings so far
        self.tokens = 0  # predicted positions scored so far

    def apply(self, mix: Mix) -> None:
        set_bits(self.model, dict(zip(self.names, mix)))

    def first_changed_block(self, a: Mix, b: Mix) -> int:
        changed = [self.block_of[i] for i, (x, y) in enumerate(zip(a, b)) if x != y]
        return min(changed) if changed else len(self.blocks)

    def _batches(self, windows: tuple[int, ...]) -> list[list[int]]:
        return [list(windows[i : i + self.batch_size]) for i in range(0, len(windows), self.batch_size)]

    @torch.no_grad()
    def prefix_cache(self, mix: Mix, windows: tuple[int, ...]) -> PrefixCache | None:
        """Block outputs of `mix` on `windows`, or None when they would take more than `cache_limit` bytes."""
        if len(self.blocks) * len(windows) * self.windows.shape[1] * self.body.hidden_size * 4 > self.cache_limit:
            return None
        self.apply(mix)
        outputs: list[list[torch.Tensor]] = []
        for batch in self._batches(windows):
            seen: list[torch.Tensor] = []
            hooks = [b.register_forward_hook(lambda m, i, o: seen.append(o)) for b in self.blocks]
            try:
                self.body(self.windows[batch])
            finally:
                for h in hooks:
                    h.remove()
            outputs.append(seen)
        return PrefixCache(tuple(mix), tuple(windows), outputs)

    @torch.no_grad()
    def kl(self, mix: Mix, windows: tuple[int, ...], cache: PrefixCache | None = None) -> float:
        """F(mix; windows): mean KL per predicted token."""
        self.apply(mix)
        skip = 0
        if cache is not None:
            if cache.windows != tuple(windows):
                raise ValueError("the prefix cache was built on other windows")
            skip = self.first_changed_block(cache.mix, tuple(mix))
        total, count = 0.0, 0
        for b, batch in enumerate(self._batches(windows)):
            hidden = self._hidden(batch, cache.outputs[b][skip - 1] if skip else None, skip)
            ref = torch.cat([self.teacher.hidden(w, w + 1) for w in batch])
            total += self._kl_sum(ref, hidden)
            count += hidden.shape[0]
        self.evaluations += 1
        self.tokens += count
        return total / count

    def _hidden(self, batch: list[int], replay, skip: int) -> torch.Tensor:
        saved = [self.blocks[i] for i in range(skip)]
        for i in range(skip):
            self.blocks[i] = _Replay(replay)
        try:
            return self.body(self.windows[batch])[:, :-1].reshape(-1, self.body.hidden_size)
        finally:
            for i, block in enumerate(saved):
                self.blocks[i] = block

    def _kl_sum(self, ref_hidden: torch.Tensor, hidden: torch.Tensor) -> float:
        """Σ over rows of KL(p ‖ q), in vocabulary chunks of ≤ CHUNK_ELEMENTS floats (as evaluation.perplexity)."""
        total = 0.0
        chunk = max(1, CHUNK_ELEMENTS // self.head.out_features)
        for c0 in range(0, hidden.shape[0], chunk):
            logq = F.log_softmax(self.head(hidden[c0 : c0 + chunk]).float(), -1)
            logp = self.teacher.logprobs(ref_hidden[c0 : c0 + chunk])
            total += float((logp.exp() * (logp - logq)).sum(dtype=torch.float64))
        return total
