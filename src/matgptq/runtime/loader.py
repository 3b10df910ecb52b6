"""`load()`: a transformers model computing with the (sliced) quantized weights, and width switching in memory.

The model is an ordinary transformers model whose quantized Linear weights are, by `Packing`: DENSE, the exact
dequantized values (float32 arithmetic, cast to the model dtype); CPU (the default for bfloat16 models on CPU-only
machines, `packed_wins`), PackedLinear modules that keep the codes packed and compute from them (runtime/packed.py);
NESTED (the default on a GPU), NestedLinear modules holding bit planes for the nested Triton kernels
(runtime/nested.py), with a dense fallback for layers they cannot hold. The parent's integer data stays attached as
`model.matgptq`, so `set_bits(model, 3)` re-slices without touching the file.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from enum import Enum
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
from ..formats.mix import WidthSpec, read_mix
from ..models import (
    LOAD_ERRORS,
    arch_spec,
    layer_weight,
    load_fp_model,
    loader_quiet,
    require_model_dir,
    resolve_model,
    set_layer_weight,
    weight_keys,
)
from ..models.experts import parse
from ..untrusted import read_json
from .nested import NestedLinear, Resident, kernels_missing, resident_choice
from .packed import PackedLinear

FUSED_DENSE = "fused expert tensors (mixture-of-experts) have no packed kernel"


class Packing(str, Enum):
    """What a quantized layer of a loaded model is."""

    DENSE = "dense"  # the model's own module with the exact dequantized float weight
    CPU = "cpu"  # PackedLinear: packed codes, torch's int4 CPU kernel or the exact bit stream (runtime/packed.py)
    NESTED = "nested"  # NestedLinear: bit planes for the nested Triton kernels, on the GPU (runtime/nested.py)


@dataclass
class QuantizedState:
    """The integer data behind a loaded model and the widths currently in use."""

    checkpoint: Checkpoint
    bits: dict[str, int]
    packing: Packing | bool = Packing.DENSE  # a bool is the former `packed` flag: True = Packing.CPU
    resident: Resident | str = Resident.SLICE  # what a NESTED layer holds (runtime/nested.py)
    dense: dict[str, str] = field(default_factory=dict)  # packed layers that run dense instead: name → why

    def __post_init__(self) -> None:
        if isinstance(self.packing, bool):
            self.packing = Packing.CPU if self.packing else Packing.DENSE
        self.packing, self.resident = Packing(self.packing), resident_choice(self.resident)

    @property
    def packed(self) -> bool:
        """Whether the quantized layers keep their codes packed (CPU or NESTED)."""
        return self.packing is not Packing.DENSE

    @property
    def layers(self):
        return self.checkpoint.layers


def resolve_bits(spec: WidthSpec | None, ckpt: Checkpoint) -> dict[str, int]:
    """Per-layer widths from an int, a {layer: bits} dict (key "*" = default) or a JSON file of either form."""
    if spec is None:
        return {n: q.bits for n, q in ckpt.layers.items()}
    out = read_mix(spec, list(ckpt.layers))
    for n, r in out.items():
        q = ckpt.layers[n]
        if not 2 <= r <= q.master_bits:  # per layer: a checkpoint of mixed widths (quantize --bits-config)
            raise UserError(f"cannot use {r} bits for {n}: widths 2..{q.master_bits} exist for it in this checkpoint")
        if r != q.bits and q.shift:
            raise UserError(f"{n} in {ckpt.path} holds only {q.bits}-bit data; load the parent to get {r} bits")
    return out


def set_bits(model, bits: WidthSpec | None) -> None:
    """Switch a loaded quantized model to other widths (re-slicing the in-memory parent)."""
    state: QuantizedState | None = getattr(model, "matgptq", None)
    if state is None:
        raise UserError("this model was not loaded from a quantized checkpoint by matgptq.load")
    widths = resolve_bits(bits, state.checkpoint)
    spec = arch_spec(model)
    dtype = model.get_input_embeddings().weight.dtype
    for name, r in widths.items():
        if state.bits.get(name) == r:
            continue
        if state.packed and name not in state.dense and parse(name, spec.experts) is not None:
            state.dense[name] = FUSED_DENSE
        if state.packing is Packing.CPU and name not in state.dense:  # re-packed from the parent in memory
            model.set_submodule(name, PackedLinear(state.layers[name].slice(r), model.get_submodule(name).bias, dtype))
        elif state.packing is Packing.NESTED and name not in state.dense:
            _set_nested(model, name, state, r, dtype)
        else:
            set_layer_weight(model, name, spec, state.layers[name].slice(r).dequantize(dtype))
    state.bits = widths


def _set_nested(model, name: str, state: QuantizedState, bits: int, dtype: torch.dtype) -> None:
    """Layer `name` at `bits` on the nested kernels: PARENT switches in place; otherwise the layer is built on the CPU
    from the parent in memory and moved where the layer was. One the layout cannot hold (a UserError of
    NestedLayout.build, e.g. uneven groups) is recorded in `state.dense` and set dense."""
    module = model.get_submodule(name)
    if isinstance(module, NestedLinear) and module.resident is Resident.PARENT:
        module.set_width(bits)
        return
    device = module.planes.device if isinstance(module, NestedLinear) else module.weight.device
    q = state.layers[name]
    try:
        layer = NestedLinear(q, bits, module.bias, dtype, state.resident)
    except UserError as e:
        state.dense[name] = str(e)
        set_layer_weight(model, name, arch_spec(model), q.slice(bits).dequantize(dtype))
        return
    model.set_submodule(name, layer.to(device))


def dense_notice(state: QuantizedState) -> str | None:
    """The one line saying which packed layers run dense and why (None when all run packed)."""
    if not state.dense:
        return None
    reasons = list(dict.fromkeys(state.dense.values()))
    more = f" (and {len(reasons) - 1} other reason(s))" if len(reasons) > 1 else ""
    where = "the nested kernels" if state.packing is Packing.NESTED else "packed codes"
    return (
        f"matgptq: {len(state.dense)} of {len(state.layers)} quantized layers run dense (float weights), not on "
        f"{where}: {reasons[0]}{more}"
    )


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


def packed_wins(dtype: torch.dtype) -> bool:
    """Whether `load` packs by default: bfloat16 on a machine without CUDA, where PackedLinear runs torch's int4 CPU
    kernel (runtime/int4_cpu.py) on 4 or 8 bits per weight instead of 16 (benchmarks/bench_packed_cpu.py compares the
    speed). float32/float16 layers would take the exact bit-stream path, which dequantizes the weight at every call;
    on a CUDA machine a model usually moves to the GPU, where the CPU kernel does not run."""
    return dtype == torch.bfloat16 and not torch.cuda.is_available()


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


def attach(
    model, ckpt: Checkpoint, bits: WidthSpec | None, packed: bool | Packing, resident: Resident | str = Resident.SLICE
) -> None:
    """Give `model` (whose unquantized tensors are loaded) the checkpoint's quantized layers at `bits` (`packed`: a
    Packing, or a bool, True = Packing.CPU), and keep the integer data as `model.matgptq` for `set_bits`. NESTED
    layers are built where the model's Linears are, one at a time; without Triton, or for layers the nested layout
    cannot hold, they stay dense and one line on stderr says how many and why."""
    spec = arch_spec(model)
    state = QuantizedState(ckpt, {}, packed, resident)
    if state.packed and spec.conv1d:
        raise UserError(
            f"packed layers hold nn.Linear weights; {model.config.model_type} uses Conv1D: load it with packed=False"
        )
    if state.packing is Packing.NESTED and (why := kernels_missing()):
        state.dense = dict.fromkeys(ckpt.layers, why)
    model.matgptq = state
    set_bits(model, bits)
    notice = dense_notice(state)
    if notice:
        print(notice, file=sys.stderr)


def default_packed(packed: bool | None, dtype: torch.dtype, conv1d: bool) -> bool:
    """`packed` as given, or where it wins (`packed_wins`) for layers it can hold (nn.Linear, not Conv1D)."""
    return packed_wins(dtype) and not conv1d if packed is None else packed


def default_packing(packed: bool | Packing | None, dtype: torch.dtype, conv1d: bool, device: torch.device) -> Packing:
    """A Packing as given; else on the CPU `default_packed`'s choice (True = Packing.CPU), on a GPU NESTED unless
    packed=False (packed=None: NESTED for nn.Linear models, DENSE for Conv1D ones, which packed layers cannot hold)."""
    if isinstance(packed, Packing):
        return packed
    if device.type == "cpu":
        return Packing.CPU if default_packed(packed, dtype, conv1d) else Packing.DENSE
    if packed is None:
        packed = not conv1d
    return Packing.NESTED if packed else Packing.DENSE


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
    from the parent held in memory. None (default): packed where that wins (`packed_wins`: bfloat16 without CUDA),
    dense float weights otherwise; True/False force it.
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
