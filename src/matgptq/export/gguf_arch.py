"""Llama in GGUF (formats.md §5.3–5.4): the GGUF name of each HF tensor, convert_hf_to_gguf's tensor order, and
the RoPE row permutation of the Q/K projections. Another architecture's tables go here.
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import UserError

_BLOCK_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}  # fmt: skip
_TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}  # fmt: skip


def gguf_tensor_name(hf_name: str) -> str | None:
    """GGUF name of a Llama HF tensor (formats.md §5.3), or None if it has none."""
    if hf_name in _TOP_NAMES:
        return _TOP_NAMES[hf_name]
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", hf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"blk.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
    return None


_IN_BLOCK = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")


def _order(gguf_name: str) -> tuple:
    """convert_hf_to_gguf's tensor order: token_embd, blocks in order, output_norm, output."""
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    if m:
        return (1, int(m.group(1)), _IN_BLOCK.index(m.group(2)), m.group(3))
    return ({"token_embd.weight": 0, "output_norm.weight": 2, "output.weight": 3}.get(gguf_name, 4), gguf_name)


def llama_qk_permutation(rows: int, n_head: int) -> np.ndarray:
    """Row index P with gguf_row[i] = hf_row[P[i]] (convert_hf_to_gguf LlamaModel.permute, formats.md §5.4)."""
    if rows % (2 * n_head):
        raise UserError(f"cannot apply the Llama RoPE permutation: {rows} rows for {n_head} heads")
    return np.arange(rows).reshape(n_head, 2, rows // n_head // 2).swapaxes(1, 2).reshape(-1)
