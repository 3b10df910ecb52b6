"""`load()`: a transformers model computing with the (sliced) quantized weights, and width switching in memory.

The model is an ordinary transformers model whose quantized Linear weights are replaced by the exact dequantized
values (float32 arithmetic, cast to the model dtype). The parent's integer data stays attached as `model.matgptq`, so
`set_bits(model, 3)` re-slices without touching the file.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ..errors import UserError
from ..formats import Checkpoint, is_checkpoint, read_checkpoint, read_gptq_checkpoint
from ..models import arch_spec, load_fp_model, require_model_dir, set_weight_matrix

BitsSpec = int | dict[str, int] | str | Path | None


@dataclass
class QuantizedState:
    """The integer data behind a loaded model and the widths currently in use."""

    checkpoint: Checkpoint
    bits: dict[str, int]

    @property
    def layers(self):
        return self.checkpoint.layers


def resolve_bits(spec: BitsSpec, ckpt: Checkpoint) -> dict[str, int]:
    """Per-layer widths from an int, a {layer: bits} dict (key "*" = default) or a JSON file of either form."""
    names = list(ckpt.layers)
    if spec is None:
        return {n: q.bits for n, q in ckpt.layers.items()}
    if isinstance(spec, (str, Path)) and not str(spec).isdigit():
        p = Path(spec)
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"cannot read the bits config {p} ({e}); give a JSON file {{layer: bits}}") from None
        spec = data.get("bits", data) if isinstance(data, dict) else data
    if isinstance(spec, (int, str)):
        spec = {"*": int(spec)}
    if not isinstance(spec, dict):
        raise UserError(f"bits must be an int, a {{layer: bits}} mapping or a JSON file, got {type(spec).__name__}")
    unknown = sorted(set(spec) - set(names) - {"*"})
    if unknown:
        raise UserError(f"the bits config names {len(unknown)} unknown layers (e.g. {unknown[0]}); use names from {names[0]}…")
    missing = [n for n in names if n not in spec and "*" not in spec]
    if missing:
        raise UserError(f"the bits config misses {len(missing)} layers (e.g. {missing[0]}); list them or add a \"*\" default")
    out = {n: int(spec.get(n, spec.get("*"))) for n in names}
    master = max(q.master_bits for q in ckpt.layers.values())
    for n, r in out.items():
        q = ckpt.layers[n]
        if not 2 <= r <= master:
            raise UserError(f"cannot use {r} bits for {n}: widths 2..{master} exist in this checkpoint")
        if r != q.bits and q.shift:
            raise UserError(f"{n} in {ckpt.path} holds only {q.bits}-bit data; load the parent to get {r} bits")
    return out


def set_bits(model, bits: BitsSpec) -> None:
    """Switch a loaded quantized model to other widths (re-slicing the in-memory parent)."""
    state: QuantizedState | None = getattr(model, "matgptq", None)
    if state is None:
        raise UserError("this model was not loaded from a quantized checkpoint by matgptq.load")
    widths = resolve_bits(bits, state.checkpoint)
    spec = arch_spec(model.config.model_type)
    dtype = next(model.parameters()).dtype
    for name, r in widths.items():
        if state.bits.get(name) != r:
            set_weight_matrix(model.get_submodule(name), spec, state.layers[name].slice(r).dequantize(dtype))
    state.bits = widths


def build_model(ckpt: Checkpoint, bits: BitsSpec = None, dtype: torch.dtype | None = None):
    config = AutoConfig.for_model(**ckpt.config)
    dtype = dtype or getattr(config, "torch_dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    logging.getLogger("transformers.modeling_utils").setLevel(logging.ERROR)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = model.load_state_dict(ckpt.tensors, strict=False)
    quantized = {f"{n}.weight" for n in ckpt.layers}
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - quantized - tied:
        bad = unexpected or sorted(set(missing) - quantized - tied)
        raise UserError(f"{ckpt.path} does not match its config.json (tensor {bad[0]}); re-create the checkpoint")
    model.tie_weights()
    model.matgptq = QuantizedState(ckpt, {})
    set_bits(model, bits)
    return model.eval()


def open_checkpoint(path: str | Path) -> Checkpoint | None:
    """The quantized checkpoint at `path` (matgptq or GPTQ), or None for an unquantized model directory."""
    p = Path(path)
    if is_checkpoint(p):
        return read_checkpoint(p)
    config = json.loads((require_model_dir(p) / "config.json").read_text())
    method = (config.get("quantization_config") or {}).get("quant_method")
    if method == "gptq":
        return read_gptq_checkpoint(p)
    if method is not None:
        raise UserError(f"{p} is quantized with '{method}', which matgptq cannot read (it reads matgptq and gptq)")
    return None


def load(path: str | Path, bits: BitsSpec = None, dtype: torch.dtype | None = None):
    """A transformers causal LM (eval mode) from a matgptq parent/slice, a GPTQ checkpoint or an unquantized model.

    `bits`: for a parent, one width for all layers (any 2..c), a {layer: bits} mapping, or a JSON file of one.
    """
    if not Path(path).exists():
        raise UserError(f"{path} does not exist; give a model or checkpoint directory")
    ckpt = open_checkpoint(path)
    if ckpt is None:
        if bits is not None:
            raise UserError(f"{path} is not quantized; --bits applies to matgptq/GPTQ checkpoints only")
        return load_fp_model(path, dtype)
    return build_model(ckpt, bits, dtype)
