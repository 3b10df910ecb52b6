"""Fitness of a mix: KL(unquantized ‖ candidate) on calibration windows, the candidate built in memory from a parent.

    F(mix; W) = (1 / |W|·(L − 1)) Σ_{w ∈ W} Σ_{t=1}^{L−1} Σ_v p_v(w, t) (log p_v(w, t) − log q_v(w, t))

p, q: the unquantized model's and the candidate's next-token distributions at the predicted positions of windows W
(length L): the mean per-token KL of `evaluation.perplexity.score` and EvoPress' fitness (Sieberling et al., 2024).
The teacher is `evaluation.teacher.Teacher` (its final hidden states on disk plus its head); a candidate is made by
`runtime.set_bits`, which re-slices only the layers whose width changed. Per row, with z_t the teacher's logits and
z = W h + b the candidate's (h its final hidden state, W and b its head):

    KL_row = [Σ_v p_v z_t,v − lse(z_t)·Σ_v p_v − Σ_v p_v b_v] − h · (Σ_v p_v W_v) + lse(z) · Σ_v p_v
           =                 const                             − h · g             + lse(z) · mass

const, g = pᵀW and mass depend only on the window: `WindowTerms` computes them once, in float64, and keeps them
within `cache_limit` bytes (windows beyond it are recomputed at each use), so a candidate costs its forward, its
logits and one logsumexp. mass is kept rather than taken as 1, so the rounding of the float32 softmax cancels.
`compute_dtype`: float32 (exact), or bfloat16 autocast for the candidate's body (head and KL stay float32); `exact()`
switches to float32 for the reported scores.
Prefix cache (`prefix_cache`): blocks before a candidate's first changed layer compute what the stage's reference mix
computes; their outputs, filled lazily by the scorings themselves, are replayed instead of recomputed, within
`cache_limit`. Same batches, same arithmetic: the KL is bit-identical to a full pass (tested).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from ..evaluation.teacher import CHUNK_ELEMENTS, Teacher, body_and_head
from ..models import arch_spec, get_blocks, weight_swapped
from ..runtime import set_bits
from .units import Units

Mix = tuple[int, ...]  # one width per unit (units.py: each layer, or each tied group), in the parent's layer order
VOCAB_CHUNK = 8192  # head rows per float64 copy when accumulating g = pᵀW (bounded memory for any vocabulary)


class Replay(nn.Module):
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
    """Scores mixes of a loaded parent (`matgptq.load`) against a teacher built on `windows` [n, L]. `names`: the
    quantized layers; a mix gives one width to each of `units` (units.py; default: each layer alone)."""

    def __init__(
        self,
        model,
        teacher: Teacher,
        windows: torch.Tensor,
        names: tuple[str, ...],
        batch_size: int = 8,
        cache_limit: int = 1 << 30,
        compute_dtype: torch.dtype = torch.float32,
        units: Units | None = None,
    ) -> None:
        if compute_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"candidates are scored in float32 or bfloat16, not {compute_dtype}")
        if tuple(teacher.windows_shape) != tuple(windows.shape):
            raise ValueError("the teacher was built on other windows")
        self.model, self.teacher, self.windows, self.names = model, teacher, windows, tuple(names)
        self.units = Units.each(self.names) if units is None else units
        if self.units.layers != self.names:
            raise ValueError("the units are not of these layers")
        self.batch_size, self.cache_limit, self.compute_dtype = batch_size, cache_limit, compute_dtype
        self.body, self.head = body_and_head(model)
        self.device = self.head.weight.device  # windows go where the model is (search --device)
        # On a GPU the parent's codes move there once (a byte a weight for an 8-bit master), so that set_bits and the
        # tables slice and dequantize on the device: sliced on the host and copied, a child's set_bits took longer
        # than its scoring on an 8B-shaped block (docs/results/gpu.md, the search's set_bits)
        if self.device.type != "cpu":
            layers = model.matgptq.layers
            for name in self.names:
                layers[name] = layers[name].to(self.device)
        self.spec = spec = arch_spec(model)
        self.blocks = get_blocks(model, spec)
        prefix = spec.blocks + "."
        self.layer_block = tuple(int(n[len(prefix) :].split(".")[0]) if n.startswith(prefix) else 0 for n in self.names)
        self.block_of = tuple(min(self.layer_block[i] for i in unit) for unit in self.units.members)  # per unit
        self.evaluations = 0  # candidate scorings so far
        self.tokens = 0  # predicted positions scored so far
        self._terms: dict[int, WindowTerms] = {}  # per calibration window, within cache_limit bytes
        self._terms_bytes = 0
        self.derived: dict = {}  # values of the parent alone, computed once (sensitivity.relative_errors)

    def apply(self, mix: Mix) -> None:
        set_bits(self.model, self.units.widths(mix))

    def uniform(self, width: int) -> Mix:
        """Every unit at `width`."""
        return tuple(width for _ in self.units.members)

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

    def batches(self, windows: tuple[int, ...]) -> list[list[int]]:
        """`windows` in batches of batch_size, in order."""
        return [list(windows[i : i + self.batch_size]) for i in range(0, len(windows), self.batch_size)]

    def prefix_cache(self, mix: Mix, windows: tuple[int, ...]) -> PrefixCache:
        """An empty cache of `mix`'s block outputs on `windows`, filled by the scorings that use it (module docstring);
        None in place of the outputs when they would not fit in `cache_limit` bytes."""
        fits = len(self.blocks) * len(windows) * self.windows.shape[1] * self.body.hidden_size * 4 <= self.cache_limit
        outputs = [[] for _ in self.batches(windows)] if fits else None
        return PrefixCache(tuple(mix), tuple(windows), outputs, self.compute_dtype)

    def kl(
        self,
        mix: Mix,
        windows: tuple[int, ...],
        cache: PrefixCache | None = None,
        replaced: tuple[int, torch.Tensor] | None = None,
    ) -> float:
        """F(mix; windows): mean KL per predicted token, the mean of `window_kls` (every window has L − 1 predicted
        positions)."""
        return statistics.fmean(self.window_kls(mix, windows, cache, replaced))

    @torch.no_grad()
    def window_kls(
        self,
        mix: Mix,
        windows: tuple[int, ...],
        cache: PrefixCache | None = None,
        replaced: tuple[int, torch.Tensor] | None = None,
    ) -> list[float]:
        """F(mix; {w}) for each window w of `windows`, from one pass over them all. `replaced` = (layer index in
        `names`, weight as [out, in]): that layer computes with this weight instead of its slice, for this scoring
        only (noise probes, allocators.py); the prefix cache then replays only the blocks before the layer's block."""
        self.apply(mix)
        skip = until = 0  # replay blocks < skip from the cache; record blocks skip..until−1 into it
        if cache is not None:
            if cache.windows != tuple(windows):
                raise ValueError("the prefix cache was built on other windows")
            if cache.outputs is not None and cache.dtype == self.compute_dtype:
                first = self.first_changed_block(cache.mix, tuple(mix))
                first = first if replaced is None else min(first, self.layer_block[replaced[0]])
                skip = min(first, len(cache.outputs[0]))
                until = max(first, skip)
        if replaced is None:
            return self._scored(windows, cache, skip, until)
        with weight_swapped(self.model, self.names[replaced[0]], self.spec, replaced[1]):  # (fused experts too)
            return self._scored(windows, cache, skip, until)

    def _scored(self, windows: tuple[int, ...], cache: PrefixCache | None, skip: int, until: int) -> list[float]:
        """Each window's mean KL per predicted token, the model as it stands, replaying and recording as
        `window_kls` decided."""
        sums, first = [0.0] * len(windows), 0
        for b, batch in enumerate(self.batches(windows)):
            sink = cache.outputs[b] if until > skip else None
            hidden = self._hidden(batch, cache.outputs[b][skip - 1] if skip else None, skip, sink, until)
            for position, kl in self.chunk_kls(batch, hidden):
                sums[first + position] += float(kl)
            first += len(batch)
        rows = self.windows.shape[1] - 1
        self.evaluations += 1
        self.tokens += rows * len(windows)
        return [s / rows for s in sums]

    @torch.no_grad()
    def run(self, windows: tuple[int, ...]) -> None:
        """The body's forward on `windows` as the model stands, for hooks that observe the layers' inputs."""
        for batch in self.batches(windows):
            self._body(self.windows[batch].to(self.device))

    def count_elsewhere(self, evaluations: int, windows: tuple[int, ...]) -> None:
        """Count scorings of `windows` made by other processes (allocation/spread.py), so every rank reports the total."""
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
            self.blocks[i] = Replay(replay)
        hooks = (
            []
            if sink is None
            else [self.blocks[i].register_forward_hook(lambda m, i, o: sink.append(o)) for i in range(skip, until)]
        )
        try:
            out = self._body(self.windows[batch].to(self.device))[:, :-1].reshape(-1, self.body.hidden_size)
            return out.to(self.head.weight.dtype)
        finally:
            for h in hooks:
                h.remove()
            for i, block in enumerate(saved):
                self.blocks[i] = block

    @property
    def chunk_rows(self) -> int:
        """Rows per vocabulary-sized tensor (CHUNK_ELEMENTS)."""
        return max(1, CHUNK_ELEMENTS // self.head.out_features)

    @torch.no_grad()
    def window_terms(self, window: int) -> WindowTerms:
        """The teacher terms of one calibration window's rows (held within `cache_limit`)."""
        if window in self._terms:
            return self._terms[window]
        ref = self.teacher.hidden(window, window + 1)
        weight, bias, scale = self.head.affine()  # z = s·(W h + b): g and the bias's term scaled by s, W not copied
        parts = []
        for c0 in range(0, ref.shape[0], self.chunk_rows):
            zt = self.teacher.logits(ref[c0 : c0 + self.chunk_rows]).float().to(self.device)
            lse = torch.logsumexp(zt, -1, keepdim=True)
            p = (zt - lse).exp()
            mass = p.sum(-1, dtype=torch.float64)
            const = (p * zt).sum(-1, dtype=torch.float64) - lse[:, 0].double() * mass
            g = torch.zeros(p.shape[0], weight.shape[1], dtype=torch.float64, device=self.device)
            for v0 in range(0, weight.shape[0], VOCAB_CHUNK):
                pv = p[:, v0 : v0 + VOCAB_CHUNK].double()
                g += pv @ weight[v0 : v0 + VOCAB_CHUNK].double()
                if bias is not None:
                    const -= scale * (pv @ bias[v0 : v0 + VOCAB_CHUNK].double())
            parts.append(WindowTerms(const, g if scale == 1.0 else g * scale, mass))
        terms = WindowTerms.cat(parts)
        if self._terms_bytes + terms.nbytes <= self.cache_limit:
            self._terms[window] = terms
            self._terms_bytes += terms.nbytes
        return terms

    def chunk_kls(self, batch: list[int], hidden: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
        """(i, Σ over the rows of one chunk of KL(p ‖ q)) for chunks of `hidden` (the final hidden states of `batch`,
        rows in window order) that never straddle two windows, i the window's position in `batch`; float64 scalars
        differentiable in `hidden`: the formula of the module docstring, or, for soft-capped logits (Gemma 2/3, not
        affine in h), Σ_v p_v (log p_v − log q_v) from both distributions."""
        step, per = self.chunk_rows, hidden.shape[0] // len(batch)
        if self.head.softcap is None:
            terms = WindowTerms.cat([self.window_terms(w) for w in batch])
        else:
            ref = torch.cat([self.teacher.hidden(w, w + 1) for w in batch])
        for i in range(len(batch)):
            for c0 in range(i * per, (i + 1) * per, step):
                c1 = min(c0 + step, (i + 1) * per)
                h = hidden[c0:c1]
                if self.head.softcap is None:
                    lse = torch.logsumexp(self.head(h).float(), -1).double()
                    rows = slice(c0, c1)
                    yield i, (terms.const[rows] - (h.double() * terms.g[rows]).sum(-1) + lse * terms.mass[rows]).sum()
                else:
                    logp = self.teacher.logprobs(ref[c0:c1]).to(self.device)
                    logq = torch.log_softmax(self.head(h).float(), -1)
                    yield i, (logp.exp() * (logp - logq)).sum(dtype=torch.float64)
