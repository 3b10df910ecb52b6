"""Fitness of a mix: KL(unquantized ‖ candidate) on calibration windows, the candidate built in memory from a parent.

    F(mix; W) = (1 / |W|·(L − 1)) Σ_{w ∈ W} Σ_{t=1}^{L−1} Σ_v p_v(w, t) (log p_v(w, t) − log q_v(w, t))

with p the unquantized model's and q the candidate's next-token distribution at the predicted positions of the
windows W (length L): the mean per-token KL of `evaluation.perplexity.score`, and EvoPress' fitness (prior-art §2:
KL(teacher ‖ student) on log-softmaxes). The teacher is `evaluation.teacher.Teacher`: the reference's final hidden
states spilled to a temporary file plus its head, so the reference distribution is recomputed exactly, chunk by chunk,
and memory does not grow with the calibration tokens (128k vocabulary, 500k tokens, hidden 4096: 8 GB of disk, one
batch of hidden states and one CHUNK_ELEMENTS chunk in RAM — instead of 500k × 128k × 2 bytes = 128 GB of fp16 logits).

A candidate is made by `runtime.set_bits`, which re-slices only the layers whose width changed (no file reads).

Per row, with z_t the teacher's logits and z = W h + b the candidate's (h its final hidden state, W and b its head),
log p = z_t − lse(z_t), log q = z − lse(z):

    KL_row = Σ_v p_v (log p_v − log q_v)
           = [Σ_v p_v z_t,v − lse(z_t) Σ_v p_v − Σ_v p_v b_v] − h · (Σ_v p_v W_v) + lse(z) Σ_v p_v
           =            const                               − h · g            + lse(z) · mass

const, g = pᵀW (one H-vector per row) and mass = Σ p depend only on the window, so they are computed once per
calibration window (`WindowTerms`, in float64) and a candidate costs its own forward, its logits and one logsumexp:
the vocabulary-wide product p·z of the direct formula is gone (on SmolLM2, V = 49,152, H = 576, it was a fifth of
a scoring's head cost, and the teacher's logits were recomputed for every stage). Memory: (H + 2) × 8 bytes per row
instead of V floats — 4.7 kB per SmolLM2 token, 77 MB for the default 16k-token pool; 8.4 MB per 256-token window at
H = 4096 — kept within `cache_limit` bytes (default 1 GiB), windows beyond it recomputed at each use.
Σ p is kept, not taken as 1: float32 p from a float32 softmax sums to 1 ± ~1e-5 at a 49k vocabulary, and Σ p log p
with that p would carry the same bias (~1e-5 nats per row, measured); written with the lse's, the offsets cancel.
Rounding: g is accumulated in float64 from the float32 p and W, and h · g is taken in float64, so the cross term is
exact to ~1e-12 relative; lse(z) uses the float32 logits, which are within ~1e-6 · |z| of W h + b (float32 GEMM), so
a row's KL is within ~1e-6 · max|z| (~2e-5 nats at |z| ≈ 20) of the exact value — the size of the float32 rounding
of the log-softmax in the all-at-once formula.

Precision of the candidates (`compute_dtype`). float32 (the class default) is exact as above. bfloat16 runs the
candidate's body under autocast (matrix products in bfloat16, the residual stream and norms in float32), the head and
the KL in float32 as above. On 13 mixes of SmolLM2 (its uniform 3-bit slice and 12 mutations, KL ≈ 0.88, spread
0.028) it moves the KL by +0.0002 ± 0.0014 and ranks them as float32 does (Spearman 0.995), while the same mix's KL
moves by 0.048 between disjoint draws of 8 windows — the noise the search already tolerates by drawing fresh windows
each stage; a generation is 1.3–1.5× faster on a CPU with native bfloat16 (scripts/bench_search.py). `exact()`
switches to float32 for the reported scores.

Prefix cache (issue #10 item 4). A mutation changes a few layers; every block before the first changed one computes
exactly what the stage's reference mix (the search's parent) computes. `prefix_cache(mix, windows)` holds, per batch,
the outputs of that mix's blocks 0..d−1, filled lazily by the scorings themselves: a candidate whose first changed
block is j replays blocks 0..min(j, d)−1 (swapped, for that call, for a module that returns the cached output of
block min(j, d)−1), runs the rest, and records its outputs of blocks d..j−1 — which are the reference mix's, its
weights there being the same — so d grows to j. No forward pass is spent on the cache itself (an eager cache cost a
full pass of the parent per stage, as much as it saved on SmolLM2: 75.2 vs 74.5 s per generation; the lazy one
saves 0–3% there, where a mutation's first changed block is ~6 of 30). Same batches,
same arithmetic: the KL is bit-identical to a full pass (tested). Memory: at most blocks × windows × L × hidden × 4
bytes, used only when that fits in `cache_limit` (otherwise every candidate runs from block 0).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from ..evaluation.teacher import CHUNK_ELEMENTS, Teacher, body_and_head
from ..models import arch_spec, get_blocks
from ..runtime import set_bits

Mix = tuple[int, ...]  # one width per layer, in the parent's layer order
VOCAB_CHUNK = 8192  # head rows per float64 copy when accumulating g = pᵀW (bounded memory for any vocabulary)


class _Replay(nn.Module):
    """Stands in for a decoder block: returns a stored output, whatever it is given."""

    def __init__(self, output) -> None:
        super().__init__()
        self.output = output

    def forward(self, *args, **kwargs):
        return self.output


@dataclass(frozen=True)
class WindowTerms:
    """The teacher's part of the KL rows of some windows (module docstring), float64, rows in window order."""

    const: torch.Tensor  # [rows]: Σ p z_t − lse(z_t) Σ p − Σ p b
    g: torch.Tensor  # [rows, H]: Σ_v p_v W_v
    mass: torch.Tensor  # [rows]: Σ p

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.const, self.g, self.mass))

    @staticmethod
    def cat(parts: list["WindowTerms"]) -> "WindowTerms":
        if len(parts) == 1:
            return parts[0]
        return WindowTerms(*(torch.cat([getattr(t, k) for t in parts]) for k in ("const", "g", "mass")))


