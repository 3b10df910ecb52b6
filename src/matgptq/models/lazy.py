"""A model whose decoder blocks stay in their safetensors files until the pipeline needs them.

`LazyModel.open(path)` builds the transformers model with every parameter on the meta device (no memory: parameters
are created where transformers creates them and moved to meta at once, as accelerate's
`init_empty_weights(include_buffers=False)` does; buffers such as rotary frequencies are computed as usual), then
reads the tensors outside the decoder blocks (embeddings, final norm, lm_head) from the files. `load_block(i, device)`
reads block i's tensors straight from the shards onto `device` and `free_block(i)` puts them back on meta, so at
most one block's weights are resident: memory ≈ embeddings + lm_head + one block, whatever the depth. The
quantization pipeline needs the tensors outside the blocks only for the first block's inputs: `free_outside()` puts
them on meta meanwhile and `load_outside()` reads them again, so while blocks are quantized memory ≈ one block.

The values are those `from_pretrained` loads: the same file tensors cast to each parameter's dtype (the requested
dtype, else config.json's, else that of the first floating tensor, transformers' "auto" rule), tied weights tied
by the model itself; tests/models/test_lazy.py checks every tensor and the logits against `load_fp_model`. Tensor
names are the model's own, or without the base-model prefix (checkpoints saved from the bare base model, e.g.
GPT-2's "h.0.attn..."), or, for fused experts saved one expert at a time (qwen3_moe's `experts.<e>.gate_proj`,
mixtral's `block_sparse_moe.experts.<e>.w1`, ...), the pieces transformers' conversions merge (models/experts.py
FILE_LAYOUTS), assembled block by block. Files whose names do not cover the model's parameters cannot be streamed:
`open` returns None and the caller loads the model whole. Every tensor is checked for NaN/Inf before any work, one at a time.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import safe_open
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from ..errors import UserError
from ..untrusted import read_header, read_json
from .arch import ArchSpec, arch_spec, get_blocks
from .experts import file_names, per_expert_keys
from .hf import LOAD_ERRORS, require_model_dir

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


@contextmanager
def parameters_on_meta():
    """Modules built inside get meta parameters (moved as they are registered); buffers stay real."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param) -> None:
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = type(param)(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


class Source(NamedTuple):
    """Where a model tensor is in the files: one (file, name) piece, or for fused experts stored per expert
    (experts.py FILE_LAYOUTS) per expert the pieces to concatenate, stacked over the experts."""

    pieces: list[list[tuple[Path, str]]]
    stacked: bool


def _source(name: str, shape: tuple[int, ...], stored: dict, prefix: str) -> Source | None:
    """Where the files hold model tensor `name` of `shape` (under its name, without the base-model `prefix`, or as
    transformers' conversions name it: experts.py), or None."""
    for candidate in file_names(name):
        key = candidate if candidate in stored else candidate.removeprefix(prefix)
        if key in stored and tuple(stored[key][2]) == shape:
            return Source([[(stored[key][0], key)]], False)
    for candidate in (name, name.removeprefix(prefix)) if len(shape) == 3 else ():
        keys = per_expert_keys(candidate, shape[0], lambda k: k in stored)
        fits = keys is not None and all(
            sum(stored[k][2][0] for k in ks) == shape[1] and all(tuple(stored[k][2][1:]) == shape[2:] for k in ks)
            for ks in keys
        )
        if fits:
            return Source([[(stored[k][0], k) for k in ks] for ks in keys], True)
    return None


class LazyModel:
    """See the module docstring. `model` is the transformers model (eval mode), blocks on meta until loaded."""

    def __init__(self, model: nn.Module, spec: ArchSpec, where: dict[str, Source]) -> None:
        self.model, self.spec, self.where = model, spec, where  # where: model tensor name -> its pieces in the files
        self.blocks = get_blocks(model, spec)

    @classmethod
    def open(cls, path: str | Path, dtype: torch.dtype | None = None) -> "LazyModel | None":
        p = require_model_dir(path)
        fix = "the model directory is damaged or incomplete; re-download or re-create it"
        read_json(p / "config.json", fix)
        files = sorted(p.glob("*.safetensors"))
        if not files:
            raise UserError(f"{p} has no .safetensors weights; this tool loads only safetensors (never pickles)")
        stored: dict[str, tuple[Path, str, tuple[int, ...]]] = {}
        for f in files:
            for name, (kind, shape) in read_header(f, fix).items():
                if name in stored:
                    return None  # the same tensor in two files: leave the choice to transformers
                stored[name] = (f, kind, shape)
        try:
            config = AutoConfig.from_pretrained(p)
            if dtype is None:  # transformers' "auto": config.json's dtype, else the first floating tensor's
                dtype = getattr(config, "dtype", None) or next(
                    (_DTYPES[k] for _, k, _ in stored.values() if k in _DTYPES), torch.float32
                )
                dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
            with parameters_on_meta():
                model = AutoModelForCausalLM.from_config(config, dtype=dtype)
            spec = arch_spec(model)
        except LOAD_ERRORS as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise UserError(f"cannot build the model in {p} ({first}); {fix}") from None
        prefix = f"{model.base_model_prefix}."
        where: dict[str, Source] = {}
        seen: set[int] = set()
        for name, t in model.state_dict(keep_vars=True).items():
            if id(t) in seen:
                continue  # tied to a tensor named before (lm_head to the embeddings): the model ties it again
            seen.add(id(t))
            source = _source(name, tuple(t.shape), stored, prefix)
            if source is not None:
                where[name] = source
            elif t.device.type == "meta":
                return None  # a parameter the files do not hold (as named and shaped): not streamable
            # else: a buffer the files do not hold keeps its computed value, as with from_pretrained
        lazy = cls(model.eval(), spec, where)
        lazy._check_finite(fix)
        lazy._load(lambda n: not n.startswith(f"{spec.blocks}."), torch.device("cpu"))
        model.tie_weights()
        return lazy

    def _check_finite(self, fix: str) -> None:
        """NaN/Inf in any weight is bad input, found before any work (one tensor in memory at a time)."""
        for name, source in self.where.items():
            for file, key in (p for pieces in source.pieces for p in pieces):
                with safe_open(str(file), "pt") as f:
                    t = f.get_tensor(key)
                if t.is_floating_point() and not torch.isfinite(t).all():
                    raise UserError(
                        f"the model weight {name} contains NaN or Inf values; fix or re-export the model first"
                    )

    def _load(self, wanted, device: torch.device) -> None:
        """Read the tensors whose names `wanted` accepts onto `device`, each in its parameter's dtype (fused experts
        assembled from their per-expert pieces: stacked over the experts, each the concatenation of its pieces)."""
        names = [n for n in self.where if wanted(n)]
        current = self.model.state_dict(keep_vars=True)
        needed = {p for n in names for pieces in self.where[n].pieces for p in pieces}
        read: dict[tuple[Path, str], torch.Tensor] = {}
        for file in sorted({f for f, _ in needed}):
            with safe_open(str(file), "pt") as f:
                read.update({(file, key): f.get_tensor(key) for g, key in needed if g == file})
        loaded: dict[str, torch.Tensor] = {}
        for n in names:
            source = self.where[n]
            parts = [torch.cat([read.pop(p) for p in pieces]) for pieces in source.pieces]
            t = torch.stack(parts) if source.stacked else parts[0]
            dtype = current[n].dtype if t.is_floating_point() else t.dtype
            loaded[n] = t.to(device=device, dtype=dtype)
        self.model.load_state_dict(loaded, strict=False, assign=True)

    def load_block(self, i: int, device: torch.device) -> nn.Module:
        """Block i with its weights read from the files onto `device` (its buffers moved there too)."""
        prefix = f"{self.spec.blocks}.{i}."
        self._load(lambda n: n.startswith(prefix), device)
        return self.blocks[i].to(device)

    def free_block(self, i: int) -> None:
        """Block i's parameters back on meta: their memory is released."""
        _to_meta(self.blocks[i].modules())

    def free_outside(self) -> None:
        """The parameters outside the blocks (embeddings, final norm, lm_head) back on meta, while only the blocks are
        needed; every module's own, so a tied lm_head lets go of the embeddings too."""
        inside = {id(m) for block in self.blocks for m in block.modules()}
        _to_meta(m for m in self.model.modules() if id(m) not in inside)

    def load_outside(self) -> None:
        """The parameters outside the blocks read again from the files (on the CPU, as `open` reads them), tied again."""
        self._load(lambda n: not n.startswith(f"{self.spec.blocks}."), torch.device("cpu"))
        self.model.tie_weights()


def _to_meta(modules) -> None:
    """Each module's own parameters replaced by meta ones: their memory is released once nothing else holds it."""
    for module in modules:
        for name, param in list(module._parameters.items()):
            if param is not None:
                module._parameters[name] = type(param)(param.to("meta"), requires_grad=param.requires_grad)
