"""Byte-level BPE vocabularies in GGUF (formats/gguf/vocab.py), checked by llama.cpp itself: for each pre-tokenizer
matgptq recognises, a tiny model whose tokenizer is trained here with that pre-tokenizer is exported, and llama.cpp's
token ids must equal the Hugging Face tokenizer's on real text (with the BOS/EOS the HF tokenizer adds); a
pre-tokenizer llama.cpp cannot reproduce is refused with one line and no file."""

from __future__ import annotations

import json

import pytest

from tests.conftest import SHARED, TINYSTORIES, make_tiny_bpe_llama, require_peer

pytestmark = pytest.mark.interop
pytest.importorskip("gguf")

from matgptq.errors import UserError  # noqa: E402
from matgptq.exporters.gguf import export_gguf  # noqa: E402
from matgptq.formats.gguf.vocab import bpe_pre_tokenizer  # noqa: E402

LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
TEXTS = [
    "Once upon a time, there was a little girl named Lily. She was 3 years old and had 1,234 toys!",
    "Numbers 2024, 3.14159 and 1000000; can't won't I'd we'll they've   spaces\t\ttabs\n\nnewlines\r\n",
    "“Quotes” — dashes… naïve café, emoji 🙂 and 漢字 are bytes here. <|im_end|> is special",
    " leading space",
    "a",
    "",
]


def tokenizer_options(pre: str) -> dict:
    """A tokenizer with that pre-tokenizer, trained on digit- and punctuation-rich text with a vocabulary large enough
    to hold merges that only its own pre-tokenizer allows (multi-digit numbers, punctuation + word): a tokenizer only
    has merges inside its own pre-tokens, so with too small a vocabulary a wrong pre-tokenizer name goes unnoticed."""
    wiki = (SHARED / "data" / "wikitext-2-raw" / "wiki.test.raw").read_text(encoding="utf-8")
    return {"pre_tokenizer": pre_tokenizers_under_test()[pre], "vocab_size": 2000, "extra_text": wiki[-400_000:]}


def pre_tokenizers_under_test():
    from tokenizers import Regex
    from tokenizers import pre_tokenizers as pt

    byte_level = pt.ByteLevel(add_prefix_space=False)
    no_regex = pt.ByteLevel(add_prefix_space=False, use_regex=False)
    return {
        "gpt-2": byte_level,
        "smollm": pt.Sequence([pt.Digits(individual_digits=True), byte_level]),
        "llama-bpe": pt.Sequence([pt.Split(Regex(LLAMA3), behavior="isolated"), no_regex]),
        "qwen2": pt.Sequence([pt.Split(Regex(QWEN2), behavior="isolated"), no_regex]),
    }


@pytest.mark.parametrize("pre", ["gpt-2", "smollm", "llama-bpe", "qwen2"])
def test_llamacpp_tokenizes_like_the_hf_tokenizer(pre, tmp_path):
    require_peer("llama_cpp")
    import gguf
    from llama_cpp import Llama
    from transformers import AutoTokenizer

    model = make_tiny_bpe_llama(tmp_path / "model", **tokenizer_options(pre))
    path = tmp_path / "model.gguf"
    export_gguf(model, path)
    fields = gguf.GGUFReader(path).fields
    value = lambda key: fields[key].contents()  # noqa: E731
    assert value("tokenizer.ggml.model") == "gpt2" and value("tokenizer.ggml.pre") == pre
    config = json.loads((model / "config.json").read_text())
    assert value("tokenizer.ggml.bos_token_id") == config["bos_token_id"]
    assert value("tokenizer.ggml.eos_token_id") == config["eos_token_id"]
    tok = AutoTokenizer.from_pretrained(model)
    wiki = (SHARED / "data" / "wikitext-2-raw" / "wiki.test.raw").read_text(encoding="utf-8")[:40_000]
    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        for text in TEXTS + [TINYSTORIES.read_text(encoding="utf-8")[-40_000:], wiki]:
            want = tok(text)["input_ids"]  # with whatever BOS/EOS the HF tokenizer adds
            assert llm.tokenize(text.encode("utf-8"), add_bos=True, special=True) == want, text[:60]
            assert llm.detokenize(want, special=True).decode("utf-8") == tok.decode(want), text[:60]
    finally:
        llm.close()


def test_a_pre_tokenizer_llama_cpp_cannot_reproduce_is_refused(tmp_path):
    from tokenizers import pre_tokenizers as pt

    model = make_tiny_bpe_llama(
        tmp_path / "model", pre_tokenizer=pt.Sequence([pt.Whitespace(), pt.ByteLevel(add_prefix_space=False)])
    )
    with pytest.raises(UserError, match="pre-tokenizer .* is not one llama.cpp can reproduce"):
        export_gguf(model, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(decoder={"type": "Metaspace"}), "decoder Metaspace is not ByteLevel"),
        (lambda d: d.update(normalizer={"type": "NFKC"}), "normalizer NFKC"),
        (lambda d: d["pre_tokenizer"].update(add_prefix_space=True), "is not one llama.cpp can reproduce"),
    ],
)
def test_what_llama_cpp_would_tokenize_differently_is_named(change, message):
    data = {
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
        "decoder": {"type": "ByteLevel"},
        "normalizer": None,
    }
    assert bpe_pre_tokenizer(json.loads(json.dumps(data))) == "gpt-2"
    change(data)
    with pytest.raises(UserError, match=message):
        bpe_pre_tokenizer(data)


@pytest.mark.slow
def test_the_real_smollm2_tokenizes_like_hf_on_whole_files(tmp_path):
    """SmolLM2-135M (make real-model): llama.cpp's token ids equal the HF tokenizer's on the whole WikiText-2 test
    text and the whole TinyStories file, and BOS/EOS/pad ids equal the model's."""
    require_peer("llama_cpp")
    import gguf
    from llama_cpp import Llama
    from transformers import AutoTokenizer

    from tests.conftest import REAL_MODEL as REAL

    if not (REAL / "model.safetensors").is_file():
        pytest.skip(f"{REAL} not made (make real-model)")
    path = tmp_path / "smollm2.gguf"
    export_gguf(REAL, path, float_type="f16")
    fields = gguf.GGUFReader(path).fields
    config = json.loads((REAL / "config.json").read_text())
    # the tokenizer.json transformers writes from the GGUF has a plain ByteLevel pre-tokenizer (SmolLM's digit split
    # is not in it); llama.cpp's own converter names it "smollm" by a hash, which gives the same ids here only
    # because the vocabulary has no multi-digit tokens
    assert fields["tokenizer.ggml.pre"].contents() == "gpt-2"
    for key in ("bos", "eos", "pad"):
        if config.get(f"{key}_token_id") is not None:
            assert (
                fields[f"tokenizer.ggml.{'padding' if key == 'pad' else key}_token_id"].contents()
                == config[f"{key}_token_id"]
            ), key
    tok = AutoTokenizer.from_pretrained(REAL)
    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        for file in (SHARED / "data" / "wikitext-2-raw" / "wiki.test.raw", TINYSTORIES):
            text = file.read_text(encoding="utf-8")
            want = tok(text)["input_ids"]
            assert llm.tokenize(text.encode("utf-8"), add_bos=True, special=True) == want, file.name
    finally:
        llm.close()
