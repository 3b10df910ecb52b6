"""`load()`: a transformers model computing with the (sliced) quantized weights of a matgptq, GPTQ or
compressed-tensors checkpoint (`open_checkpoint` picks the reader), built on the CPU, checked against the checkpoint,
given its quantized layers (state.py: `Packing`, `attach`, `set_bits`) and moved to its device.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

try:  # transformers 5; 4.x has it in modeling_utils; without either the weights are initialised (slower, the same)
    from transformers.initialization import no_init_weights
except ImportError:
    try:
        from transformers.modeling_utils import no_init_weights
    except ImportError:
        from contextlib import nullcontext as no_init_weights

from ..errors import UserError
from ..execution import resolve_device
from ..formats import Checkpoint, is_checkpoint, read_checkpoint, read_ct_checkpoint, read_gptq_checkpoint
from ..formats.checksums import trusted
from ..formats.mix import WidthSpec
from ..models import (
    LOAD_ERRORS,
    arch_spec,
    layer_weight,
    load_fp_model,
    loader_quiet,
    require_model_dir,
    resolve_model,
    weight_keys,
)
from ..untrusted import read_json
from .nested import Resident, resident_choice
from .state import Packing, attach, default_packing


def _config(ckpt: Checkpoint):
    """The transformers config of a checkpoint's config.json (a damaged one is a UserError, not a parser error)."""
    try:
        config = AutoConfig.for_model(**ckpt.config)
    except LOAD_ERRORS as e:
        raise UserError(
            f"{ckpt.path}/config.json is not a valid model config ({str(e)[:200]}); re-create the checkpoint"
        ) from None
    return config


_BLOCK = re.compile(r"\.(?:layers|h|blocks)\.(\d+)\.")  # a decoder block's index in a tensor or layer name


def _check_depth(ckpt: Checkpoint, config) -> None:
    """config.json's block count against the blocks the checkpoint stores, before a model that deep is built (a
    damaged count would build, and allocate, for as long as it says)."""
    declared = getattr(config, "num_hidden_layers", None)
    stored = {int(m.group(1)) for name in (*ckpt.layers, *ckpt.tensors) if (m := _BLOCK.search(name))}
    if isinstance(declared, int) and stored and declared > max(stored) + 1:
        raise UserError(
            f"{ckpt.path}/config.json says {declared} blocks, but the checkpoint stores {max(stored) + 1}; "
            "one of them is damaged, re-create the checkpoint"
        )


def check_layers(ckpt: Checkpoint, model, spec) -> None:
    """Every quantized layer of `ckpt` is a Linear of `model` with the same [out, in] shape (a model on the meta
    device will do: only shapes are read)."""
    for name, q in ckpt.layers.items():
        try:
            shape = tuple(layer_weight(model, name, spec).shape)
        except AttributeError:  # no such module, or one without a weight
            shape = None
        if shape != q.shape:
            raise UserError(
                f"{ckpt.path}: quantized layer {name} is {list(q.shape)}, the config implies "
                f"{list(shape) if shape else 'no such Linear'}; re-create the checkpoint"
            )


def build_model(
    ckpt: Checkpoint,
    bits: WidthSpec | None = None,
    dtype: torch.dtype | None = None,
    packed: bool | Packing | None = False,
    device: torch.device | str | None = None,
    resident: Resident | str = Resident.SLICE,
):
    """The model of `ckpt` (load's work after the checkpoint is read): built on the CPU, its quantized layers set
    (`default_packing`), then moved to `device` (None: the CPU), so a GPU receives the packed model only."""
    device = resolve_device(device or "cpu")
    config = _config(ckpt)
    dtype = dtype or getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    _check_depth(ckpt, config)
    try:
        with loader_quiet(), no_init_weights():  # every weight is overwritten below: skip the random init
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    except LOAD_ERRORS as e:  # sizes a damaged config.json implies
        raise UserError(
            f"{ckpt.path}/config.json describes no buildable model ({str(e)[:200]}); re-create the checkpoint"
        ) from None
    spec = arch_spec(model)
    expected = dict(model.state_dict())
    quantized = weight_keys(set(ckpt.layers), spec)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    unexpected = sorted(set(ckpt.tensors) - set(expected))
    missing = sorted(set(expected) - set(ckpt.tensors) - quantized - tied)
    if unexpected or missing:
        bad = (unexpected or missing)[0]
        raise UserError(f"{ckpt.path} does not match its config.json (tensor {bad}); re-create the checkpoint")
    for name, t in ckpt.tensors.items():
        if t.shape != expected[name].shape or not t.is_floating_point():
            raise UserError(
                f"{ckpt.path}: tensor {name} is {t.dtype} {list(t.shape)}, the config implies "
                f"{list(expected[name].shape)}; re-create the checkpoint"
            )
    check_layers(ckpt, model, spec)
    model.load_state_dict(ckpt.tensors, strict=False)
    model.tie_weights()
    head = ckpt.tensors.get("lm_head.weight")
    if tied and head is not None and not torch.equal(model.get_output_embeddings().weight, head.to(dtype)):
        raise UserError(
            f"{ckpt.path}/config.json ties lm_head to the embeddings (`tie_word_embeddings`), but the "
            "checkpoint stores an lm_head.weight of its own; one of them is damaged, re-create the "
            "checkpoint"
        )
    attach(model, ckpt, bits, default_packing(packed, dtype, spec.conv1d, device), resident)
    return model.to(device).eval()


