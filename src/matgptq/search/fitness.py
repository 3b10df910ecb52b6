"""Fitness of a mix: KL(unquantized ‖ candidate) on calibration windows, the candidate built in memory from a parent.

    F(mix; W) = (1 / |W|·(L − 1)) Σ_{w ∈ W} Σ_{t=1}^{L−1} Σ_v p_v(w, t) (log p_v(w, t) − log q_v(w, t))

with p the unquantized model's and q the candidate's next-token distribution at the predicted positions of the
windows W (length L): the mean per-token KL of `evaluation.perplexity.score`, and EvoPress' fitness (prior-art §2:
KL(teacher ‖ student) on log-softmaxes). The teacher is `evaluation.teacher.Teacher`: the reference's final hidden
states spilled to a temporary file plus its head, so the reference distribution is recomputed exactly, chunk by chunk,
and memory does not grow with the calibration tokens (128k vocabulary, 500k tokens, hidden 4096: 8 GB of disk, one
batch of hidden states and one CHUNK_ELEMENTS chunk in RAM — instead of 500k × 128k × 2 bytes = 128 GB of fp16 logits).

A candidate is made by `runtime.set_bits`, which re-slices only the layers whose width changed (no file reads).

Per row, with z_t and z the teacher's and the candidate's logits, log p = z_t − lse(z_t), log q = z − lse(z):

    KL_row = Σ_v p_v (log p_v − log q_v) = [Σ_v p_v z_t,v − lse(z_t) Σ_v p_v] − Σ_v p_v z_v + lse(z) Σ_v p_v

The bracket and Σ p depend only on the windows, so a stage's candidates share them with p (`PrefixCache`); a candidate
then costs its own forward, one logsumexp and one row-wise dot product. Σ p is kept, not taken as 1: float32 p from a
float32 softmax sums to 1 ± ~1e-5 at a 49k vocabulary, and Σ p log p with that p would carry the same bias (~1e-5
nats per row, measured); written with the lse's, the offsets cancel. Rounding of what is left: each float32 product
p_v z_v is off by ≤ 2⁻²⁴ relative and the sums run in float64, so a dot product is within 6e-8 · max|z| per row —
~1e-6 nats at |z| ≈ 20, the size of the float32 rounding of log-softmax in the all-at-once formula.

Prefix cache (issue #10 item 4). A mutation changes a few layers; every block before the first changed one computes
exactly what the stage's reference mix computed. `prefix_cache(mix, windows)` runs that mix once and keeps each
batch's output of every block; a candidate whose first changed block is j then runs blocks j.. only — blocks 0..j−1
are swapped, for that call, for a module that returns the cached output of block j−1. The same cache keeps the
teacher part of the KL. Same batches, same arithmetic: the KL is bit-identical to a full pass (tested). Memory:
blocks × windows × L × hidden × 4 bytes for the block outputs, windows × L × (vocabulary + 4) × 4 bytes for the
teacher part; each is kept only within `cache_limit` bytes (default 1 GiB each), otherwise recomputed per candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
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


Terms = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # per chunk of rows: p, Σ p z_t − lse(z_t) Σ p, Σ p


@dataclass
class PrefixCache:
    """For `windows`, per batch: the block outputs of `mix` (outputs[batch][block]; None when over the memory limit)
    and the teacher part of the KL (teacher[batch]; None when over the limit)."""

    mix: Mix
    windows: tuple[int, ...]
    outputs: list[list[torch.Tensor]] | None
    teacher: list[Terms] | None


class Fitness:
    """Scores mixes of a loaded parent (`matgptq.load`) against a teacher built on `windows` [n, L]."""

    def __init__(self, model, teacher: Teacher, windows: torch.Tensor, names: tuple[str, ...], batch_size: int = 8,
                 cache_limit: int = 1 << 30) -> None:  # fmt: skip
        if tuple(teacher.windows_shape) != tuple(windows.shape):
            raise ValueError("the teacher was built on other windows")
        self.model, self.teacher, self.windows, self.names = model, teacher, windows, tuple(names)
        self.batch_size, self.cache_limit = batch_size, cache_limit
        self.body, self.head = body_and_head(model)
        self.device = self.head.weight.device  # windows go where the model is (search --device)
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
    def prefix_cache(self, mix: Mix, windows: tuple[int, ...]) -> PrefixCache:
        """Block outputs of `mix` and the teacher part on `windows`, each kept if it fits in `cache_limit` bytes."""
        rows = len(windows) * (self.windows.shape[1] - 1)
        teacher = None
        if rows * (self.head.out_features + 4) * 4 <= self.cache_limit:
            teacher = [self._teacher_terms(batch) for batch in self._batches(windows)]
        if len(self.blocks) * len(windows) * self.windows.shape[1] * self.body.hidden_size * 4 > self.cache_limit:
            return PrefixCache(tuple(mix), tuple(windows), None, teacher)
        self.apply(mix)
        outputs: list[list[torch.Tensor]] = []
        for batch in self._batches(windows):
            seen: list[torch.Tensor] = []
            hooks = [b.register_forward_hook(lambda m, i, o: seen.append(o)) for b in self.blocks]
            try:
                self.body(self.windows[batch].to(self.device))
            finally:
                for h in hooks:
                    h.remove()
            outputs.append(seen)
        return PrefixCache(tuple(mix), tuple(windows), outputs, teacher)

    @torch.no_grad()
    def kl(self, mix: Mix, windows: tuple[int, ...], cache: PrefixCache | None = None) -> float:
        """F(mix; windows): mean KL per predicted token."""
        self.apply(mix)
        skip = 0
        if cache is not None:
            if cache.windows != tuple(windows):
                raise ValueError("the prefix cache was built on other windows")
            if cache.outputs is not None:
                skip = self.first_changed_block(cache.mix, tuple(mix))
        total, count = 0.0, 0
        for b, batch in enumerate(self._batches(windows)):
            hidden = self._hidden(batch, cache.outputs[b][skip - 1] if skip else None, skip)
            terms = cache.teacher[b] if cache is not None and cache.teacher is not None else self._teacher_terms(batch)
            total += self._kl_sum(terms, hidden)
            count += hidden.shape[0]
        self.evaluations += 1
        self.tokens += count
        return total / count

    def count_elsewhere(self, evaluations: int, windows: tuple[int, ...]) -> None:
        """Count scorings of `windows` made by other processes (search/spread.py), so every rank reports the total."""
        self.evaluations += evaluations
        self.tokens += evaluations * len(windows) * (self.windows.shape[1] - 1)

    def _hidden(self, batch: list[int], replay, skip: int) -> torch.Tensor:
        saved = [self.blocks[i] for i in range(skip)]
        for i in range(skip):
            self.blocks[i] = _Replay(replay)
        try:
            return self.body(self.windows[batch].to(self.device))[:, :-1].reshape(-1, self.body.hidden_size)
        finally:
            for i, block in enumerate(saved):
                self.blocks[i] = block

    def _chunk(self) -> int:
        return max(1, CHUNK_ELEMENTS // self.head.out_features)  # rows per vocabulary-sized tensor

    @torch.no_grad()
    def _teacher_terms(self, batch: list[int]) -> Terms:
        ref = torch.cat([self.teacher.hidden(w, w + 1) for w in batch])
        terms = []
        for c0 in range(0, ref.shape[0], self._chunk()):
            zt = self.teacher.logits(ref[c0 : c0 + self._chunk()]).float().to(self.device)
            lse = torch.logsumexp(zt, -1, keepdim=True)
            p = (zt - lse).exp()
            mass = p.sum(-1, dtype=torch.float64)
            terms.append((p, (p * zt).sum(-1, dtype=torch.float64) - lse[:, 0].double() * mass, mass))
        return terms

    def _kl_sum(self, terms: Terms, hidden: torch.Tensor) -> float:
        """Σ over rows of KL(p ‖ q), chunk by chunk (the formula of the module docstring)."""
        total = 0.0
        for (p, teacher_part, mass), c0 in zip(terms, range(0, hidden.shape[0], self._chunk())):
            z = self.head(hidden[c0 : c0 + self._chunk()]).float()
            cross = (p * z).sum(-1, dtype=torch.float64)
            total += float((teacher_part - cross + torch.logsumexp(z, -1).double() * mass).sum())
        return total
