"""The reference ("teacher") distribution for KL, kept in bounded memory: final hidden states on disk plus the head.

A causal LM's logits are head(h) with h the body's final (normed) hidden state. Storing h instead of log p costs
H floats per token instead of V (576 vs 49,152 for SmolLM2; 4096 vs 128,256 for Llama-3-8B), and writing it to a
temporary file makes resident memory independent of the token count: one batch of hidden states is read back at a
time and the reference log-probabilities are recomputed exactly, chunk by chunk, by the reference's own head
(a copy of its weights, so the reference model itself can be freed). On a GPU the reference runs there and its
hidden states go through the CPU to the file; `logprobs`/`logits` take rows from anywhere to the head's device.
Memory for a 128k vocabulary at 500k tokens: disk 500k × H × 4 bytes (2 GB at H = 1024, 8 GB at H = 4096); RAM
one batch of hidden states plus CHUNK_ELEMENTS-sized chunks, whatever the token count. The search (allocation/fitness.py)
reuses it: one teacher, many candidates.
"""

from __future__ import annotations

import copy
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

CHUNK_ELEMENTS = 1 << 24  # floats per vocabulary-sized tensor (64 MB in float32); a chunk has ≥ 1 token


class _Body:
    """The model up to its final hidden states; `hidden_size` is their width."""

    def __init__(self, base: nn.Module, hidden_size: int) -> None:
        self.base, self.hidden_size = base, hidden_size

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return self.base(input_ids=ids, use_cache=False).last_hidden_state


class Head(nn.Module):
    """The output head: the model's Linear, then the elementwise post-processing its forward applies to the logits
    (as the modeling code of transformers 5 writes them): Gemma 2/3's soft cap c·tanh(z/c), Granite's z / s,
    Cohere's z·s. `weight` is the Linear's."""

    def __init__(
        self,
        linear: nn.Linear,
        softcap: float | None = None,
        divide: float | None = None,
        multiply: float | None = None,
    ) -> None:
        super().__init__()
        self.linear, self.softcap, self.divide, self.multiply = linear, softcap, divide, multiply

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    @property
    def out_features(self) -> int:
        return self.linear.out_features

    def affine(self) -> tuple[torch.Tensor, torch.Tensor | None, float]:
        """(W, b, s) with head(h) = s·(W h + b), where the head is affine (no soft cap): the Linear's and the scale."""
        if self.softcap is not None:
            raise ValueError("a soft-capped head is not affine")
        return self.linear.weight, self.linear.bias, (self.multiply or 1.0) / (self.divide or 1.0)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        z = self.linear(hidden)
        if self.softcap is not None:
            z = torch.tanh(z / self.softcap) * self.softcap
        if self.divide is not None:
            z = z / self.divide
        if self.multiply is not None:
            z = z * self.multiply
        return z


def body_and_head(model) -> tuple[_Body, Head]:
    """Split a causal LM into body (ids → final hidden states) and output head, where logits = head(hidden).

    Holds for the decoder-only models transformers builds: their forward is `post(lm_head(base_model(ids)
    .last_hidden_state))` with `post` one of Head's (tests/evaluation check it against `model(ids).logits` for every
    architecture the tests build)."""
    cfg = model.config
    linear = model.get_output_embeddings()
    if not isinstance(linear, nn.Linear):
        raise ValueError(f"{cfg.model_type}'s output head is not a Linear layer")
    head = Head(
        linear,
        getattr(cfg, "final_logit_softcapping", None),
        getattr(cfg, "logits_scaling", None),
        getattr(cfg, "logit_scale", None),
    )
    return _Body(model.base_model, linear.in_features), head


class Teacher:
    """Final hidden states of the reference model on `windows` (spilled to an anonymous temporary file) and a copy of
    its head. `hidden(a, b)` returns windows a..b's predicting positions as rows [(b − a)·(seqlen − 1), H]."""

    def __init__(self, model, windows: torch.Tensor, batch_size: int = 8, progress: bool = False) -> None:
        body, head = body_and_head(model)
        self.head = copy.deepcopy(head).float().eval()
        self.windows_shape = tuple(windows.shape)
        self._rows_per_window = windows.shape[1] - 1
        self._width = body.hidden_size
        self._file = tempfile.TemporaryFile(prefix="matgptq-teacher-")
        bar = tqdm(total=windows.shape[0], desc="reference", unit="window", disable=not progress, leave=False)
        with torch.no_grad():
            for b0 in range(0, windows.shape[0], batch_size):
                ids = windows[b0 : b0 + batch_size].to(self.head.weight.device)
                h = body(ids)[:, :-1].float().cpu().contiguous()
                self._file.write(h.numpy().tobytes())
                bar.update(h.shape[0])
        bar.close()
        self._file.flush()

    def hidden(self, a: int, b: int) -> torch.Tensor:
        rows = (b - a) * self._rows_per_window
        self._file.seek(a * self._rows_per_window * self._width * 4)
        data = np.frombuffer(self._file.read(rows * self._width * 4), dtype=np.float32)
        return torch.from_numpy(data.copy()).view(rows, self._width)

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden.to(self.head.weight.device))

    @torch.no_grad()
    def logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.logits(hidden).float(), -1)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "Teacher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
