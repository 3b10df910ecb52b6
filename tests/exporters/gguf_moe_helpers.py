"""Helpers of the MoE GGUF tests (test_gguf_moe.py): tiny random qwen3_moe / mixtral models, matgptq's dequantized
model saved as a plain HF directory (what llama.cpp's converter reads), and llama.cpp's Q8_0 activation quantization
emulated in the fused experts' forward."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from torch.nn import functional as F

from tests.conftest import STORIES
from tests.exporters.test_gguf_interop import ACTIVATION

# 4 experts, top 2; qwen3_moe with norm_topk_prob (llama.cpp's qwen3moe renormalises the top-k weights, as real
# Qwen3-MoE configs do); mixtral's expert FFN is intermediate_size (128), qwen3_moe's moe_intermediate_size (32)
COMMON = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    tie_word_embeddings=False,
    num_experts_per_tok=2,
)
MOE = {
    "qwen3_moe": dict(num_experts=4, moe_intermediate_size=32, head_dim=16, norm_topk_prob=True),
    "mixtral": dict(num_local_experts=4),
}


def make_moe(kind: str, path: Path, **overrides) -> Path:
    """A tiny random `kind`: weights as test_gguf_arch.py's (2-D ×5, norms 1 + 0.3·N(0, 1)), the fused experts ×10
    (gptq_moe_helpers: out of SiLU's near-linear range, so swapped gate and up rows would show), the router ×20 so
    that its top-2 choice is clear (no near-ties that float summation order could flip between llama.cpp and torch)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **{**COMMON, **MOE[kind], **overrides}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 3:
                p.mul_(10)
            elif name.endswith("mlp.gate.weight"):
                p.mul_(20)
            elif p.dim() == 2:
                p.mul_(5)
            else:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(STORIES / name, path / name)
    return path


def save_dequantized(parent: Path, bits: int, path: Path) -> Path:
    """matgptq.load's float32 model of `parent` at `bits`, saved by transformers as an unquantized HF directory."""
    from transformers import AutoConfig, AutoModelForCausalLM

    import matgptq

    loaded = matgptq.load(parent, bits=bits, dtype=torch.float32)
    config = AutoConfig.from_pretrained(parent)
    config.quantization_config = None
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(STORIES / name, path / name)
    return path


def _routed(args, named):
    given = (*args, *named.values())  # (top-k expert indices, their weights), by position or by name
    return next(t for t in given if not t.is_floating_point()), next(t for t in given if t.is_floating_point())


def emulate_q8_0(model) -> None:
    """llama.cpp's CPU matmuls of a file whose block weights are all Q4_0 (test_gguf_interop.py): the input of every
    quantized matmul rounded to Q8_0 blocks. Attention Linears get a pre-hook; the experts (ggml_mul_mat_id) quantize
    the hidden states before gate/up and act(gate)·up before down. The router (ffn_gate_inp) and lm_head are F32 in
    the file: untouched."""
    q8 = ACTIVATION["Q4_0"]
    for block in model.model.layers:
        for mod in block.self_attn.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.register_forward_pre_hook(lambda mod, args: (q8(args[0]),))
        experts = block.mlp.experts

        def forward(hidden_states, *args, experts=experts, **named):
            index, weights = _routed(args, named)
            out, x = torch.zeros_like(hidden_states), q8(hidden_states)
            for e in range(experts.num_experts):
                tokens, slots = torch.where(index == e)
                if tokens.numel():
                    gate, up = F.linear(x[tokens], experts.gate_up_proj[e]).chunk(2, dim=-1)
                    y = F.linear(q8(experts.act_fn(gate) * up), experts.down_proj[e])
                    out.index_add_(0, tokens, y * weights[tokens, slots, None])
            return out

        experts.forward = forward
