"""Mixes checked by vLLM's own config code (#96 item 3): for compressed-tensors and GPTQ `dynamic` exports of a mix
whose fused groups (models/fused.py) have one width each, and of one that splits a group, vLLM's loader code resolves
the scheme of every fused layer its Llama class will build (qkv_proj, gate_up_proj) and of each shard alone
(tests/integrations/vllm_config_child.py, a process of its own, as vLLM sets torch and logging up process-wide; no
weights are loaded, so a tiny random Llama serves). Tied: every fused layer gets its shards' one scheme. Split: the
fused layers whose shards differ are exactly the groups the export's readers line names, and vLLM gives such a layer
its first shard's scheme without comparing the others (what the readers line warns of)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from matgptq.cli import main
from matgptq.exporters.readers import ct_readers, gptq_readers
from matgptq.formats import read_checkpoint
from matgptq.models.fused import fused_groups, mixed_groups
from tests.conftest import quick_quantize

CHILD = Path(__file__).with_name("vllm_config_child.py")
FORMATS = ("compressed-tensors", "gptq_v2")

if importlib.util.find_spec("vllm") is None:  # a plain skip, as test_vllm.py's: the main venv never has vLLM
    pytest.skip(
        "vLLM is not installed in this venv: this file runs in `make vllm-test` (.venv-vllm)", allow_module_level=True
    )


@pytest.fixture(scope="module")
def resolved(tiny_llama_dir, tmp_path_factory):
    """(widths per mix, vLLM's resolution per export): the exports of two mixes in both formats, examined by the
    child in one process."""
    base = tmp_path_factory.mktemp("vllm-config")
    parent = quick_quantize(tiny_llama_dir, base / "parent", method="matgptq", bits="2,3,4,8", group_size=32)
    names = list(read_checkpoint(parent).layers)
    # 4 and 8 bits: the widths vLLM's GPTQ config takes (it refuses others outright, a different refusal)
    tied = {n: 8 for n in names if n.startswith("model.layers.0.self_attn.") and not n.endswith("o_proj")}
    tied |= {n: 8 for n in names if n.startswith("model.layers.1.mlp.") and not n.endswith("down_proj")}
    mixes = {
        "tied": dict.fromkeys(names, 4) | tied,
        "split": dict.fromkeys(names, 4) | {"model.layers.0.self_attn.k_proj": 8, "model.layers.1.mlp.up_proj": 8},
    }
    spec = {}
    for mix, widths in mixes.items():
        (base / f"{mix}.json").write_text(json.dumps(widths))
        for fmt in FORMATS:
            out = base / f"{fmt}-{mix}"
            assert (
                main(
                    [
                        "export",
                        str(parent),
                        "--format",
                        fmt,
                        "--bits-config",
                        str(base / f"{mix}.json"),
                        "--out",
                        str(out),
                    ]
                )
                == 0
            )
            spec[f"{fmt}-{mix}"] = str(out)
    return mixes, resolve(base, spec), spec


def resolve(base: Path, spec: dict[str, str]) -> dict:
    """What vLLM's config code resolves for each export of `spec` ({name: directory}), from the child in one process
    (shared by test_vllm_config_moe.py)."""
    (base / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    done = subprocess.run(
        [sys.executable, str(CHILD), str(base / "spec.json"), str(base / "out.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((base / "out.json").read_text())


def bits_of(resolution: str) -> int:
    assert resolution.endswith("sym") and "bits" in resolution, resolution
    return int(resolution.split()[0])


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_tied_mix_resolves_to_one_scheme_per_fused_layer(resolved, fmt):
    mixes, found, _ = resolved
    layers = found[f"{fmt}-tied"]
    assert len(layers) == 4  # qkv_proj and gate_up_proj of each of the 2 blocks
    for fused, got in layers.items():
        assert {got["fused"]} == set(got["shards"].values()), (fused, got)
        assert {bits_of(got["fused"])} == {mixes["tied"][s] for s in got["shards"]}


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_split_mix_is_named_as_vllm_sees_it(resolved, fmt):
    mixes, found, spec = resolved
    widths = mixes["split"]
    layers = found[f"{fmt}-split"]
    differ = set()
    for fused, got in layers.items():
        shards = list(got["shards"])
        if len({widths[s] for s in shards}) > 1:
            differ.add(tuple(shards))
            assert bits_of(got["fused"]) == widths[shards[0]]  # the first shard's scheme, the others not compared
        else:
            assert bits_of(got["fused"]) == widths[shards[0]]
    config = json.loads((Path(spec[f"{fmt}-split"]) / "config.json").read_text())
    ours = {tuple(m) for m in mixed_groups(fused_groups(config, widths), widths)}
    assert (
        differ
        == ours
        == {
            ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.v_proj"),
            ("model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj"),
        }
    )
    readers = (ct_readers if fmt == "compressed-tensors" else gptq_readers)(spec[f"{fmt}-split"]).line()
    assert (
        "vLLM 0.32 (it runs model.layers.0.self_attn.{q_proj: 4, k_proj: 8, v_proj: 4} as one layer (1 more such "
        "group), with its first shard's scheme" in readers.split(" · not in ")[1]
    )  # a tested outcome, not expected