def open_checkpoint(path: str | Path) -> Checkpoint | None:
    """The quantized checkpoint at `path` (matgptq, GPTQ or compressed-tensors pack-quantized), or None for an
    unquantized model directory."""
    p = Path(path)
    if is_checkpoint(p):
        return read_checkpoint(p)
    config = read_json(
        require_model_dir(p) / "config.json", "the model directory is damaged; re-download or re-create it"
    )
    qc = config.get("quantization_config") or {}
    method = qc.get("quant_method") if isinstance(qc, dict) else "unknown"
    if method == "gptq":
        return read_gptq_checkpoint(p)
    if method == "compressed-tensors":
        return read_ct_checkpoint(p)
    if method is not None:
        raise UserError(
            f"{p} is quantized with '{method}', which matgptq cannot read (it reads matgptq, gptq and "
            "compressed-tensors)"
        )
    return None


def load(
    path: str | Path,
    bits: WidthSpec | None = None,
    dtype: torch.dtype | None = None,
    packed: bool | None = None,
    device: str | torch.device | None = None,
    resident: Resident | str | None = None,
    verify: bool = True,
):
    """A transformers causal LM (eval mode) from a matgptq parent/slice, a GPTQ or compressed-tensors (pack-quantized)
    checkpoint or an unquantized model:
    a local directory or a Hugging Face id `org/name[@revision]` (models/hub.py).

    `bits`: for a parent, one width for all layers (any 2..c), a {layer: bits} mapping, or a JSON file of one.
    `packed`: quantized layers keep their r-bit codes packed (runtime/packed.py: ≤ 8 bits per weight instead of a
    float matrix, outputs equal to the dense ones or within the int4 kernel's derived tolerance); `set_bits` re-packs
    from the parent held in memory. None (default): packed where that wins (state.py `packed_wins`: bfloat16 without
    CUDA), dense float weights otherwise; True/False force it.
    `device`: None or "cpu" (default) keeps the model on the CPU; "cuda", "cuda:i" (or "auto") builds it on the CPU
    and moves it to that GPU, where quantized layers, unless packed=False, hold nested bit planes and compute with
    the nested Triton kernels (runtime/nested.py), so the GPU receives the packed model only. A layer the kernels
    cannot serve (uneven groups; every layer without Triton) runs dense, and one line on stderr says so.
    `resident` (GPU, packed layers only): "slice" (default) holds the loaded width's planes alone, about r bits per
    weight (`set_bits` rebuilds the layers from the parent in memory); "parent" holds all the parent's planes, so
    `set_bits` switches any width in place without copying a weight.
    `verify`: check a matgptq checkpoint's tensors against their recorded checksums (formats/checksums.py); False
    for a file you trust.
    """
    target = resolve_device(device or "cpu")
    resident = None if resident is None else resident_choice(resident)
    if resident is not None and (target.type == "cpu" or packed is False):
        where = "packed=False keeps dense weights" if target.type != "cpu" else "the model loads on the CPU"
        raise UserError(
            f"resident= chooses what a GPU's packed (nested-kernel) layers hold, and {where}: drop "
            "resident, or load with device='cuda' and packed left as None or True"
        )
    path = resolve_model(path).path  # a Hugging Face id (org/name[@revision]) is resolved through its cache
    if not path.exists():
        raise UserError(f"{path} does not exist; give a model or checkpoint directory, or a Hugging Face id org/name")
    with trusted(not verify):
        ckpt = open_checkpoint(path)
    if ckpt is None:
        if bits is not None or packed or resident is not None:
            raise UserError(
                f"{path} is not quantized; --bits, packed and resident apply to matgptq/GPTQ checkpoints only"
            )
        return load_fp_model(path, dtype).to(target)
    return build_model(ckpt, bits, dtype, packed, target, resident or Resident.SLICE)