@dataclass
class PrefixCache:
    """For `windows`, per batch: the outputs of `mix`'s first blocks (outputs[batch][block], as far as scorings have
    filled them; None when over the memory limit)."""

    mix: Mix
    windows: tuple[int, ...]
    outputs: list[list[torch.Tensor]] | None
    dtype: torch.dtype = torch.float32  # the compute dtype the outputs were made in


class Fitness:
    """Scores mixes of a loaded parent (`matgptq.load`) against a teacher built on `windows` [n, L]."""

    def __init__(self, model, teacher: Teacher, windows: torch.Tensor, names: tuple[str, ...], batch_size: int = 8,
                 cache_limit: int = 1 << 30, compute_dtype: torch.dtype = torch.float32) -> None:  # fmt: skip
        if compute_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"candidates are scored in float32 or bfloat16, not {compute_dtype}")
        if tuple(teacher.windows_shape) != tuple(windows.shape):
            raise ValueError("the teacher was built on other windows")
        self.model, self.teacher, self.windows, self.names = model, teacher, windows, tuple(names)
        self.batch_size, self.cache_limit, self.compute_dtype = batch_size, cache_limit, compute_dtype
        self.body, self.head = body_and_head(model)
        self.device = self.head.weight.device  # windows go where the model is (search --device)
        spec = arch_spec(model.config.model_type)
        self.blocks = get_blocks(model, spec)
        prefix = spec.blocks + "."
        self.block_of = tuple(int(n[len(prefix):].split(".")[0]) if n.startswith(prefix) else 0 for n in self.names)
        self.evaluations = 0  # candidate scorings so far
        self.tokens = 0  # predicted positions scored so far
        self._terms: dict[int, WindowTerms] = {}  # per calibration window, within cache_limit bytes
        self._terms_bytes = 0

    def apply(self, mix: Mix) -> None:
        set_bits(self.model, dict(zip(self.names, mix)))

    def first_changed_block(self, a: Mix, b: Mix) -> int:
        changed = [self.block_of[i] for i, (x, y) in enumerate(zip(a, b)) if x != y]
        return min(changed) if changed else len(self.blocks)

    @contextmanager
    def exact(self):
        """Score in float32 within the block (reported scores), whatever `compute_dtype` is."""
        saved, self.compute_dtype = self.compute_dtype, torch.float32
        try:
            yield self
        finally:
            self.compute_dtype = saved

    @property
    def held_windows(self) -> int:
        """Calibration windows whose teacher terms are held (the rest are recomputed at each use)."""
        return len(self._terms)

    def _batches(self, windows: tuple[int, ...]) -> list[list[int]]:
        return [list(windows[i : i + self.batch_size]) for i in range(0, len(windows), self.batch_size)]

    def prefix_cache(self, mix: Mix, windows: tuple[int, ...]) -> PrefixCache:
        """An empty cache of `mix`'s block outputs on `windows`, filled by the scorings that use it (module docstring);
        None in place of the outputs when they would not fit in `cache_limit` bytes."""
        fits = len(self.blocks) * len(windows) * self.windows.shape[1] * self.body.hidden_size * 4 <= self.cache_limit
        outputs = [[] for _ in self._batches(windows)] if fits else None
        return PrefixCache(tuple(mix), tuple(windows), outputs, self.compute_dtype)

    @torch.no_grad()
    def kl(self, mix: Mix, windows: tuple[int, ...], cache: PrefixCache | None = None) -> float:
        """F(mix; windows): mean KL per predicted token."""
        self.apply(mix)
        skip = until = 0  # replay blocks < skip from the cache; record blocks skip..until−1 into it
        if cache is not None:
            if cache.windows != tuple(windows):
                raise ValueError("the prefix cache was built on other windows")
            if cache.outputs is not None and cache.dtype == self.compute_dtype:
                first = self.first_changed_block(cache.mix, tuple(mix))
                skip = min(first, len(cache.outputs[0]))
                until = max(first, skip)
        total, count = 0.0, 0
        for b, batch in enumerate(self._batches(windows)):
            sink = cache.outputs[b] if until > skip else None
            hidden = self._hidden(batch, cache.outputs[b][skip - 1] if skip else None, skip, sink, until)
            total += self._kl_sum(WindowTerms.cat([self.window_terms(w) for w in batch]), hidden)
            count += hidden.shape[0]
        self.evaluations += 1
        self.tokens += count
        return total / count

    def count_elsewhere(self, evaluations: int, windows: tuple[int, ...]) -> None:
        """Count scorings of `windows` made by other processes (search/spread.py), so every rank reports the total."""
        self.evaluations += evaluations
        self.tokens += evaluations * len(windows) * (self.windows.shape[1] - 1)

    def _body(self, ids: torch.Tensor) -> torch.Tensor:
        low = self.compute_dtype != torch.float32
        with torch.autocast(self.device.type, dtype=self.compute_dtype, enabled=low):
            return self.body(ids)

    def _hidden(self, batch: list[int], replay, skip: int, sink: list | None = None, until: int = 0) -> torch.Tensor:
        """Final hidden states of `batch`: blocks < skip replay `replay` (block skip − 1's cached output); with a
        `sink`, the outputs of blocks skip..until − 1 are appended to it."""
        saved = [self.blocks[i] for i in range(skip)]
        for i in range(skip):
            self.blocks[i] = _Replay(replay)
        hooks = [] if sink is None else [self.blocks[i].register_forward_hook(lambda m, i, o: sink.append(o))
                                         for i in range(skip, until)]  # fmt: skip
        try:
            out = self._body(self.windows[batch].to(self.device))[:, :-1].reshape(-1, self.body.hidden_size)
            return out.to(self.head.weight.dtype)
        finally:
            for h in hooks:
                h.remove()
            for i, block in enumerate(saved):
                self.blocks[i] = block

    def _chunk(self) -> int:
        return max(1, CHUNK_ELEMENTS // self.head.out_features)  # rows per vocabulary-sized tensor

    @torch.no_grad()
    def window_terms(self, window: int) -> WindowTerms:
        """The teacher terms of one calibration window's rows (held within `cache_limit`)."""
        if window in self._terms:
            return self._terms[window]
        ref = self.teacher.hidden(window, window + 1)
        weight, bias = self.head.weight, self.head.bias
        parts = []
        for c0 in range(0, ref.shape[0], self._chunk()):
            zt = self.teacher.logits(ref[c0 : c0 + self._chunk()]).float().to(self.device)
            lse = torch.logsumexp(zt, -1, keepdim=True)
            p = (zt - lse).exp()
            mass = p.sum(-1, dtype=torch.float64)
            const = (p * zt).sum(-1, dtype=torch.float64) - lse[:, 0].double() * mass
            g = torch.zeros(p.shape[0], weight.shape[1], dtype=torch.float64, device=self.device)
            for v0 in range(0, weight.shape[0], VOCAB_CHUNK):
                pv = p[:, v0 : v0 + VOCAB_CHUNK].double()
                g += pv @ weight[v0 : v0 + VOCAB_CHUNK].double()
                if bias is not None:
                    const -= pv @ bias[v0 : v0 + VOCAB_CHUNK].double()
            parts.append(WindowTerms(const, g, mass))
        terms = WindowTerms.cat(parts)
        if self._terms_bytes + terms.nbytes <= self.cache_limit:
            self._terms[window] = terms
            self._terms_bytes += terms.nbytes
        return terms

    def _kl_sum(self, terms: WindowTerms, hidden: torch.Tensor) -> float:
        """Σ over rows of KL(p ‖ q), chunk by chunk (the formula of the module docstring)."""
        total = 0.0
        for c0 in range(0, hidden.shape[0], self._chunk()):
            h = hidden[c0 : c0 + self._chunk()]
            lse = torch.logsumexp(self.head(h).float(), -1).double()
            rows = slice(c0, c0 + h.shape[0])
            cross = (h.double() * terms.g[rows]).sum(-1)
            total += float((terms.const[rows] - cross + lse * terms.mass[rows]).sum())
        return total
