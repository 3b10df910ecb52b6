"""GGUF metadata for llama.cpp: the hyper-parameters of each architecture of arch.py (docs/formats.md §3.1).

arch.py names the tensors, tensors.py encodes them, vocab.py writes the tokenizer and writer.py writes the file;
this module only describes the model's shape to llama.cpp.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import UserError
from .arch import gguf_arch
from .metadata_arch import add_arch_metadata, add_dimensions, add_experts
from .types import gguf_module

# --- metadata -------------------------------------------------------------------------------------------------------


def hparams(config: dict) -> dict:
    """The hyper-parameters llama.cpp needs, from the HF config (the dict of config.json)."""
    from transformers import AutoConfig

    arch = gguf_arch(config.get("model_type"))
    cfg = AutoConfig.for_model(**config)
    act = getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", None) or "silu"
    if act != arch.act:
        raise UserError(f"llama.cpp's {arch.name} graph uses the activation {arch.act}; this model uses {act}")
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    if not rope:
        rope = {"rope_theta": getattr(cfg, "rope_theta", 10000.0), **(getattr(cfg, "rope_scaling", None) or {})}
    rope.setdefault("original_max_position_embeddings", getattr(cfg, "original_max_position_embeddings", None))
    rope.setdefault("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", 1.0))
    return {
        "arch": arch,
        "n_vocab": cfg.vocab_size,
        "n_ctx": cfg.max_position_embeddings,
        "n_embd": cfg.hidden_size,
        "n_layer": cfg.num_hidden_layers,
        "n_ff": cfg.intermediate_size,
        "n_head": heads,
        "n_head_kv": getattr(cfg, "num_key_value_heads", None) or heads,
        "head_dim": head_dim,
        "head_dim_in_config": config.get("head_dim") is not None and arch.name != "granite",  # GraniteModel pops it
        "eps": cfg.rms_norm_eps,
        "rope": rope,
        "config": config,
        "tied": bool(getattr(cfg, "tie_word_embeddings", False)),
        "sliding_window": config.get("sliding_window"),
        "n_expert": _first(config, "num_local_experts", "num_experts", "n_routed_experts"),
        "n_expert_used": _first(config, "num_experts_per_tok", "num_experts_per_token", "top_k_experts"),
    }


def _first(config: dict, *keys: str):
    """The value of the first of `keys` in the config (None if it has none), as convert_hf_to_gguf's find_hparam."""
    return next((config[k] for k in keys if k in config), None)


def add_metadata(writer, hp: dict, name: str) -> list[tuple[str, np.ndarray]]:
    """The model keys convert_hf_to_gguf writes for this architecture (TextModel.set_gguf_parameters, plus
    LlamaModel's vocab size and RoPE dimensions, or Phi3MiniModel's own set); returns extra tensors (RoPE factors)."""
    writer.add_name(name)
    if hp["arch"].name == "phi3":
        return _phi3_metadata(writer, hp)
    if hp["arch"].name in ("gemma2", "gemma3"):
        add_arch_metadata(writer, hp)
        return []
    add_dimensions(writer, hp)
    rope = hp["rope"]
    writer.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(hp["eps"]))
    add_experts(writer, hp)
    if hp["head_dim_in_config"]:
        writer.add_key_length(hp["head_dim"])
        writer.add_value_length(hp["head_dim"])
    if hp["arch"].name in ("llama", "granite"):  # LlamaModel.set_gguf_parameters (GraniteModel's base)
        writer.add_vocab_size(hp["n_vocab"])
        writer.add_rope_dimension_count(hp["head_dim"])
    if hp["arch"].name == "granite":
        add_arch_metadata(writer, hp)
    kind = (rope.get("rope_type") or rope.get("type") or "default").lower()
    if kind == "default":
        return []
    gguf = gguf_module()
    if kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
        return []
    if kind == "yarn":  # Qwen2.5's long-context setting
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(float(rope["factor"]))
        writer.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
        for key, add in (
            ("extrapolation_factor", writer.add_rope_scaling_yarn_ext_factor),
            ("attention_factor", writer.add_rope_scaling_yarn_attn_factor),
            ("beta_fast", writer.add_rope_scaling_yarn_beta_fast),
            ("beta_slow", writer.add_rope_scaling_yarn_beta_slow),
        ):
            if rope.get(key) is not None:
                add(float(rope[key]))
        return []
    if kind == "llama3" and hp["arch"].name == "llama":  # convert_hf_to_gguf LlamaModel.generate_extra_tensors
        return [("rope_freqs.weight", _llama3_factors(rope, hp["head_dim"]))]
    raise UserError(
        f"RoPE scaling '{kind}' of a {hp['arch'].name} model is not supported by the GGUF exporter "
        "(supported: none, linear, yarn, llama3 for Llama, longrope for Phi-3)"
    )


def _llama3_factors(rope: dict, dim: int) -> np.ndarray:
    base = float(rope.get("rope_theta", 10000.0))
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, lo, hi = (
        float(rope.get("factor", 8.0)),
        float(rope.get("low_freq_factor", 1.0)),
        float(rope.get("high_freq_factor", 4.0)),
    )
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
    return np.asarray(out, dtype=np.float32)


def _phi3_metadata(writer, hp: dict) -> list[tuple[str, np.ndarray]]:
    """convert_hf_to_gguf Phi3MiniModel.set_gguf_parameters / generate_extra_tensors."""
    rope = hp["rope"]
    orig = rope.get("original_max_position_embeddings")
    if orig is None:
        raise UserError("this Phi-3 config has no original_max_position_embeddings, which llama.cpp's phi3 needs")
    rope_dims = int(float(rope.get("partial_rotary_factor") or 1.0) * hp["n_embd"]) // hp["n_head"]
    writer.add_context_length(hp["n_ctx"])
    writer.add_rope_scaling_orig_ctx_len(int(orig))
    writer.add_embedding_length(hp["n_embd"])
    writer.add_feed_forward_length(hp["n_ff"])
    writer.add_block_count(hp["n_layer"])
    writer.add_head_count(hp["n_head"])
    writer.add_head_count_kv(hp["n_head_kv"])
    writer.add_layer_norm_rms_eps(float(hp["eps"]))
    writer.add_rope_dimension_count(rope_dims)
    writer.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    writer.add_sliding_window(int(hp["sliding_window"] or 0))
    long, short = rope.get("long_factor"), rope.get("short_factor")
    if not long:
        return []
    kind = (rope.get("rope_type") or rope.get("type") or "").lower()
    scale = hp["n_ctx"] / int(orig)
    if kind not in ("su", "longrope") or not short or len(long) != len(short) or len(long) != rope_dims / 2:
        raise UserError(
            f"Phi-3 RoPE scaling '{kind}' with these factors is not supported by the GGUF exporter "
            "(supported: longrope with long/short factors of rope_dims/2 each)"
        )
    writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(int(orig))) if scale > 1.0 else 1.0)
    return [
        ("rope_factors_long.weight", np.asarray(long, dtype=np.float32)),
        ("rope_factors_short.weight", np.asarray(short, dtype=np.float32)),
    ]
