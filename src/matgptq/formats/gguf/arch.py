"""The architectures llama.cpp runs, in GGUF (docs/formats.md §3.2–3.3): per HF `model_type`, llama.cpp's architecture
name, the GGUF name of each HF tensor, convert_hf_to_gguf's tensor order, and whether Q/K rows get Llama's RoPE
permutation. Checked against llama.cpp's own converter (tests/exporters/test_gguf_arch.py).

- llama, mistral → `llama` (convert_hf_to_gguf maps MistralForCausalLM to LlamaModel): interleaved RoPE, so the Q/K
  rows are permuted (LlamaModel.permute).
- qwen2 → `qwen2` (q/k/v biases), qwen3 → `qwen3` (RMSNorm of q and k per head: attn_q_norm / attn_k_norm),
  phi3 → `phi3` (fused attn_qkv, fused gate|up as ffn_up, gate first as in HF's `chunk(2)`): NEOX RoPE (rotate
  halves), which needs no permutation.
- olmo2 → `olmo2` (Olmo2Model): norms after attention and MLP (post_attention_norm / post_ffw_norm, no input norm),
  q/k RMSNorm over all heads (attn_q_norm / attn_k_norm); NEOX RoPE, no permutation.
- granite → `granite` (GraniteModel, a LlamaModel): Llama's tensors and Q/K permutation; its multipliers are metadata.
- gemma2 → `gemma2`, gemma3_text → `gemma3` (Gemma2Model / Gemma3Model): four norms per block, each stored as 1 + w
  (Gemma's RMSNorm multiplies by 1 + w; `norm_shift`), Gemma 3's q/k norms too; gemma2's lm_head is dropped (tied).
- qwen3_moe → `qwen3moe` (Qwen3MoeModel), mixtral → `llama` with experts (convert_hf_to_gguf maps MixtralForCausalLM
  to LlamaModel: Q/K permuted): the router `mlp.gate` is `ffn_gate_inp` (always F32, as the converter keeps it), the
  fused experts are 3-D `ffn_{gate,up,down}_exps` (experts.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ...errors import UserError

_LLAMA_BLOCK = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
_TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


@dataclass(frozen=True)
class GGUFArch:
    name: str  # general.architecture, and the prefix of the model's metadata keys
    permute_qk: bool  # Llama's interleaved RoPE: Q/K rows permuted (docs/formats.md §3.3)
    block_names: dict[str, str] = field(default_factory=lambda: dict(_LLAMA_BLOCK))
    act: str = "silu"  # the MLP activation llama.cpp's graph uses (HF hidden_act / hidden_activation)
    norm_shift: float = 0.0  # added to every norm weight by the converter (Gemma: 1 + w)
    drop: tuple[str, ...] = ()  # HF tensors the converter leaves out

    def stored_norm(self, gguf_name: str, w: np.ndarray) -> np.ndarray:
        """A 1-D tensor as the converter stores it (Gemma's norms: 1 + w, added in float32 as it does)."""
        if self.norm_shift and gguf_name.endswith("norm.weight"):
            return (w.astype(np.float32) + np.float32(self.norm_shift)).astype(np.float32)
        return w

    def tensor_name(self, hf_name: str) -> str | None:
        """GGUF name of an HF tensor, or None if it has none."""
        if hf_name in _TOP_NAMES:
            return _TOP_NAMES[hf_name]
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", hf_name)
        if m and m.group(2) in self.block_names:
            return f"blk.{m.group(1)}.{self.block_names[m.group(2)]}.{m.group(3)}"
        return None

    def hf_name(self, gguf_name: str) -> str:
        """The inverse of tensor_name."""
        m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
        if m:
            inv = {v: k for k, v in self.block_names.items()}
            return f"model.layers.{m.group(1)}.{inv[m.group(2)]}.{m.group(3)}"
        return {v: k for k, v in _TOP_NAMES.items()}.get(gguf_name, gguf_name)


_PROJ = {k: v for k, v in _LLAMA_BLOCK.items() if "layernorm" not in k}
_ATTN = {k: v for k, v in _PROJ.items() if k.startswith("self_attn.")}
_NORMS = {k: v for k, v in _LLAMA_BLOCK.items() if "layernorm" in k}
_ROUTER = {"mlp.gate": "ffn_gate_inp"}  # a mixture-of-experts block's router; its experts: experts.py
_QK_NORM = {"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
_GEMMA_BLOCK = {
    **_PROJ,
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}

ARCHITECTURES = {
    "llama": GGUFArch("llama", True),
    "mistral": GGUFArch("llama", True),
    "qwen2": GGUFArch("qwen2", False),
    "qwen3": GGUFArch(
        "qwen3", False, {**_LLAMA_BLOCK, "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
    ),
    "phi3": GGUFArch(
        "phi3",
        False,
        {
            "self_attn.qkv_proj": "attn_qkv",
            "self_attn.o_proj": "attn_output",
            "mlp.gate_up_proj": "ffn_up",
            "mlp.down_proj": "ffn_down",
            "input_layernorm": "attn_norm",
            "post_attention_layernorm": "ffn_norm",
        },
    ),
    "olmo2": GGUFArch(
        "olmo2",
        False,
        {
            **_PROJ,
            **_QK_NORM,
            "post_attention_layernorm": "post_attention_norm",
            "post_feedforward_layernorm": "post_ffw_norm",
        },
    ),
    "granite": GGUFArch("granite", True),
    "gemma2": GGUFArch("gemma2", False, _GEMMA_BLOCK, "gelu_pytorch_tanh", 1.0, ("lm_head.weight",)),
    "gemma3_text": GGUFArch("gemma3", False, {**_GEMMA_BLOCK, **_QK_NORM}, "gelu_pytorch_tanh", 1.0),
    "qwen3_moe": GGUFArch("qwen3moe", False, {**_NORMS, **_ATTN, **_QK_NORM, **_ROUTER}),
    "mixtral": GGUFArch("llama", True, {**_NORMS, **_ATTN, **_ROUTER}),
}


def gguf_arch(model_type: str | None) -> GGUFArch:
    """The architecture of HF `model_type`, or a UserError naming those mapped (exporters/gguf/export.py refuses some
    types with their own reason first)."""
    if model_type not in ARCHITECTURES:
        raise UserError(
            f"GGUF export supports the model types {', '.join(ARCHITECTURES)}; this model is "
            f"'{model_type}' (its llama.cpp tensor names and metadata are not mapped yet)"
        )
    return ARCHITECTURES[model_type]


def gguf_tensor_name(hf_name: str, arch: GGUFArch = ARCHITECTURES["llama"]) -> str | None:
    return arch.tensor_name(hf_name)


_IN_BLOCK = (
    "attn_norm",
    "attn_q",
    "attn_q_norm",
    "attn_k",
    "attn_k_norm",
    "attn_v",
    "attn_qkv",
    "attn_output",
    "post_attention_norm",
    "ffn_norm",
    "ffn_gate_inp",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
    "ffn_gate_exps",
    "ffn_up_exps",
    "ffn_down_exps",
    "post_ffw_norm",
)


def tensor_order(gguf_name: str) -> tuple:
    """convert_hf_to_gguf's tensor order: token_embd, blocks in order, output_norm, output."""
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    if m:
        return (1, int(m.group(1)), _IN_BLOCK.index(m.group(2)), m.group(3))
    return ({"token_embd.weight": 0, "output_norm.weight": 2, "output.weight": 3}.get(gguf_name, 4), gguf_name)


def llama_qk_permutation(rows: int, n_head: int) -> np.ndarray:
    """Row index P with gguf_row[i] = hf_row[P[i]] (convert_hf_to_gguf LlamaModel.permute, docs/formats.md §3.3)."""
    if rows % (2 * n_head):
        raise UserError(f"cannot apply the Llama RoPE permutation: {rows} rows for {n_head} heads")
    return np.arange(rows).reshape(n_head, 2, rows // n_head // 2).swapaxes(1, 2).reshape(-1)
