"""The readers line `matgptq export` prints (exporters/readers.py), as a user sees it. Whether each claim is true is
asserted where the readers are run: tests/exporters/test_gptq_interop.py and test_compressed_tensors.py check the line
of every file they load against the outcome; here, that the command prints it and the rules pick the right case."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from matgptq.cli import main
from matgptq.formats import read_checkpoint
from tests.conftest import STORIES, quick_quantize


@pytest.fixture(scope="module")
def sources(tiny_llama_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("readers")
    return {
        "sym": quick_quantize(tiny_llama_dir, base / "sym", method="matgptq", bits="2,3,4,8", group_size=32),
        "asym": quick_quantize(tiny_llama_dir, base / "asym", bits=4, sym=False, group_size=32),
    }


def export(capsys, src, out, *args) -> str:
    assert main(["export", str(src), "--out", str(out), *args]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"wrote {out}"), lines
    return lines[1]


def test_gptq_lines(sources, tmp_path, capsys):
    four = export(capsys, sources["sym"], tmp_path / "g4", "--format", "gptq_v1", "--bits", "4")
    assert four == (
        "readers: runs in matgptq.load; GPTQModel 7.6 (torch kernel); transformers + optimum; vLLM 0.32 on "
        "CPU · not tested here: vLLM (expected: Marlin, on GPU)"
    )
    three = export(capsys, sources["sym"], tmp_path / "g3", "--format", "gptq_v2", "--bits", "3")
    assert "transformers + optimum ·" in three and "vLLM (expected to refuse it on GPU" in three
    assert ' · not in vLLM 0.32 on CPU (tested: "Unsupported quantization config: bits=3, sym=True") · ' in three
    asym = export(capsys, sources["asym"], tmp_path / "ga", "--format", "gptq_v2")
    assert 'not in vLLM 0.32 on CPU (tested: "Unsupported quantization config: bits=4, sym=False")' in asym
    names = list(read_checkpoint(sources["sym"]).layers)
    (tmp_path / "mix.json").write_text('{"*": 4, "%s": 2}' % names[0])
    mix = export(
        capsys, sources["sym"], tmp_path / "gm", "--format", "gptq_v2", "--bits-config", str(tmp_path / "mix.json")
    )
    assert "not in transformers + optimum (it ignores `dynamic` and would run every layer at 4 bits)" in mix


def test_compressed_tensors_lines(sources, tmp_path, capsys):
    sym = export(capsys, sources["sym"], tmp_path / "c3", "--format", "compressed-tensors", "--bits", "3")
    assert sym == (
        "readers: runs in matgptq.load; compressed-tensors 0.19; transformers 5.17; transformers 5.23 · not "
        'in vLLM 0.32 on CPU (tested: its CPU kernel takes 4-bit weights only, "Quant type (uint3b4) not '
        'supported by CPUWNA16") · not tested here: vLLM (expected on GPU: compressed-tensors weight-only, '
        "Humming kernels at 2/3/5/6/7 bits, Marlin at 4/8)"
    )
    asym = export(capsys, sources["asym"], tmp_path / "ca", "--format", "compressed-tensors")
    assert "transformers 5.23 with CompressedTensorsConfig(dequantize=True); vLLM 0.32 on CPU ·" in asym
    assert "not in transformers 5.23's default from_pretrained (asymmetric zero points)" in asym
    assert "vLLM (unknown on GPU" in asym


def test_vllm_cpu_needs_multiples_of_32(tmp_path, capsys):
    """An MLP of 172 rows: vLLM's CPU kernel refuses it in both formats (tests/integrations/test_vllm.py tries it)."""
    from tests.conftest import make_tiny_llama

    src = quick_quantize(make_tiny_llama(tmp_path / "m", intermediate=172), tmp_path / "q", bits=4, group_size=-1)
    for fmt in ("gptq_v1", "compressed-tensors"):
        line = export(capsys, src, tmp_path / fmt, "--format", fmt)
        assert (
            "vLLM 0.32 on CPU (tested: its CPU kernel needs out and in features that are multiples of 32, "
            "model.layers.0.mlp.down_proj is 64×172"
        ) in line.split(" · not in ")[1], line


@pytest.mark.parametrize("fmt", ["gptq_v2", "compressed-tensors"])
def test_a_mix_that_splits_a_fused_layer_names_what_vllm_does_with_it(fmt, sources, tmp_path, capsys):
    """q/k/v and gate/up run as one layer in vLLM (models/fused.py): a mix giving k_proj its own width, or leaving
    up_proj unquantized, is named; the same widths on whole groups are not."""
    names = list(read_checkpoint(sources["sym"]).layers)
    k = next(n for n in names if n.endswith("self_attn.k_proj"))
    block = k.removesuffix(".k_proj")
    mixes = {"split": {"*": 4, k: 3}, "whole": {"*": 4, **{f"{block}.{x}_proj": 3 for x in "qkv"}}}
    lines = {}
    for name, mix in mixes.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(mix))
        lines[name] = export(
            capsys, sources["sym"], tmp_path / name, "--format", fmt, "--bits-config", str(tmp_path / f"{name}.json")
        )
    named = (
        f"vLLM 0.32 (it runs {block}.{{q_proj: 4, k_proj: 3, v_proj: 4}} as one layer, with its first shard's scheme"
    )
    assert named in lines["split"].split(" · not in ")[1]  # among the readers it does not run in
    assert "first shard's scheme" not in lines["whole"]


