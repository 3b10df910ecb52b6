"""GGUF metadata for llama.cpp: the Llama hyper-parameters (formats.md §5.3).

gguf_arch.py names the tensors, gguf_tensors.py encodes them, gguf_vocab.py writes the tokenizer and gguf.py writes
the file; this module only describes the model's shape to llama.cpp.
"""

from __future__ import annotations

import numpy as np

from ..errors import UserError


def _gguf():
    try:
        import gguf
    except ImportError:
        raise UserError("GGUF export needs the gguf package (gguf-py): pip install gguf") from None
    return gguf


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
