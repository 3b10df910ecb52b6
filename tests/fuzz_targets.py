"""The readers tests/test_fuzz_volume.py damages inputs of, each with its files, how it is called in-process and its
oracle: what a damaged input that still loads may differ in from the undamaged one (module docstring there)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from tests.fuzz_damage import gguf_damage, json_damage, safetensors_damage
from tests.fuzz_oracles import (
    checkpoint_judge,
    config_judge,
    gguf_judge,
    mix_judge,
    resume_judge,
    safetensors_judge,
    same_model_judge,
)


@dataclass
class Target:
    name: str
    root: Path  # the undamaged source directory
    files: dict[str, tuple[int, Callable]]  # file (relative to root) -> (weight, damage generator)
    read: Callable[[Path], Any]  # the reader on a directory holding these files
    judge: Callable  # (damaged result, baseline result, recipe, original bytes) -> failure text or None


def _build(root: Path) -> dict[str, Path]:
    """Tiny sources: a 1-layer llama (hidden 32), its MatGPTQ parents, a slice and every export."""
    import matgptq
    from matgptq.exporters.compressed_tensors import export_compressed_tensors
    from matgptq.exporters.gguf import export_gguf
    from matgptq.exporters.gptq import export_gptq
    from tests.conftest import make_tiny_llama, quick_quantize

    hf = make_tiny_llama(root / "hf", hidden=32, intermediate=64, layers=1, heads=2, kv_heads=1)
    # with act-order permutations and per-width scales (every tensor kind a parent stores)
    parent = quick_quantize(
        hf, root / "parent", method="matgptq", bits="3,4,8", group_size=16, act_order=True, static_groups=False
    )
    matgptq.slice(parent, 3, root / "slice")
    plain = quick_quantize(hf, root / "plain", method="matgptq", bits="3,4,8", group_size=32)  # what exports take
    export_gptq(plain, root / "gptq_v1", "gptq_v1", bits=4)
    export_gptq(plain, root / "gptq_v2", "gptq_v2", bits=4)
    export_compressed_tensors(plain, root / "ct", bits=4)
    (root / "gguf").mkdir()
    export_gguf(plain, root / "gguf" / "m.gguf", bits=4)
    for f in root.rglob("*.json"):  # the same bytes on every run, so that a recipe replays: no temporary paths
        f.write_text(f.read_text().replace(str(root), "/fuzz-sources"))
    return {"hf": hf, "parent": parent, "slice": root / "slice", "plain": plain}


def _mix_source(root: Path, parent: Path) -> list[str]:
    from matgptq.formats import read_checkpoint

    names = sorted(read_checkpoint(parent).layers)
    (root / "mix").mkdir()
    (root / "mix" / "mix.json").write_text(json.dumps({"bits": {"*": 4, names[0]: 3, names[-1]: 8}}, indent=2))
    return names


RESUME_SETTINGS = {"model": "tiny", "method": "gptq", "bits": 4, "nsamples": 2, "seqlen": 8}


def _resume_source(root: Path) -> list[torch.Tensor]:
    """A killed run's state after block 0 of 2: state.json, block-0.safetensors and hidden-1.safetensors."""
    from safetensors.torch import save_file

    from matgptq.quantization.layer import LayerReport
    from matgptq.quantization.resume import BlockState

    state = BlockState(root / "resume" / "out", RESUME_SETTINGS, resume=True)
    state.dir.mkdir(parents=True)
    save_file(
        {"model.layers.0.mlp.up_proj.codes": torch.zeros(4, 4, dtype=torch.uint8)},
        str(state.dir / "block-0.safetensors"),
    )
    hidden = [torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(b)) for b in range(2)]
    reports = [
        LayerReport(f"model.layers.0.{p}", (32, 32), {4: 0.01 * i}, 0.01, 0.5)
        for i, p in enumerate(["self_attn.q_proj", "mlp.down_proj"])
    ]
    state.save(1, reports, hidden)
    return hidden


def _foreign(d: Path):
    """What `matgptq.load` does with a GPTQ or compressed-tensors directory before it attaches the layers."""
    from matgptq.models import load_fp_model
    from matgptq.runtime.loader import build_model, open_checkpoint

    ckpt = open_checkpoint(d)
    if ckpt is None:  # config.json no longer says it is quantized: `load` takes it for a float model
        return load_fp_model(d)
    build_model(ckpt)
    return ckpt


def _config_reader(base):
    """config.json of a parent as `matgptq.load` reads it: the layout, then the model it builds (tensors as read)."""
    from matgptq.formats import Checkpoint
    from matgptq.formats.parent import read_layout
    from matgptq.runtime.loader import build_model

    def read(d: Path):
        layout = read_layout(d)
        return build_model(Checkpoint(layout.meta, layout.config, base.layers, dict(base.tensors), d))

    return read


def targets(root: Path) -> dict[str, Target]:
    """Every reader with its tiny sources, built under `root`."""
    from matgptq.formats import read_checkpoint
    from matgptq.formats.gguf.reader import read_gguf
    from matgptq.formats.mix import read_mix
    from matgptq.quantization.resume import BlockState
    from matgptq.untrusted import read_header, read_tensors

    src = _build(root)
    names = _mix_source(root, src["parent"])
    like = _resume_source(root)
    (root / "st").mkdir()
    shutil.copy2(src["hf"] / "model.safetensors", root / "st" / "model.safetensors")
    st, js = safetensors_damage, json_damage
    ckpt_files = {"model.safetensors": (4, st), "matgptq.json": (2, js), "config.json": (1, js)}
    gptq_files = {"model.safetensors": (4, st), "config.json": (1, js), "quantize_config.json": (2, js)}
    resume_dir = ".out.resume"
    out = {
        "parent": Target("parent", src["parent"], ckpt_files, read_checkpoint, same_model_judge),
        "slice": Target("slice", src["slice"], ckpt_files, read_checkpoint, same_model_judge),
        "gptq_v1": Target("gptq_v1", root / "gptq_v1", gptq_files, _foreign, checkpoint_judge),
        "gptq_v2": Target("gptq_v2", root / "gptq_v2", gptq_files, _foreign, checkpoint_judge),
        "compressed_tensors": Target(
            "compressed_tensors",
            root / "ct",
            {"model.safetensors": (4, st), "config.json": (2, js)},
            _foreign,
            checkpoint_judge,
        ),
        "gguf": Target(
            "gguf", root / "gguf", {"m.gguf": (1, gguf_damage)}, lambda d: read_gguf(d / "m.gguf"), gguf_judge
        ),
        "mix": Target("mix", root / "mix", {"mix.json": (1, js)}, lambda d: read_mix(d / "mix.json", names), mix_judge),
        "config": Target(
            "config",
            src["parent"],
            {"config.json": (1, js)},
            _config_reader(read_checkpoint(src["parent"])),
            config_judge,
        ),
        "safetensors": Target(
            "safetensors",
            root / "st",
            {"model.safetensors": (1, st)},
            lambda d: (read_header(d / "model.safetensors"), read_tensors(d / "model.safetensors")),
            safetensors_judge,
        ),
        "resume": Target(
            "resume",
            root / "resume",
            {f"{resume_dir}/state.json": (1, js), f"{resume_dir}/hidden-1.safetensors": (1, st)},
            lambda d: BlockState(d / "out", RESUME_SETTINGS, resume=True).load(2, 2, like=like),
            resume_judge,
        ),
    }
    return out
