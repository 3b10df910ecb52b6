"""vLLM serves a MatGPTQ parent itself, at any width or mix, through matgptq's vLLM plugin (integrations/vllm.py,
issue #96 item 4): `make vllm-test`.

It runs in .venv-vllm (`make vllm`: matgptq installed there, so vLLM finds the `vllm.general_plugins` entry point),
skips in the main venv and without the real model (`make real-model`), as test_vllm.py does. conftest.py's session
fixture quantizes SmolLM2-135M with the product's CLI into a parent (R = {3, 4, 8}, g64); one module fixture serves
it in one vLLM process (vllm_plugin_child.py) with `LLM(PARENT, quantization="matgptq")`: as stored (8 bits), at 3
and 4 bits, a tied mix from a file (q/k/v at one width and gate/up at one width in each block) and an untied mix (q,
k and v, gate and up each at its own width: the plugin dequantizes each shard of a fused layer at its own width),
each asked for through hf_overrides' quantization_config. What vLLM computes is checked against `matgptq.load(PARENT,
bits=...)` in float32 with test_vllm.py's check and its tolerance derived from bfloat16 arithmetic (`compare`,
`failures`); the 3-bit serving checked against the 4-bit reference must fail it. Widths the parent cannot serve are
one clear error. The child is a fresh interpreter, where vLLM's plugin loading must register the method from the
entry point; a second child serves 4 bits with vLLM's engine core and worker in spawned processes of their own
(vLLM's default layout), which receive the quantization config pickled.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REAL_MODEL

if importlib.util.find_spec("vllm") is None:  # as test_vllm.py: CI's main venv never has vLLM
    pytest.skip(
        "vLLM is not installed in this venv: this file runs in `make vllm-test` (.venv-vllm)", allow_module_level=True
    )
if not (REAL_MODEL / "model.safetensors").is_file():
    pytest.skip(f"{REAL_MODEL} not made (make real-model)", allow_module_level=True)

from tests.integrations.test_vllm import GREEDY_TOKENS, _windows, compare, failures  # noqa: E402

CHILD = Path(__file__).with_name("vllm_plugin_child.py")
LAYERS = 30  # SmolLM2-135M's blocks
ATTENTION, MLP = ("q_proj", "k_proj", "v_proj", "o_proj"), ("gate_proj", "up_proj", "down_proj")


def block(i: int, widths: dict[str, int]) -> dict[str, int]:
    parts = {**{p: "self_attn" for p in ATTENTION}, **{p: "mlp" for p in MLP}}
    return {f"model.layers.{i}.{parts[p]}.{p}": r for p, r in widths.items()}


# attention at 3 bits and MLP at 4, blocks 0 and 15 at 8: q/k/v and gate/up, each one vLLM layer, share a width
TIED = {
    "*": 4,
    **{k: v for i in range(LAYERS) for k, v in block(i, dict.fromkeys(ATTENTION, 3)).items()},
    **{k: v for i in (0, 15) for k, v in block(i, dict.fromkeys(ATTENTION + MLP, 8)).items()},
}
# every shard of a fused layer at its own width
SHARDS = {"q_proj": 3, "k_proj": 4, "v_proj": 8, "gate_proj": 3, "up_proj": 8}
UNTIED = {"*": 4, **{k: v for i in range(LAYERS) for k, v in block(i, SHARDS).items()}}
SERVED = {"stored": None, "3": 3, "4": 4, "tied-mix": "MIXFILE", "untied-mix": UNTIED}  # name: bits asked for
REFUSED = {"9": 9, "1": 1, "damaged": 4}  # widths a 3,4,8 parent cannot serve: resolve_bits' text; a damaged copy
DAMAGED = "model.layers.7.mlp.down_proj.codes"  # one bit flipped in it (damaged_copy)
# vLLM's default: the engine core and its worker in processes of their own, here spawned (a fresh interpreter that
# runs the entry point and unpickles the quantization config), not forked (vLLM's default on the CPU)
SPAWNED = {"spawned-4": 4}
SPAWN_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}


def damaged_copy(parent: Path, out: Path) -> Path:
    """`parent` with one bit of DAMAGED's data flipped (the middle byte of its data, read from the header)."""
    out.mkdir()
    for f in parent.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    index = out / "model.safetensors.index.json"
    weights = out / (json.loads(index.read_text())["weight_map"][DAMAGED] if index.is_file() else "model.safetensors")
    raw = bytearray(weights.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    begin, end = json.loads(raw[8 : 8 + n])[DAMAGED]["data_offsets"]
    raw[8 + n + (begin + end) // 2] ^= 0x10
    weights.write_bytes(bytes(raw))
    return out


def _child(base: Path, name: str, spec: dict, env: dict[str, str] | None = None) -> dict:
    (base / f"{name}.spec.json").write_text(json.dumps(spec))
    run = subprocess.run(
        [sys.executable, str(CHILD), str(base / f"{name}.spec.json"), str(base / f"{name}.json")],
        capture_output=True,
        text=True,
        timeout=3000,
        env={**os.environ, **(env or {})},
    )
    if run.returncode != 0:
        pytest.fail(f"the vLLM process failed (exit {run.returncode}):\n{run.stderr[-4000:]}")
    return json.loads((base / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def served(tmp_path_factory, smol_parent):
    """The parent (test_vllm.py's, quantized once per session), the prompts, what each case asked for, and what vLLM
    computed: every case of SERVED and REFUSED in one process (engine core in it), SPAWNED in a second one with
    vLLM's engine core and worker spawned."""
    base = tmp_path_factory.mktemp("vllm-plugin")
    parent = smol_parent
    prompts = _windows()
    (base / "mix.json").write_text(json.dumps(TIED))
    asked = {n: str(base / "mix.json") if b == "MIXFILE" else b for n, b in {**SERVED, **REFUSED}.items()}
    spec = {
        "parent": str(parent),
        "prompts": prompts,
        "max_tokens": GREEDY_TOKENS,
        "max_model_len": 256,
        "parents": {"damaged": str(damaged_copy(parent, base / "damaged"))},
    }
    one = _child(base, "in-process", {**spec, "cases": asked})
    spawned = _child(base, "spawned", {**spec, "cases": SPAWNED}, SPAWN_ENV)
    return {
        "parent": parent,
        "prompts": prompts,
        "asked": {**asked, **SPAWNED},
        "plugin": one["plugin"],
        "results": {**one["cases"], **spawned["cases"]},
    }


def test_the_entry_point_registers_the_method_in_a_fresh_process(served):
    """The child is a fresh interpreter: `import matgptq` left vLLM alone, and vLLM's own plugin loading (as in
    each process it starts) registered "matgptq" from the installed entry point."""
    assert served["plugin"] == {
        "matgptq_imports_vllm": False,
        "registered_before": False,
        "registered_by_entry_point": True,
    }


@pytest.mark.parametrize("name", [*SERVED, *SPAWNED])
def test_plugin_agrees_with_matgptq_load(served, name):
    c = compare(served["results"][name], served["parent"], served["asked"][name], served["prompts"])
    print(f"{name}: " + ", ".join(f"{k} {v:.4f}" for k, v in c.items()))
    assert not failures(c), (name, failures(c), c)


def test_negative_control_fails_the_same_check(served):
    """The 3-bit serving against the 4-bit reference: the check must tell the widths apart."""
    c = compare(served["results"]["3"], served["parent"], 4, served["prompts"])
    print("3 vs load(4): " + ", ".join(f"{k} {v:.4f}" for k, v in c.items()))
    assert c["mean_abs"] > c["tolerance"], c
    assert failures(c)


def test_a_damaged_parent_is_refused_naming_the_tensor(served):
    """One flipped bit in a quantized layer's codes: vLLM's load stops on the checksum, naming the tensor."""
    said = served["results"]["damaged"].get("refused")
    assert said is not None, "vLLM served a damaged parent"
    assert f"tensor {DAMAGED} does not match its checksum" in said, said


@pytest.mark.parametrize("name", [n for n in REFUSED if n != "damaged"])
def test_a_width_the_parent_cannot_serve_is_one_clear_error(served, name):
    said = served["results"][name].get("refused")
    assert said is not None, f"vLLM served the parent at {name} bits"
    assert said.startswith(
        f"UserError: cannot use {REFUSED[name]} bits for model.layers.0.self_attn.q_proj: widths "
        "2..8 exist for it in this checkpoint"
    ), said
