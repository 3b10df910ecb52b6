"""Perplexity and KL divergence on non-overlapping windows.

Protocol (the GPTQ papers' WikiText-2 protocol and ../shared/data/README.md): tokenize the whole evaluation text once,
take the first `max_tokens` tokens, cut them into non-overlapping windows of `seqlen` (a partial last window is
dropped); each window is scored on its own, predicting its tokens 2..seqlen from the preceding ones:
    ppl = exp( Σ_windows Σ_t −log p(x_t | x_<t) / (n_windows · (seqlen − 1)) ).
KL is the mean over the same predicted positions of KL(P_reference ‖ P_model).

Memory: a forward pass holds batch · seqlen · vocab float32 logits (one 2048-token window of a 49,152-token vocabulary
is 400 MB), so the default batch is TOKEN_BUDGET // seqlen windows (8 at 256 tokens, 1 at 2048), and the loss is taken
one window at a time from a contiguous slice of the logits (no reshaped or log-softmaxed copy of the whole batch).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

TOKEN_BUDGET = 2048  # tokens per forward pass when no batch size is given


def default_batch_size(seqlen: int) -> int:
    return max(1, TOKEN_BUDGET // seqlen)


@torch.no_grad()
def _logits(model, batch: torch.Tensor) -> torch.Tensor:
    return model(batch, use_cache=False).logits[:, :-1].float()


@torch.no_grad()
def perplexity(model, windows: torch.Tensor, batch_size: int | None = None, progress: bool = False) -> float:
    batch_size = batch_size or default_batch_size(windows.shape[1])
    nll, count = 0.0, 0
    bar = tqdm(total=windows.shape[0], desc="ppl", unit="window", disable=not progress, leave=False)
    for b0 in range(0, windows.shape[0], batch_size):
        batch = windows[b0 : b0 + batch_size]
        logits = _logits(model, batch)
        for i in range(batch.shape[0]):
            nll += F.cross_entropy(logits[i], batch[i, 1:], reduction="sum").item()
        count += batch[:, 1:].numel()
        del logits
        bar.update(batch.shape[0])
        bar.set_postfix(ppl=f"{math.exp(nll / count):.3f}", refresh=False)
    bar.close()
    return math.exp(nll / count)


@torch.no_grad()
def reference_logprobs(model, windows: torch.Tensor, batch_size: int | None = None) -> list[torch.Tensor]:
    batch_size = batch_size or default_batch_size(windows.shape[1])
    return [F.log_softmax(_logits(model, windows[b : b + batch_size]), -1) for b in range(0, windows.shape[0], batch_size)]


@torch.no_grad()
def kl_divergence(model, windows: torch.Tensor, ref_logprobs: list[torch.Tensor], batch_size: int | None = None) -> float:
    batch_size = batch_size or default_batch_size(windows.shape[1])
    total, count = 0.0, 0
    for i, b0 in enumerate(range(0, windows.shape[0], batch_size)):
        logq = F.log_softmax(_logits(model, windows[b0 : b0 + batch_size]), -1)
        logp = ref_logprobs[i]
        total += (logp.exp() * (logp - logq)).sum().item()
        count += logp.shape[0] * logp.shape[1]
    return total / count
