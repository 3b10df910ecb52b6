"""A GGUF file → a plain Hugging Face model directory (float32 safetensors, config.json, tokenizer), verified.

transformers' GGUF loader dequantizes the weights to float32 (the reference "fp32" model of a GGUF-shipped model);
`save_pretrained` refuses a model that still carries the GGUF quantizer, so the weights and the config (without its
`quantization_config`) are written here. The tokenizer transformers converts from the GGUF metadata depends on the
transformers version (transformers 5.17, for one, writes a byte-fallback tokenizer with the wrong eos), so what
is written is checked against the GGUF's own vocabulary and special ids, and refused, never written half-right.
Needs the `gguf` and `accelerate` packages (`pip install 'matgptq[real-model]'`). A tool of `make real-model`
(tools/real_model.py), not part of the package: it builds the project's reference model, nothing a user loads.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from matgptq.errors import UserError
from matgptq.fsutil import atomic_output
from matgptq.models.hf import load_fp_model

# Text whose encode → decode must give it back: ASCII, accents, CJK, an emoji, spaces and newlines.
ROUND_TRIP = "Hello world,  héllo\n\nnaïve café — 東京 🙂 x=3.14;\ttab"


def _require_converters() -> None:
    for module in ("gguf", "accelerate"):
        try:
            __import__(module)
        except ImportError:
            raise UserError(f"reading GGUF needs the '{module}' package; pip install 'matgptq[real-model]'") from None


def gguf_vocabulary(path: Path) -> dict:
    """The tokenizer facts a GGUF file states itself: model kind, tokens (id order), merges count, special ids."""
    from gguf import GGUFReader

    try:
        fields = GGUFReader(path).fields
    except Exception as e:  # a truncated or foreign file: gguf-py raises ValueError, struct.error, …
        raise UserError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e})".splitlines()[0]) from None

    def value(key: str):
        f = fields.get(key)
        return None if f is None else f.contents()

    return {
        "model": value("tokenizer.ggml.model"),
        "tokens": value("tokenizer.ggml.tokens"),
        "merges": len(value("tokenizer.ggml.merges") or ()),
        "bos_token_id": value("tokenizer.ggml.bos_token_id"),
        "eos_token_id": value("tokenizer.ggml.eos_token_id"),
    }


def _has_byte_level(component: dict | None) -> bool:
    if not component:
        return False
    if component.get("type") == "ByteLevel":
        return True
    return any(_has_byte_level(c) for c in component.get("pretokenizers", component.get("decoders", [])))


def check_byte_level_tokenizer(model_dir: str | Path, eos_token: str, vocabulary: dict | None = None) -> None:
    """Refuse (UserError) unless `model_dir` holds a GPT-2-style byte-level BPE tokenizer whose eos is `eos_token`
    and whose bos/eos ids and size are config.json's (and, given the GGUF's `vocabulary`, its tokens and merges)."""
    from transformers import AutoTokenizer

    d = Path(model_dir)
    tj = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((d / "config.json").read_text())
    model = tj.get("model", {})
    problems = []
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        problems.append(
            f"model {model.get('type')} with byte_fallback={model.get('byte_fallback')} "
            "(expected byte-level BPE, byte_fallback false)"
        )
    if not (_has_byte_level(tj.get("pre_tokenizer")) and _has_byte_level(tj.get("decoder"))):
        problems.append("no ByteLevel pre-tokenizer and decoder")
    try:
        tok = AutoTokenizer.from_pretrained(d)
    except Exception as e:  # the tokenizers library raises plain Exception on a malformed tokenizer.json
        raise UserError(f"the tokenizer written to {d} does not load ({e})".splitlines()[0]) from None
    if tok.eos_token != eos_token:
        problems.append(f"eos token {tok.eos_token!r} (expected {eos_token!r})")
    for kind in ("bos", "eos"):
        if (
            config.get(f"{kind}_token_id") is not None
            and getattr(tok, f"{kind}_token_id") != config[f"{kind}_token_id"]
        ):
            problems.append(
                f"{kind} id {getattr(tok, f'{kind}_token_id')} (config.json says {config[f'{kind}_token_id']})"
            )
    if len(tok) != config.get("vocab_size"):
        problems.append(f"{len(tok)} tokens (config.json says vocab_size {config.get('vocab_size')})")
    decoded = tok.decode(tok(ROUND_TRIP, add_special_tokens=False)["input_ids"])
    if decoded != ROUND_TRIP:
        problems.append(f"decode(encode(text)) changes the text ({decoded[:30]!r}…)")
    if vocabulary is not None:
        if vocabulary["model"] != "gpt2":
            problems.append(f"the GGUF's tokenizer is {vocabulary['model']!r}, not 'gpt2' (byte-level BPE)")
        if tok.convert_ids_to_tokens(list(range(len(tok)))) != list(vocabulary["tokens"] or []):
            problems.append("its id → token table differs from the GGUF's tokenizer.ggml.tokens")
        if len(model.get("merges", [])) != vocabulary["merges"]:
            problems.append(f"{len(model.get('merges', []))} merges (the GGUF has {vocabulary['merges']})")
        for kind in ("bos", "eos"):
            if vocabulary[f"{kind}_token_id"] != config.get(f"{kind}_token_id"):
                problems.append(
                    f"config.json {kind}_token_id {config.get(f'{kind}_token_id')} (the GGUF says "
                    f"{vocabulary[f'{kind}_token_id']})"
                )
    if problems:
        raise UserError(
            f"the tokenizer written to {d} is not the original byte-level BPE: {'; '.join(problems)}; "
            "use the transformers version pinned in .ci/constraints.txt"
        )


def check_config(model_dir: str | Path, expected: dict) -> None:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    wrong = [f"{k}={config.get(k)!r} (expected {v!r})" for k, v in expected.items() if config.get(k) != v]
    if wrong:
        raise UserError(f"the converted config.json is not the expected model: {', '.join(wrong)}")


def import_gguf(
    gguf_file: str | Path, out: str | Path, expected_config: dict, eos_token: str, overwrite: bool = False
) -> Path:
    """Dequantize `gguf_file` to float32 and write a verified HF model directory to `out` (atomically)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _require_converters()
    src = Path(gguf_file)
    vocabulary = gguf_vocabulary(src)
    with atomic_output(out, overwrite=overwrite) as tmp:
        try:
            model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            raise UserError(f"transformers cannot convert {src} ({type(e).__name__}: {e})".splitlines()[0]) from None
        config = model.config
        config.__dict__.pop("quantization_config", None)  # the weights written are plain float32
        tensors, seen = {}, set()
        for name, t in model.state_dict().items():
            if t.data_ptr() in seen:  # tied lm_head: stored once, as the embedding
                continue
            seen.add(t.data_ptr())
            tensors[name] = t.contiguous()
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        check_config(tmp, expected_config)
        check_byte_level_tokenizer(tmp, eos_token, vocabulary)
        reloaded = load_fp_model(tmp).state_dict()  # what a reader of the directory gets is what was converted
        different = [n for n, t in model.state_dict().items() if not torch.equal(reloaded[n], t)]
        if different:
            raise UserError(f"{different[0]} reads back differently from {tmp}; the conversion is broken")
    return Path(out)
