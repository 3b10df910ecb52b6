"""Shared fixtures: paths to ../shared, tiny models built on the fly, and gating of peer-library tests.

Peer libraries (GPTQModel, optimum, llama-cpp-python) are optional: tests needing one are skipped when it is missing,
unless MATGPTQ_REQUIRE_PEERS=1 (set by CI), which turns a missing peer into a failure. A whole run records what it
skipped; `pytest --rerun-skipped` runs only that (tests/skipped.py: CI's peer pass).
"""

import importlib
import os
import shutil
from pathlib import Path

# GPTQModel: two CPU workers on this machine; its torch kernel otherwise torch.compile()s on every load (seconds).
os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
# Triton decides interpreter vs compiler when its own library is first imported, and `import matgptq` imports it
# (through transformers' quantizer registry, integrations/transformers.py), so the nested-kernel tests' CPU interpreter
# (tests/kernels/test_triton_nested.py) must be chosen before the first import below.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from matgptq.formats import QuantizedWeight  # noqa: E402
from tests.skipped import pytest_addoption, pytest_collection_modifyitems, pytest_configure  # noqa: E402, F401

# ../shared beside the checkout; MATGPTQ_SHARED names a copy elsewhere (make gpu-check carries one: no ../shared there)
SHARED = Path(os.environ.get("MATGPTQ_SHARED") or Path(__file__).resolve().parents[1].parent / "shared")
STORIES = SHARED / "models" / "stories260K"
# what `make real-model` makes (tools/real_model.py: $MATGPTQ_CACHE or ~/.cache/matgptq); tests using it skip without it
REAL_MODEL = Path(os.environ.get("MATGPTQ_CACHE") or Path.home() / ".cache" / "matgptq") / "SmolLM2-135M-Instruct"
TINYSTORIES = SHARED / "data" / "tinystories" / "tinystories_val_head.txt"


def require_peer(module: str):
    """Import a peer library or skip (fail under MATGPTQ_REQUIRE_PEERS=1)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if os.environ.get("MATGPTQ_REQUIRE_PEERS") == "1":
            pytest.fail(f"peer library {module} is required (MATGPTQ_REQUIRE_PEERS=1) but not importable: {e}")
        pytest.skip(f"peer library {module} not installed (`make interop` installs the peers)", allow_module_level=True)


@pytest.fixture(scope="session")
def shared() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"{SHARED} is missing: the tests read ../shared beside the checkout")
    return SHARED


def make_tiny_llama(path: Path, hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, seed=0) -> Path:
    """A random LlamaForCausalLM with stories260K's tokenizer (vocab 512), saved as safetensors."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=512,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # larger-than-init weights so quantization error is visible but the model stays sane
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(5)
    model.save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(STORIES / name, path / name)
    return path


def make_bpe_tokenizer(path: Path, vocab_size: int = 384, chars: int = 60_000, pre_tokenizer=None, extra_text=""):
    """A GPT-2-style byte-level BPE tokenizer (SmolLM2's kind: ByteLevel pre-tokenizer and decoder, no byte fallback,
    specials <|endoftext|>=0, <|im_start|>=1 (bos), <|im_end|>=2 (eos)) trained on the first `chars` characters of
    TinyStories; saved to `path` as a transformers tokenizer. Deterministic, no network. `pre_tokenizer` replaces
    the plain ByteLevel one (tokenizers.pre_tokenizers object); `extra_text` is trained on too."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TINYSTORIES.read_text(encoding="utf-8")[:chars], extra_text], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|im_end|>",
    )
    fast.save_pretrained(path)
    return fast


def make_tiny_bpe_llama(path: Path, seed: int = 0, **tokenizer_options) -> Path:
    """A random LlamaForCausalLM (hidden 64, 2 layers, tied embeddings) with the byte-level BPE tokenizer above."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    tok = make_bpe_tokenizer(path, **tokenizer_options)
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=True,
    )
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # larger-than-init weights: quantization visibly changes the scores
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.mul_(5)
    model.save_pretrained(path, safe_serialization=True)
    return path


def quick_quantize(model: Path, out: Path, **kw) -> Path:
    """A small, fast quantization of `model` (8 windows × 64 tokens of TinyStories) for export tests."""
    import matgptq

    kw.setdefault("method", "gptq")
    matgptq.quantize(model, out, calib=TINYSTORIES, calib_range=(0.6, 1.0), nsamples=8, seqlen=64, progress=False, **kw)
    return out


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny") / "llama")


@pytest.fixture(scope="session")
def tiny_bpe_llama_dir(tmp_path_factory) -> Path:
    return make_tiny_bpe_llama(tmp_path_factory.mktemp("tiny") / "bpe-llama")


def random_parent(n, k, group, act_order, bits=8, width_scales=False, seed=0) -> QuantizedWeight:
    """A random c-bit parent; every code 0..2^c−1 occurs (the saturating top codes included)."""
    gen = torch.Generator().manual_seed(seed)
    gs = k if group == -1 else group
    g_idx = torch.arange(k, dtype=torch.int32) // gs
    if act_order:
        g_idx = g_idx[torch.randperm(k, generator=gen)]
    g = int(g_idx.max()) + 1
    codes = torch.randint(0, 1 << bits, (n, k), generator=gen, dtype=torch.uint8)
    codes.view(-1)[: 1 << bits] = torch.arange(1 << bits, dtype=torch.uint8)
    scales = (torch.rand(n, g, generator=gen) * 0.02 + 1e-3).to(torch.float16)
    zeros = torch.randint(0, 1 << bits, (n, g), generator=gen, dtype=torch.uint8)
    ws = {r: (scales.float() * (1 << (bits - r)) * 0.9).to(torch.float16) for r in (3, 4)} if width_scales else None
    return QuantizedWeight(codes, scales, zeros, g_idx, bits, width_scales=ws)
