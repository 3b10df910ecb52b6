"""Build a random-initialised Llama of a real configuration's shape on disk (bf16 safetensors shards), for the
GPU check (Llama-3.1-8B's shape: benchmarks/gpu/_quantize.py; issue #13's Llama-3.2-1B shape too).

Written block by block, one shard per decoder block plus one for the embeddings, final norm and (untied) lm_head,
with Hugging Face's model.safetensors.index.json, so building an 8B model needs one block's memory, not 16 GB.
Weights ~ N(0, initializer_range²) as transformers initialises Llama (norms 1); values are irrelevant to speed and
memory, and GPTQ sees a well-conditioned Hessian. The tokenizer is SmolLM2's (49,152 ids, all below the vocabulary
size), copied from ~/.cache/matgptq/SmolLM2-135M-Instruct or `tokenizer` (a directory with its tokenizer files: a
GPU machine without that cache gets them carried, benchmarks/gpu/_quantize.py). Outside the repository: by default
under ~/.cache/matgptq/. `llama-tiny` is no published shape: a small Llama for a CPU dry run of the GPU benchmarks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

CACHE = Path.home() / ".cache" / "matgptq"
TOKENIZER = CACHE / "SmolLM2-135M-Instruct"
SHAPES = {  # the published configs' shapes (meta-llama/Llama-3.2-1B, meta-llama/Llama-3.1-8B config.json)
    "llama-3.2-1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        tie_word_embeddings=True,
        rope_theta=500000.0,
        max_position_embeddings=131072,
    ),
    "llama-3.1-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        tie_word_embeddings=False,
        rope_theta=500000.0,
        max_position_embeddings=131072,
    ),
    "llama-tiny": dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=49152,
        tie_word_embeddings=False,
        rope_theta=500000.0,
        max_position_embeddings=2048,
    ),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def build(
    name: str,
    out: Path | None = None,
    layers: int | None = None,
    seed: int = 0,
    tokenizer: Path | None = None,
    device: str = "cpu",
) -> Path:
    """The model directory (built once; an existing complete one is reused); its tokenizer files come from
    `tokenizer` (default: SmolLM2's in ~/.cache/matgptq). `device`: where the random numbers are drawn ("cuda": in
    seconds instead of a minute for an 8B shape; other values than the CPU's for the same seed)."""
    shape = dict(SHAPES[name], **({"num_hidden_layers": layers} if layers else {}))
    out = out or CACHE / f"random-{name}{f'-{layers}l' if layers else ''}"
    if (out / "model.safetensors.index.json").is_file():
        return out
    from transformers import LlamaConfig

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    gen = torch.Generator(device=device).manual_seed(seed)
    h, f, v, d = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"], shape["head_dim"]
    q, kv = shape["num_attention_heads"] * d, shape["num_key_value_heads"] * d

    def normal(*size):
        return (torch.randn(*size, generator=gen, device=device) * 0.02).to(torch.bfloat16).cpu()

    n = shape["num_hidden_layers"]
    files = [f"model-{k + 1:05d}-of-{n + 1:05d}.safetensors" for k in range(n + 1)]
    weight_map, total = {}, 0
    outside = {"model.embed_tokens.weight": normal(v, h), "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    if not shape["tie_word_embeddings"]:
        outside["lm_head.weight"] = normal(v, h)
    for k in tqdm(range(n + 1), desc=f"build {name}", unit="shard"):
        if k == 0:
            tensors = outside
        else:
            p = f"model.layers.{k - 1}."
            tensors = {
                p + "self_attn.q_proj.weight": normal(q, h),
                p + "self_attn.k_proj.weight": normal(kv, h),
                p + "self_attn.v_proj.weight": normal(kv, h),
                p + "self_attn.o_proj.weight": normal(h, q),
                p + "mlp.gate_proj.weight": normal(f, h),
                p + "mlp.up_proj.weight": normal(f, h),
                p + "mlp.down_proj.weight": normal(h, f),
                p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
                p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            }
        save_file(tensors, str(tmp / files[k]), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, files[k]))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = LlamaConfig(
        **{k: val for k, val in shape.items() if k != "rope_theta"},
        dtype="bfloat16",
        rope_parameters={"rope_type": "default", "rope_theta": shape["rope_theta"]},
        bos_token_id=1,
        eos_token_id=2,
    )
    config.save_pretrained(tmp)
    for file in TOKENIZER_FILES:
        if (Path(tokenizer or TOKENIZER) / file).is_file():
            shutil.copy2(Path(tokenizer or TOKENIZER) / file, tmp / file)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def weight_bytes(model_dir: Path) -> int:
    return json.loads((model_dir / "model.safetensors.index.json").read_text())["metadata"]["total_size"]
