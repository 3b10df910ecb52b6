"""Perplexity protocol: the window-by-window loss equals transformers' own loss (labels=input_ids) per window, for
every batch size (the default batch keeps batch·seqlen at the token budget)."""

import math

import torch

import matgptq
from matgptq.evaluation.perplexity import TOKEN_BUDGET, default_batch_size, perplexity


def test_perplexity_is_transformers_loss_per_window(tiny_bpe_llama_dir):
    model = matgptq.load(tiny_bpe_llama_dir)
    windows = torch.randint(0, model.config.vocab_size, (5, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # HF's loss: mean NLL of tokens 2..seqlen of one window
        losses = [model(w[None], labels=w[None]).loss.double().item() for w in windows]
    expected = math.exp(sum(losses) / len(losses))  # equal-length windows: mean of means = overall mean
    # Both sum 47 float32 NLLs of ≈ ln(384) ≈ 6 per window, in different orders: worst-case rounding 47·2⁻²⁴ ≈ 3e-6
    # relative, ≈ 2e-5 absolute in the mean NLL, which is the relative change of exp(NLL). (Measured: 4e-8.)
    for batch in (1, 2, 5, None):
        assert math.isclose(perplexity(model, windows, batch), expected, rel_tol=2e-5), batch


def test_default_batch_keeps_the_token_budget():
    assert [default_batch_size(s) for s in (64, 256, 2048, 4096)] == [TOKEN_BUDGET // 64, 8, 1, 1]
