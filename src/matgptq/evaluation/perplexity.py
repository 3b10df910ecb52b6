"""Perplexity and KL divergence on non-overlapping windows.

Protocol (the GPTQ papers' WikiText-2 protocol and ../shared/data/README.md): tokenize the whole evaluation text once,
take the first `max_tokens` tokens, cut them into non-overlapping windows of `seqlen` (a partial last window is
dropped); each window is scored on its own, predicting its tokens 2..seqlen from the preceding ones:
    ppl = exp( Σ_windows Σ_t −log p(x_t | x_<t) / (n_windows · (seqlen − 1)) ).
KL is the mean over the same predicted positions of KL(P_reference ‖ P_model).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm


@torch.no_grad()
def _logits(model, batch: torch.Tensor) -> torch.Tensor:
    return model(batch, use_cache=False).logits[:, :-1].float()


@torch.no_grad()
def perplexity(model, windows: torch.Tensor, batch_size: int = 8, progress: bool = False) -> float:
    nll, count = 0.0, 0
    for b0 in tqdm(range(0, windows.shape[0], batch_size), desc="ppl", disable=not progress, leave=False):
        batch = windows[b0 : b0 + batch_size]
        logits = _logits(model, batch)
        nll += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum").item()
        count += batch[:, 1:].numel()
    return math.exp(nll / count)


@torch.no_grad()
def reference_logprobs(model, windows: torch.Tensor, batch_size: int = 8) -> list[torch.Tensor]:
    return [F.log_softmax(_logits(model, windows[b : b + batch_size]), -1) for b in range(0, windows.shape[0], batch_size)]


@torch.no_grad()
def kl_divergence(model, windows: torch.Tensor, ref_logprobs: list[torch.Tensor], batch_size: int = 8) -> float:
    total, count = 0.0, 0
    for i, b0 in enumerate(range(0, windows.shape[0], batch_size)):
        logq = F.log_softmax(_logits(model, windows[b0 : b0 + batch_size]), -1)
        logp = ref_logprobs[i]
        total += (logp.exp() * (logp - logq)).sum().item()
        count += logp.shape[0] * logp.shape[1]
    return total / count
