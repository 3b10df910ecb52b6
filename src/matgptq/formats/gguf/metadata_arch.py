"""GGUF metadata of the architectures whose convert_hf_to_gguf class writes its own keys (Granite, Gemma 2, Gemma 3),
and the checks that a model is one llama.cpp's graph for it computes (docs/formats.md §3.1).

llama.cpp's Gemma graphs assume what the converter does not write: the query scale 1/√head_dim
(query_pre_attn_scalar = head_dim), the sliding-window layers of its fixed pattern (every 2nd layer full in Gemma 2,
every 6th in Gemma 3), Gemma 2's RoPE base 10000 and its output tied to the embeddings. A model that differs is
refused rather than written as a file llama.cpp would run differently.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...errors import UserError

_SWA_PERIOD = {"gemma2": 2, "gemma3": 6}  # llama.cpp's set_swa_pattern for these graphs


def check_model(hp: dict, tok_dir: Path) -> None:
    """UserError if llama.cpp's graph for this architecture would not compute this model."""
    arch, cfg = hp["arch"].name, hp["config"]
    if arch == "granite" and hp["head_dim"] * hp["n_head"] != hp["n_embd"]:
        raise UserError("llama.cpp's granite graph has head_dim = hidden_size / heads (the converter drops head_dim)")
    if hp["n_expert"] is not None:
        _check_moe(hp)
    if arch not in _SWA_PERIOD:
        return
    where = f"llama.cpp's {arch} graph"
    if cfg.get("query_pre_attn_scalar", hp["head_dim"]) != hp["head_dim"]:
        raise UserError(
            f"{where} scales queries by 1/sqrt(head_dim); this model's query_pre_attn_scalar is "
            f"{cfg['query_pre_attn_scalar']} (head_dim {hp['head_dim']})"
        )
    period = _SWA_PERIOD[arch]
    want = ["sliding_attention" if i % period < period - 1 else "full_attention" for i in range(hp["n_layer"])]
    if cfg.get("layer_types") not in (None, want):
        raise UserError(f"{where} has a full-attention layer every {period} layers; this model's layer_types differ")
    rope = _full_rope(hp)
    if arch == "gemma2":
        if float(rope.get("rope_theta", 10000.0)) != 10000.0 or rope.get("rope_type", "default") != "default":
            raise UserError(
                f"{where} uses RoPE base 10000 without scaling (the converter writes none); this model has another RoPE"
            )
        if not hp["tied"]:
            raise UserError(
                f"{where} ties the output to the embeddings (the converter drops lm_head); this model's "
                "lm_head is separate"
            )
    elif cfg.get("attn_logit_softcapping") is not None:
        raise UserError(f"{where} has no attention logit soft-capping; this model sets attn_logit_softcapping")
    if arch == "gemma3":
        _check_gemma3_vocab(hp, tok_dir)


def _check_moe(hp: dict) -> None:
    """llama.cpp's qwen3moe and llama (Mixtral) graphs: every block a sparse MoE block whose top-k routing weights are
    renormalised to sum to 1 (build_moe_ffn with norm_w), attention over the whole context."""
    cfg, where = hp["config"], f"llama.cpp's {hp['arch'].name} graph"
    if cfg.get("model_type") == "qwen3_moe":
        if not cfg.get("norm_topk_prob", False):
            raise UserError(f"{where} renormalises the top-k routing weights; this model sets norm_topk_prob false")
        if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
            raise UserError(
                f"{where} has experts in every block; this model has dense MLP blocks (mlp_only_layers / "
                "decoder_sparse_step)"
            )
    window = hp["sliding_window"]
    if cfg.get("model_type") == "mixtral" and window is not None and window < hp["n_ctx"]:
        raise UserError(f"{where} attends to the whole context; this model's sliding_window is {window}")


def _check_gemma3_vocab(hp: dict, tok_dir: Path) -> None:
    """Gemma3Model.modify_tensors keeps only the tokenizer's rows of the embeddings; matgptq keeps all of them."""
    tj = Path(tok_dir) / "tokenizer.json"
    if not tj.is_file():
        if (Path(tok_dir) / "tokenizer.model").is_file():
            raise UserError(
                "a Gemma 3 model with a SentencePiece tokenizer.model: llama.cpp's converter trims the "
                "embeddings to its vocabulary, which matgptq's GGUF export does not do yet"
            )
        return
    data = json.loads(tj.read_text(encoding="utf-8"))
    n_real = len((data.get("model") or {}).get("vocab") or {}) + len(data.get("added_tokens") or [])
    if n_real < hp["n_vocab"]:
        raise UserError(
            f"llama.cpp's converter trims this Gemma 3 model's {hp['n_vocab']} embedding rows to its "
            f"tokenizer's {n_real} tokens; matgptq's GGUF export does not trim embeddings yet"
        )


