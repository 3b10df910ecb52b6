"""The tokenizer of a GGUF file (tokenizer.ggml.*, docs/formats.md §3.9): exactly what llama.cpp needs to produce the
Hugging Face tokenizer's token ids, or a one-line refusal — never an approximation.

Written:
- SentencePiece (`tokenizer.model`) and SentencePiece-style BPE with byte fallback (e.g. Llama-2's) as
  tokenizer model "llama";
- GPT-2-style byte-level BPE (SmolLM, GPT-2, Llama-3, Qwen2) as "gpt2", with its merges and the pre-tokenizer name
  llama.cpp keys its splitting regex on (`tokenizer.ggml.pre`, src/llama-vocab.cpp), recognised from the
  tokenizer.json pre-tokenizer itself:
      ByteLevel(use_regex)                                   -> "gpt-2"    (the GPT-2 regex)
      Digits(individual_digits) + ByteLevel(use_regex)       -> "smollm"   (each digit alone, then the GPT-2 regex)
      Split(Llama-3's regex, Isolated) + ByteLevel(no regex) -> "llama-bpe"
      Split(Qwen2's regex, Isolated) + ByteLevel(no regex)   -> "qwen2"
  Anything else (another normalizer, pre-tokenizer or decoder) is refused.
Whether the tokenizer adds BOS/EOS is asked of the Hugging Face tokenizer itself and written explicitly, so llama.cpp
does not fall back to its per-`pre` default.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ...errors import UserError
from .types import gguf_module

_SPLITS = {  # the Split regex of tokenizer.json -> llama.cpp's pre-tokenizer name
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
}
SUPPORTED = "SentencePiece, BPE with byte_fallback, or byte-level BPE with the GPT-2/SmolLM/Llama-3/Qwen2 pre-tokenizer"


def add_vocab(writer, tok_dir: Path, n_vocab: int, warn) -> None:
    """tokenizer.ggml.* for the tokenizer files in `tok_dir` (see the module docstring for what is supported)."""
    tj = tok_dir / "tokenizer.json"
    if not tj.is_file():
        if (tok_dir / "tokenizer.model").is_file():
            _add_sentencepiece_vocab(writer, tok_dir, n_vocab)
            return
        warn(f"no tokenizer.json in {tok_dir}: the GGUF has no vocabulary (llama.cpp cannot tokenize text)")
        writer.add_tokenizer_model("none")
        return
    data = json.loads(tj.read_text(encoding="utf-8"))
    model = data.get("model") or {}
    if model.get("type") == "BPE" and model.get("byte_fallback", False):
        _add_spm_style_bpe(writer, data, tok_dir, n_vocab)
    elif model.get("type") == "BPE":
        _add_byte_level_bpe(writer, data, tok_dir, n_vocab)
    else:
        raise UserError(
            f"{tj}: a {model.get('type')} tokenizer cannot be written to GGUF by matgptq (supported: "
            f"{SUPPORTED}); convert it with llama.cpp's convert_hf_to_gguf.py"
        )


def _vocab(data: dict, tj: Path, n_vocab: int) -> tuple[dict[str, int], dict[str, dict]]:
    """token -> id (the model's vocabulary plus the added tokens) and the added tokens by content."""
    vocab: dict[str, int] = dict(data["model"]["vocab"])
    added = {t["content"]: t for t in data.get("added_tokens", [])}
    for content, t in added.items():
        vocab.setdefault(content, t["id"])
    size = max(vocab.values()) + 1
    if size > n_vocab:
        raise UserError(f"{tj} has {size} tokens but the model's vocab_size is {n_vocab}")
    return vocab, added


def bpe_pre_tokenizer(data: dict) -> str:
    """llama.cpp's `tokenizer.ggml.pre` for a byte-level BPE tokenizer.json, or a UserError naming what is not."""

    def steps(node) -> list[dict]:
        if not node:
            return []
        return [s for sub in node["pretokenizers"] for s in steps(sub)] if node.get("type") == "Sequence" else [node]

    pre, decoder, normalizer = steps(data.get("pre_tokenizer")), data.get("decoder") or {}, data.get("normalizer")
    shape = [p.get("type") for p in pre]
    name = None
    last = pre[-1] if pre else {}
    if shape and shape[-1] == "ByteLevel" and not last.get("add_prefix_space", False):
        if shape == ["ByteLevel"] and last.get("use_regex", True):
            name = "gpt-2"
        elif shape == ["Digits", "ByteLevel"] and pre[0].get("individual_digits") and last.get("use_regex", True):
            name = "smollm"
        elif (
            shape == ["Split", "ByteLevel"]
            and not last.get("use_regex", True)
            and pre[0].get("behavior") == "Isolated"
            and not pre[0].get("invert", False)
        ):
            name = _SPLITS.get((pre[0].get("pattern") or {}).get("Regex"))
    if name is None:
        raise UserError(
            f"tokenizer.json's pre-tokenizer {json.dumps(data.get('pre_tokenizer'))[:120]} is not one "
            f"llama.cpp can reproduce (supported: {SUPPORTED})"
        )
    if decoder.get("type") != "ByteLevel":
        raise UserError(f"tokenizer.json's decoder {decoder.get('type')} is not ByteLevel (supported: {SUPPORTED})")
    if normalizer is not None and not (name == "qwen2" and normalizer.get("type") == "NFC"):
        raise UserError(
            f"tokenizer.json's normalizer {normalizer.get('type')} is not one llama.cpp applies "
            f"(supported: none; NFC for Qwen2)"
        )
    return name


def _add_byte_level_bpe(writer, data: dict, tok_dir: Path, n_vocab: int) -> None:
    """GPT-2-style ("gpt2"): tokens as tokenizer.json spells them, merges, the pre-tokenizer name, special tokens."""
    gguf = gguf_module()
    from transformers import AutoTokenizer

    pre = bpe_pre_tokenizer(data)
    vocab, added = _vocab(data, tok_dir / "tokenizer.json", n_vocab)
    hf = AutoTokenizer.from_pretrained(tok_dir)
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    types = [gguf.TokenType.UNUSED] * n_vocab
    for text, i in vocab.items():
        if text in added and added[text].get("special", False):
            tokens[i], types[i] = text, gguf.TokenType.CONTROL
        elif text in added:  # llama.cpp matches user-defined tokens on the raw text, not on its byte-level spelling
            tokens[i], types[i] = hf.decode([i]), gguf.TokenType.USER_DEFINED
        else:
            tokens[i], types[i] = text, gguf.TokenType.NORMAL
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(tok_dir, load_merges=True, n_vocab=n_vocab)
    if not special.merges:
        raise UserError(
            f"{tok_dir}/tokenizer.json has no merges; llama.cpp cannot tokenize with a byte-level BPE without them"
        )
    ids = hf("a")["input_ids"]  # what the Hugging Face tokenizer adds around a text
    special.add_special_token["bos"] = hf.bos_token_id is not None and ids[0] == hf.bos_token_id
    special.add_special_token["eos"] = hf.eos_token_id is not None and ids[-1] == hf.eos_token_id
    special.add_to_gguf(writer, quiet=True)


def _add_spm_style_bpe(writer, data: dict, tok_dir: Path, n_vocab: int) -> None:
    """SentencePiece-style ("llama") from a byte-fallback BPE tokenizer.json.

    llama.cpp's SPM tokenizer merges the adjacent pair whose *result* has the highest score; HF's BPE applies merges
    in rank order. With score(token) = −(rank of the first merge producing it) both pick the same merges (gguf-py's
    LlamaHfVocab writes −1000 for every token, which makes llama.cpp merge left to right and tokenize differently).
    """
    gguf = gguf_module()
    model = data["model"]
    vocab, added = _vocab(data, tok_dir / "tokenizer.json", n_vocab)
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
    gguf = gguf_module()
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
