"""Streamed perplexity and KL (evaluation/perplexity.py, teacher.py) against the all-at-once computation.

Oracle: the textbook formulas on full `model(ids).logits` of every window at once (what `matgptq eval` did before
streaming): ppl = exp(mean −log q(x_t)), KL = mean Σ_v p_v (log p_v − log q_v).
Tolerance: streaming applies the head to chunks of hidden-state rows instead of the whole batch, so logits may round
differently (float32 GEMM of another shape: |Δlogit| ≲ H·u·Σ|h||w| with u = 2^-24, H = 32 here, i.e. ~1e-6 of the
logit scale); sums are float64. Relative 1e-5 on ppl and KL bounds that with margin, while any real difference (one
token dropped, one window's KL missing, a shifted target) changes them by > 1e-2.
"""

import math
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import matgptq
import matgptq.evaluation.perplexity as perplexity_mod
import matgptq.evaluation.teacher as teacher_mod
from matgptq.evaluation.perplexity import Teacher, score
from tests.quantization.test_pipeline import CONFIGS, tiny_model, windows

REL = 1e-5


def oracle(model, ref, ids):
    with torch.no_grad():
        logq = F.log_softmax(model(ids).logits[:, :-1].float(), -1)
        logp = F.log_softmax(ref(ids).logits[:, :-1].float(), -1)
    nll = -logq.gather(-1, ids[:, 1:, None]).double().mean()
    kl = (logp.exp() * (logp - logq)).sum(-1).double().mean()
    return float(nll.exp()), float(kl)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_head_of_body_is_the_model_logits(kind):
    model, ids = tiny_model(kind), windows(3, 16)
    body, head = teacher_mod.body_and_head(model)
    with torch.no_grad():
        assert torch.allclose(head(body(ids)), model(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("batch_size,chunk_elements", [(8, 1 << 24), (3, 96 * 5), (1, 96)])
def test_streamed_equals_all_at_once(monkeypatch, batch_size, chunk_elements):
    monkeypatch.setattr(perplexity_mod, "CHUNK_ELEMENTS", chunk_elements)  # chunks of 1..5 tokens cross windows
    ref, model = tiny_model("llama"), tiny_model("llama")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    ids = windows(7, 24)
    want_ppl, want_kl = oracle(model, ref, ids)
    with Teacher(ref, ids, batch_size=2) as teacher:  # another batching than the candidate's
        got = score(model, ids, teacher, batch_size=batch_size)
    assert got.tokens == 7 * 23
    assert got.ppl == pytest.approx(want_ppl, rel=REL) and got.kl == pytest.approx(want_kl, rel=REL)
    assert want_kl > 1e-3  # the perturbation is visible, so the comparison means something
    assert score(model, ids, None, batch_size).kl is None


def test_teacher_of_itself_gives_zero_kl():
    model, ids = tiny_model("qwen2"), windows(4, 16)
    with Teacher(model, ids) as teacher:
        assert abs(score(model, ids, teacher).kl) < 1e-6


PEAK = textwrap.dedent("""
    import resource, sys, torch
    from transformers import AutoModelForCausalLM, LlamaConfig
    from matgptq.evaluation.perplexity import Teacher, score
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    ref, model = (AutoModelForCausalLM.from_config(cfg).eval() for _ in range(2))
    ids = torch.randint(0, 32000, (int(sys.argv[1]), 256))
    with Teacher(ref, ids, batch_size=4) as t:
        score(model, ids, t, batch_size=4)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
""")


def test_peak_memory_does_not_grow_with_tokens(tmp_path):
    """4 vs 32 windows of 256 tokens, vocabulary 32,000: holding the reference log-probs (the old way) would need
    28 × 255 × 32000 × 4 bytes ≈ 0.9 GB more for the larger run; streamed, the peak must stay within 0.1 of that."""
    script = tmp_path / "peak.py"
    script.write_text(PEAK)
    peaks = [
        int(
            subprocess.run(
                [sys.executable, str(script), str(n)], capture_output=True, text=True, check=True
            ).stdout.split()[-1]
        )
        for n in (4, 32)
    ]
    stored = (32 - 4) * 255 * 32000 * 4
    assert peaks[1] - peaks[0] < 0.1 * stored, peaks


def test_perplexity_is_transformers_loss_per_window(tiny_bpe_llama_dir):
    """Second oracle: transformers' own loss (labels=input_ids), window by window, at several batch sizes."""
    model = matgptq.load(tiny_bpe_llama_dir)
    ids = torch.randint(0, model.config.vocab_size, (5, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # HF's loss: mean NLL of tokens 2..seqlen of one window
        losses = [model(w[None], labels=w[None]).loss.double().item() for w in ids]
    expected = math.exp(sum(losses) / len(losses))  # equal-length windows: mean of means = overall mean
    # Both sum 47 float32 NLLs of ≈ ln(384) ≈ 6 per window, in different orders: worst-case rounding 47·2⁻²⁴ ≈ 3e-6
    # relative, ≈ 2e-5 absolute in the mean NLL, which is the relative change of exp(NLL).
    for batch in (1, 2, 5):
        assert math.isclose(perplexity_mod.perplexity(model, ids, batch), expected, rel_tol=2e-5), batch
