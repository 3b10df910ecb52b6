"""Perplexity and KL divergence on non-overlapping windows, streamed: memory does not grow with the evaluated tokens.

Protocol (the WikiText-2 protocol of the GPTQ papers): tokenize the whole evaluation text once, take the first
`max_tokens` tokens, cut them into non-overlapping windows of `seqlen` (a partial last window is dropped); each
window is scored on its own, predicting its tokens 2..seqlen from the preceding ones:
    ppl = exp( Σ_windows Σ_t −log p(x_t | x_<t) / (n_windows · (seqlen − 1)) ).
KL is the mean over the same predicted positions of KL(P_reference ‖ P_model) = Σ_v p_v (log p_v − log q_v).

Streaming. A model's vocabulary-sized outputs are never held for more than one chunk of tokens: the body runs a batch
of windows to its final hidden states, and the output head turns `chunk` of those rows at a time into log-probabilities
(≤ CHUNK_ELEMENTS floats per tensor), which are reduced to the NLL and KL sums at once. The reference side is a
`Teacher` (teacher.py): the reference model's final hidden states, spilled to a temporary file, and its head — so the
reference distribution is recomputed exactly, chunk by chunk, instead of being stored (H floats per token on disk
instead of V in memory). Exact, not truncated: the same float32 log_softmax of the same logits, only the summation is
chunked (float64 accumulation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .teacher import CHUNK_ELEMENTS, Teacher, body_and_head

__all__ = ["Score", "Teacher", "score", "perplexity"]


@dataclass(frozen=True)
class Score:
    ppl: float
    kl: float | None  # None without a teacher
    tokens: int  # predicted positions


@torch.no_grad()
def score(
    model,
    windows: torch.Tensor,
    teacher: Teacher | None = None,
    batch_size: int = 8,
    progress: bool = False,
    desc: str = "eval",
) -> Score:
    """Perplexity of `model` on `windows` [n, seqlen] and, with a teacher built on the same windows, the mean KL."""
    if teacher is not None and tuple(teacher.windows_shape) != tuple(windows.shape):
        raise ValueError("the teacher was built on other windows")
    body, head = body_and_head(model)
    device = head.weight.device  # the model's (eval --device); windows and the teacher's rows go there
    nll = kl = 0.0
    count = 0
    bar = tqdm(total=windows.shape[0], desc=desc, unit="window", disable=not progress, leave=False)
    for b0 in range(0, windows.shape[0], batch_size):
        batch = windows[b0 : b0 + batch_size].to(device)
        hidden = body(batch)[:, :-1].reshape(-1, body.hidden_size)
        targets = batch[:, 1:].reshape(-1)
        ref_hidden = teacher.hidden(b0, b0 + batch.shape[0]) if teacher is not None else None
        chunk = max(1, CHUNK_ELEMENTS // head.out_features)
        for c0 in range(0, hidden.shape[0], chunk):
            logq = F.log_softmax(head(hidden[c0 : c0 + chunk]).float(), -1)
            nll -= float(logq.gather(1, targets[c0 : c0 + chunk, None]).sum(dtype=torch.float64))
            if ref_hidden is not None:
                logp = teacher.logprobs(ref_hidden[c0 : c0 + chunk]).to(device)
                kl += float((logp.exp() * (logp - logq)).sum(dtype=torch.float64))
        count += targets.numel()
        bar.update(batch.shape[0])
    bar.close()
    return Score(math.exp(nll / count), kl / count if teacher is not None else None, count)


def perplexity(model, windows: torch.Tensor, batch_size: int = 8, progress: bool = False) -> float:
    return score(model, windows, None, batch_size, progress, desc="ppl").ppl
