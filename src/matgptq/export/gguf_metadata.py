"""GGUF metadata for llama.cpp: Llama hyper-parameters (formats.md §5.3) and the tokenizer (tokenizer.ggml.*).

gguf_arch.py names the tensors, gguf_tensors.py encodes them and gguf.py writes the file; this module only
describes the model to llama.cpp.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from ..errors import UserError


def _gguf():
    try:
        import gguf
    except ImportError:
        raise UserError("GGUF export needs the gguf package (gguf-py): pip install gguf") from None
    return gguf


# --- tokenizer ------------------------------------------------------------------------------------------------------


def _add_vocab(writer, tok_dir: Path, n_vocab: int, warn) -> None:
    """tokenizer.ggml.* for llama.cpp: SentencePiece-style ("llama") from a byte-fallback BPE tokenizer.json.

    llama.cpp's SPM tokenizer merges the adjacent pair whose *result* has the highest score; HF's BPE applies merges
    in rank order. With score(token) = −(rank of the first merge producing it) both pick the same merges (gguf-py's
    LlamaHfVocab writes −1000 for every token, which makes llama.cpp merge left to right and tokenize differently).
    """
    gguf = _gguf()
    tj = tok_dir / "tokenizer.json"
    if not tj.is_file():
        if (tok_dir / "tokenizer.model").is_file():
            _add_sentencepiece_vocab(writer, tok_dir, n_vocab)
            return
        warn(f"no tokenizer.json in {tok_dir}: the GGUF has no vocabulary (llama.cpp cannot tokenize text)")
        writer.add_tokenizer_model("none")
        return
    data = json.loads(tj.read_text(encoding="utf-8"))
    model = data.get("model", {})
    if model.get("type") != "BPE" or not model.get("byte_fallback", False):
        raise UserError(f"{tj}: only Llama/SentencePiece-style tokenizers (BPE with byte_fallback) can be written to "
                        "GGUF by matgptq; convert this model's tokenizer with llama.cpp's convert_hf_to_gguf.py")
    vocab: dict[str, int] = dict(model["vocab"])
    added = {t["content"]: t for t in data.get("added_tokens", [])}
    for content, t in added.items():
        vocab.setdefault(content, t["id"])
    size = max(vocab.values()) + 1
    if size > n_vocab:
        raise UserError(f"{tj} has {size} tokens but the model's vocab_size is {n_vocab}")
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    types = [gguf.TokenType.UNUSED] * n_vocab
    scores = [-1000.0] * n_vocab
    rank: dict[str, int] = {}
    for r, mg in enumerate(model.get("merges", [])):
        a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
        rank.setdefault(a + b, r)
    unk = model.get("unk_token")
    for text, i in vocab.items():
        tokens[i] = text
        scores[i] = -float(rank[text]) if text in rank else 0.0
        if text in added and added[text].get("special", False):
            types[i] = gguf.TokenType.UNKNOWN if text == unk else gguf.TokenType.CONTROL
        elif text in added:
            types[i] = gguf.TokenType.USER_DEFINED
        elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", text):
            types[i] = gguf.TokenType.BYTE
        elif text == unk:
            types[i] = gguf.TokenType.UNKNOWN
        else:
            types[i] = gguf.TokenType.NORMAL
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_add_space_prefix(_prepends_space(data))
    gguf.SpecialVocab(tok_dir, load_merges=False, n_vocab=n_vocab).add_to_gguf(writer, quiet=True)


def _prepends_space(tokenizer_json: dict) -> bool:
    text = json.dumps([tokenizer_json.get("normalizer"), tokenizer_json.get("pre_tokenizer")])
    if '"Prepend"' in text:
        return True
    m = re.search(r'"prepend_scheme":\s*"(\w+)"', text)
    if m:
        return m.group(1) != "never"
    return '"add_prefix_space": true' in text


def _add_sentencepiece_vocab(writer, tok_dir: Path, n_vocab: int) -> None:
    gguf = _gguf()
    try:
        vocab = gguf.vocab.SentencePieceVocab(tok_dir)
    except (ImportError, FileNotFoundError) as e:
        raise UserError(f"{tok_dir}/tokenizer.model needs the sentencepiece package for GGUF ({e})") from None
    tokens, scores, types = [], [], []
    for text, score, typ in vocab.all_tokens():
        tokens.append(text), scores.append(score), types.append(typ)
    if len(tokens) > n_vocab:
        raise UserError(f"{tok_dir}/tokenizer.model has {len(tokens)} tokens but the model's vocab_size is {n_vocab}")
    for i in range(len(tokens), n_vocab):
        tokens.append(f"[PAD{i}]".encode()), scores.append(-1000.0), types.append(gguf.TokenType.UNUSED)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    gguf.SpecialVocab(tok_dir, load_merges=False, n_vocab=n_vocab).add_to_gguf(writer, quiet=True)


# --- metadata -------------------------------------------------------------------------------------------------------


def _hparams(config: dict) -> dict:
    from transformers import AutoConfig

    if config.get("model_type") != "llama":
        raise UserError(f"GGUF export supports the Llama architecture only (model_type 'llama'); this model is "
                        f"'{config.get('model_type')}'")  # fmt: skip
    cfg = AutoConfig.for_model(**config)
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise UserError(f"llama.cpp's Llama graph uses SiLU; this model uses {cfg.hidden_act}")
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    if not rope:
        rope = {"rope_theta": getattr(cfg, "rope_theta", 10000.0), **(getattr(cfg, "rope_scaling", None) or {})}
    return {
        "n_vocab": cfg.vocab_size, "n_ctx": cfg.max_position_embeddings, "n_embd": cfg.hidden_size,
        "n_layer": cfg.num_hidden_layers, "n_ff": cfg.intermediate_size, "n_head": heads,
        "n_head_kv": getattr(cfg, "num_key_value_heads", None) or heads, "head_dim": head_dim,
        "eps": cfg.rms_norm_eps, "rope": rope, "tied": bool(getattr(cfg, "tie_word_embeddings", False)),
    }  # fmt: skip


def _add_metadata(writer, hp: dict, name: str) -> list[tuple[str, np.ndarray]]:
    """Llama keys; returns extra tensors (rope_freqs for llama3 RoPE scaling)."""
    writer.add_name(name)
    writer.add_context_length(hp["n_ctx"])
    writer.add_embedding_length(hp["n_embd"])
    writer.add_block_count(hp["n_layer"])
    writer.add_feed_forward_length(hp["n_ff"])
    writer.add_head_count(hp["n_head"])
    writer.add_head_count_kv(hp["n_head_kv"])
    writer.add_layer_norm_rms_eps(float(hp["eps"]))
    writer.add_rope_dimension_count(hp["head_dim"])
    if hp["head_dim"] != hp["n_embd"] // hp["n_head"]:
        writer.add_key_length(hp["head_dim"])
        writer.add_value_length(hp["head_dim"])
    writer.add_vocab_size(hp["n_vocab"])
    rope = hp["rope"]
    writer.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    kind = (rope.get("rope_type") or rope.get("type") or "default").lower()
    if kind == "default":
        return []
    gguf = _gguf()
    if kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
        return []
    if kind == "llama3":  # convert_hf_to_gguf LlamaModel.generate_extra_tensors
        base, dim = float(rope.get("rope_theta", 10000.0)), hp["head_dim"]
        freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
        factor, lo, hi = float(rope.get("factor", 8.0)), float(rope.get("low_freq_factor", 1.0)), float(
            rope.get("high_freq_factor", 4.0))  # fmt: skip
        old = float(rope.get("original_max_position_embeddings", 8192))
        out = []
        for f in freqs:
            wavelen = 2 * np.pi / f
            if wavelen < old / hi:
                out.append(1.0)
            elif wavelen > old / lo:
                out.append(factor)
            else:
                smooth = (old / wavelen - lo) / (hi - lo)
                out.append(1 / ((1 - smooth) / factor + smooth))
        return [("rope_freqs.weight", np.asarray(out, dtype=np.float32))]
    raise UserError(f"RoPE scaling '{kind}' is not supported by the GGUF exporter (supported: none, linear, llama3)")
