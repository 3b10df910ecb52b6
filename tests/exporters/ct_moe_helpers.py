"""Helpers of test_compressed_tensors_moe.py: tiny qwen3_moe / mixtral / gpt_oss sources (gptq_moe_helpers.moe_model:
random biases, experts 10× the init's scale) quantized without act-order (compressed-tensors 0.19 has no g_idx), each
expert's weight as transformers' fused forward uses it, and llm-compressor 0.14's own export of the same models (run
in .venv-bench, which has it: transformers <= 5.17) with its layout recorded for machines without that venv."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

from tests.exporters.gptq_moe_helpers import MoECache

ROOT = Path(__file__).resolve().parents[2]
BENCH_PYTHON = ROOT / ".venv-bench" / "bin" / "python"
TYPES = ("qwen3_moe", "mixtral", "gpt_oss")
GROUP = 32
SOURCES = {  # name: quantize options (all group 32, static column order)
    "sym": dict(method="matgptq", bits=(2, 4, 8)),  # symmetric MatGPTQ parent: its 4- and 2-bit slices exported
    "asym": dict(method="gptq", bits=4, sym=False),  # asymmetric: zero points written
    "skip": dict(method="gptq", bits=4, skip=("experts\\.[13]\\.down_proj$",)),  # 2 experts' down_proj left float
}

# The file's name of an expert Linear and the model's fused parameter it comes from (transformers 5 modeling code):
# qwen3_moe / mixtral `gate, up = linear(x, gate_up_proj[e]).chunk(2, dim=-1)` → gate = rows [0, I), up = [I, 2I);
# gpt_oss `gate_up = x @ gate_up_proj[e]` ([H, 2I]), `gate, up = gate_up[..., ::2], gate_up[..., 1::2]` → gate = its
# even columns, up = its odd ones, transposed to [I, H]. mixtral's files call the block `block_sparse_moe`.
_EXPERT = re.compile(r"^(.+)\.(mlp|block_sparse_moe)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)$")


def fused_view(model, module: str, model_type: str, what: str = "weight") -> torch.Tensor:
    """The [out, in] weight (or [out] bias) of per-expert file module `module` as a view into `model`'s fused
    experts parameter, so it can be compared or written in place; a plain module's own weight/bias otherwise."""
    m = _EXPERT.match(module)
    if m is None:
        return getattr(model.get_submodule(module.replace(".block_sparse_moe.", ".mlp.")), what).data
    experts, e, proj = model.get_submodule(f"{m.group(1)}.mlp.experts"), int(m.group(3)), m.group(4)
    fused = "down_proj" if proj == "down_proj" else "gate_up_proj"
    p = getattr(experts, fused if what == "weight" else f"{fused}_bias").data[e]
    if what == "weight" and model_type == "gpt_oss":
        p = p.T  # stored [in, out]
    if proj == "down_proj":
        return p
    half = p.shape[0] // 2
    if model_type == "gpt_oss":
        return p[0::2] if proj == "gate_proj" else p[1::2]
    return p[:half] if proj == "gate_proj" else p[half:]


class CtMoECache(MoECache):
    """Per model type the float model (gptq_moe_helpers.MoECache), per SOURCES entry its quantized checkpoint, and
    per (type, source, bits) our compressed-tensors export, each built on first use."""

    def source(self, model_type: str, kind: str) -> Path:
        import matgptq
        from tests.exporters.gptq_moe_helpers import CALIB

        return self._get(
            ("src", model_type, kind),
            lambda: matgptq.quantize(
                self.model(model_type),
                self.base / f"{kind}-{model_type}",
                calib=CALIB,
                nsamples=4,
                seqlen=64,
                progress=False,
                group_size=GROUP,
                **SOURCES[kind],
            )[0],
        )

    def export(self, model_type: str, kind: str, bits) -> Path:
        from matgptq.exporters.compressed_tensors import export_compressed_tensors

        name = f"ct-{kind}-{model_type}-{bits if isinstance(bits, int) else 'mix'}"
        return self._get(
            ("ct", model_type, kind, str(bits)),
            lambda: export_compressed_tensors(
                self.source(model_type, kind),
                self.base / name,
                bits=bits if isinstance(bits, int) else None,
                bits_config=None if isinstance(bits, int) else bits,
            ),
        )


def header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{key: (dtype, shape)} of a directory's model.safetensors."""
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {k: (str(f.get_slice(k).get_dtype()), tuple(f.get_slice(k).get_shape())) for k in f.keys()}