def _full_rope(hp: dict) -> dict:
    rope = hp["rope"]
    return dict(rope.get("full_attention", rope))


def add_arch_metadata(writer, hp: dict) -> None:
    """The keys of GraniteModel / Gemma2Model / Gemma3Model.set_gguf_parameters beyond the common ones."""
    {"granite": _granite, "gemma2": _gemma2, "gemma3": _gemma3}[hp["arch"].name](writer, hp)


def _granite(writer, hp: dict) -> None:
    """GraniteModel: LlamaModel's keys (written by metadata.add_metadata) plus the multipliers, when non-zero."""
    cfg = hp["config"]
    for key, add in (
        ("attention_multiplier", writer.add_attention_scale),
        ("embedding_multiplier", writer.add_embedding_scale),
        ("residual_multiplier", writer.add_residual_scale),
        ("logits_scaling", writer.add_logit_scale),
    ):
        if cfg.get(key):
            add(float(cfg[key]))


def add_experts(writer, hp: dict) -> None:
    """TextModel's expert counts (any architecture whose config has them), and Qwen2MoeModel's expert FFN length."""
    cfg = hp["config"]
    if hp["n_expert"] is not None:
        writer.add_expert_count(int(hp["n_expert"]))
    if hp["n_expert_used"] is not None:
        writer.add_expert_used_count(int(hp["n_expert_used"]))
    if hp["arch"].name == "qwen3moe":
        if cfg.get("moe_intermediate_size") is not None:
            writer.add_expert_feed_forward_length(int(cfg["moe_intermediate_size"]))
        if cfg.get("shared_expert_intermediate_size") is not None:
            writer.add_expert_shared_feed_forward_length(int(cfg["shared_expert_intermediate_size"]))


def add_dimensions(writer, hp: dict) -> None:
    """The keys every architecture's GGUF has: block count, context, embedding and feed-forward lengths, heads."""
    writer.add_block_count(hp["n_layer"])
    writer.add_context_length(hp["n_ctx"])
    writer.add_embedding_length(hp["n_embd"])
    writer.add_feed_forward_length(hp["n_ff"])
    writer.add_head_count(hp["n_head"])
    writer.add_head_count_kv(hp["n_head_kv"])


def _gemma2(writer, hp: dict) -> None:
    """Gemma2Model.set_gguf_parameters (its own set: no RoPE keys)."""
    cfg = hp["config"]
    add_dimensions(writer, hp)
    writer.add_layer_norm_rms_eps(float(hp["eps"]))
    writer.add_key_length(hp["head_dim"])
    writer.add_value_length(hp["head_dim"])
    writer.add_attn_logit_softcapping(float(cfg["attn_logit_softcapping"]))
    writer.add_final_logit_softcapping(float(cfg["final_logit_softcapping"]))
    writer.add_sliding_window(int(cfg["sliding_window"]))


def _gemma3(writer, hp: dict) -> None:
    """Gemma3Model.set_gguf_parameters: TextModel's keys (RoPE of the full-attention layers, the sliding layers' base
    as rope.freq_base_swa) and the head size, final soft-capping and sliding window."""
    from .types import gguf_module

    cfg, rope = hp["config"], _full_rope(hp)
    add_dimensions(writer, hp)
    kind = rope.get("rope_type", "default")
    if kind == "linear" and rope.get("factor") is not None:
        writer.add_rope_scaling_type(gguf_module().RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    elif kind != "default":
        raise UserError(
            f"RoPE scaling '{kind}' of a gemma3 model is not supported by the GGUF exporter (supported: none, linear)"
        )
    writer.add_rope_freq_base(float(rope.get("rope_theta", 1_000_000.0)))
    local = (hp["rope"].get("sliding_attention") or {}).get("rope_theta")
    if local is not None:
        writer.add_rope_freq_base_swa(float(local))
    writer.add_layer_norm_rms_eps(float(hp["eps"]))
    writer.add_key_length(hp["head_dim"])
    writer.add_value_length(hp["head_dim"])
    if cfg.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(float(cfg["final_logit_softcapping"]))
    if cfg.get("sliding_window_pattern") != 1:
        writer.add_sliding_window(int(cfg["sliding_window"]))