def test_gguf_line(sources, tmp_path, capsys):
    pytest.importorskip("gguf")
    assert (
        main(["export", str(sources["sym"]), "--format", "gguf", "--bits", "4", "--out", str(tmp_path / "m.gguf")]) == 0
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2].startswith(f"wrote {tmp_path / 'm.gguf'}")
    assert lines[-1] == (
        "readers: runs in llama.cpp (llama-cpp-python 0.3.36); transformers' GGUF reader (dequantized to float)"
    )


def tiny_moe(path: Path, model_type: str = "qwen3_moe", hidden: int = 128) -> Path:
    """A random `model_type` (tests/models/test_moe.py's: 4 experts, 2 blocks) of hidden size `hidden`: 128 is the
    smallest that vLLM's GPTQ Marlin MoE path takes, the one that reads `dynamic` rules (readers._vllm_moe_bits)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.models.test_arch import SIZES
    from tests.models.test_moe import MOE

    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **(SIZES | MOE[model_type] | {"hidden_size": hidden}))
    AutoModelForCausalLM.from_config(config).save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(STORIES / name, path / name)
    return path


def per_expert(gptq: Path, out: Path, block: int) -> Path:
    """A copy of the GPTQ export `gptq` whose `dynamic` rule for block `block`'s experts (formats/gptq/writer.py: one
    rule matching `…mlp.experts`, the name of vLLM's fused MoE layer, and each expert's layers) is replaced by one rule
    per expert layer, which vLLM never matches against that fused name (tests/integrations/test_vllm_config_moe.py)."""
    shutil.copytree(gptq, out)
    config = json.loads((out / "config.json").read_text())
    prefix = f"+:^{re.escape(f'model.layers.{block}.mlp.experts')}("
    dynamic = config["quantization_config"]["dynamic"]
    ((rule, bits),) = [(p, v) for p, v in dynamic.items() if p.startswith(prefix)]
    names = [n for n in config_layers(out) if n.startswith(f"model.layers.{block}.mlp.experts.")]
    dynamic = {p: v for p, v in dynamic.items() if p != rule} | {f"+:^{re.escape(n)}$": bits for n in names}
    config["quantization_config"]["dynamic"] = dynamic
    (out / "config.json").write_text(json.dumps(config))
    return out


def config_layers(gptq: Path) -> list[str]:
    """The layers of a GPTQ export (those with a `.qweight`)."""
    from safetensors import safe_open

    with safe_open(gptq / "model.safetensors", "pt") as f:
        return [k.removesuffix(".qweight") for k in f.keys() if k.endswith(".qweight")]


def test_moe_mixes_name_the_fused_moe_layer_vllm_builds(tmp_path, capsys):
    """A block's experts are one fused layer in vLLM (`model.layers.1.mlp.experts`): compressed-tensors gives it
    expert 0's scheme, GPTQ the `dynamic` rule matching that name or the file's `bits`. Whether vLLM's config code
    does so: tests/integrations/test_vllm_config_moe.py."""
    parent = quick_quantize(tiny_moe(tmp_path / "fp"), tmp_path / "q", method="matgptq", bits="4,8", group_size=32)
    names = list(read_checkpoint(parent).layers)
    block1 = "model.layers.1.mlp.experts"
    mixes = {
        "tied": dict.fromkeys(names, 4) | {n: 8 for n in names if n.startswith(block1)},
        "split": dict.fromkeys(names, 4) | {f"{block1}.2.gate_up_proj": 8},
        "all": dict.fromkeys(names, 4),
    }
    lines = {}
    for mix, widths in mixes.items():
        (tmp_path / f"{mix}.json").write_text(json.dumps(widths))
        for fmt in ("compressed-tensors", "gptq_v2"):
            lines[fmt, mix] = export(
                capsys,
                parent,
                tmp_path / f"{fmt}-{mix}",
                "--format",
                fmt,
                "--bits-config",
                str(tmp_path / f"{mix}.json"),
            )
    assert lines["compressed-tensors", "all"] == (  # one symmetric config group; matgptq.load reads no MoE CT file
        "readers: runs in compressed-tensors 0.19; transformers 5.17; transformers 5.23 · not tested here: vLLM "
        "(expected where it serves llm-compressor's own MoE files: the same layout)"
    )
    assert "vLLM 0.32 (it runs" not in lines["compressed-tensors", "tied"]
    assert (
        f"vLLM 0.32 (it runs {block1}.{{2.gate_proj: 8, 2.up_proj: 8, … 10 more: 4}} as one layer, with "
        "expert 0's scheme"
    ) in lines["compressed-tensors", "split"].split(" · not in ")[1]
    assert (
        "vLLM 0.32 (it runs" not in lines["gptq_v2", "tied"]
        and "vLLM (per-expert MoE layers)" in lines["gptq_v2", "tied"]
    )  # its one rule for block 1's experts matches the fused layer's name
    assert (
        f"vLLM 0.32 (it runs {block1}.{{2.gate_proj: 8, 2.up_proj: 8, … 10 more: 4}} as one layer at 4 bits"
        in lines["gptq_v2", "split"]
    )
    from matgptq.exporters.readers import gptq_readers

    rules = gptq_readers(per_expert(tmp_path / "gptq_v2-tied", tmp_path / "per-expert", 1)).line()
    assert (
        f"vLLM 0.32 (it runs {block1}.{{all 12: 8}} as one layer at 4 bits, from the `dynamic` rule matching that "
        "name itself"
    ) in rules.split(" · not in ")[1]