def layout(keys) -> list[str]:
    """The layer-independent layout of a checkpoint's keys: each key with its layer and expert numbers replaced by
    L and E (sorted, without repeats)."""
    return sorted(
        {
            re.sub(r"\.experts\.\d+\.", ".experts.E.", re.sub(r"^model\.layers\.\d+\.", "model.layers.L.", k))
            for k in keys
        }
    )


# llm-compressor 0.14.0.1's export of these models (transformers 5.17, QuantizationModifier W4A16 symmetric, group
# 32, targets ["Linear"], ignore ["lm_head", "re:.*mlp.gate$", "re:.*mlp.router$"]): `layout` of its keys, and its
# `ignore`, as recorded on 2026-11-27 by test_llm_compressor_writes_the_same_layout, which compares them with a live
# run wherever .venv-bench exists (`make bench-venv`). Shapes and dtypes: that live test.
_PACKED = ("weight_packed", "weight_scale", "weight_shape")
_ATTN = [f"model.layers.L.self_attn.{p}.{t}" for p in ("k_proj", "o_proj", "q_proj", "v_proj") for t in _PACKED]
_EXPERTS = [f"model.layers.L.{{b}}.experts.E.{p}.{t}" for p in ("down_proj", "gate_proj", "up_proj") for t in _PACKED]
_BASE = [
    "lm_head.weight",
    "model.embed_tokens.weight",
    "model.norm.weight",
    "model.layers.L.input_layernorm.weight",
    "model.layers.L.post_attention_layernorm.weight",
]
LLMC_LAYOUT = {
    "qwen3_moe": sorted(
        _BASE
        + _ATTN
        + [k.format(b="mlp") for k in _EXPERTS]
        + [
            "model.layers.L.mlp.gate.weight",
            "model.layers.L.self_attn.k_norm.weight",
            "model.layers.L.self_attn.q_norm.weight",
        ]
    ),
    "mixtral": sorted(
        _BASE
        + _ATTN
        + [k.format(b="block_sparse_moe") for k in _EXPERTS]
        + ["model.layers.L.block_sparse_moe.gate.weight"]
    ),
    "gpt_oss": sorted(
        _BASE
        + _ATTN
        + [k.format(b="mlp") for k in _EXPERTS]
        + [f"model.layers.L.mlp.experts.E.{p}.bias" for p in ("down_proj", "gate_proj", "up_proj")]
        + [f"model.layers.L.self_attn.{p}.bias" for p in ("k_proj", "o_proj", "q_proj", "v_proj")]
        + ["model.layers.L.mlp.router.bias", "model.layers.L.mlp.router.weight", "model.layers.L.self_attn.sinks"]
    ),
}
LLMC_IGNORE = {
    t: [f"model.layers.{i}.{r}" for i in range(2)] + ["lm_head"]
    for t, r in (("qwen3_moe", "mlp.gate"), ("mixtral", "block_sparse_moe.gate"), ("gpt_oss", "mlp.router"))
}


def llmcompressor_exports(models: dict[str, Path], workdir: Path) -> dict[str, Path]:
    """{model type: llm-compressor's export directory} of the float `models`, made in a .venv-bench child."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TORCHDYNAMO_DISABLE="1")
    args = [str(BENCH_PYTHON), "-m", "tests.exporters.ct_moe_helpers", str(workdir)]
    done = subprocess.run(
        args + [f"{t}={p}" for t, p in models.items()], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return {t: workdir / t for t in models}


def _llmcompressor_child(workdir: Path, jobs: list[str]) -> None:
    """llm-compressor 0.14, data-free RTN (QuantizationModifier), W4A16 symmetric group 32 on every Linear of its
    linearized experts; the routers (not Linears in transformers 5) ignored as its MoE examples ignore them."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    for job in jobs:
        model_type, path = job.split("=", 1)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        weights = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=GROUP)
        scheme = QuantizationScheme(targets=["Linear"], weights=weights)
        recipe = QuantizationModifier(
            config_groups={"group_0": scheme}, ignore=["lm_head", "re:.*mlp.gate$", "re:.*mlp.router$"]
        )
        oneshot(model=model, recipe=recipe)
        model.save_pretrained(workdir / model_type, save_compressed=True)


if __name__ == "__main__":
    _llmcompressor_child(Path(sys.argv[1]), sys.argv[2:])
