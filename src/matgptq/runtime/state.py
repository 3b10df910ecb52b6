"""The quantized state a loaded model carries as `model.matgptq` (QuantizedState): the parent's integer data, each
layer's width and what its quantized layers are (`Packing`): DENSE, the exact dequantized values (float32 arithmetic,
cast to the model dtype); CPU (the default for bfloat16 models on CPU-only machines, `packed_wins`), PackedLinear
modules that keep the codes packed and compute from them (runtime/packed.py); NESTED (the default on a GPU),
NestedLinear modules holding bit planes for the nested Triton kernels (runtime/nested.py), with a dense fallback for
layers they cannot hold. `attach` gives a built model that state, `set_bits` re-slices it without touching the file.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from enum import Enum

import torch

from ..errors import UserError
from ..formats import Checkpoint
from ..formats.mix import WidthSpec, read_mix
from ..models import arch_spec, set_layer_weight
from ..models.experts import parse
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


def packed_wins(dtype: torch.dtype) -> bool:
    """Whether `load` packs by default: bfloat16 on a machine without CUDA, where PackedLinear runs torch's int4 CPU
    kernel (runtime/int4_cpu.py) on 4 or 8 bits per weight instead of 16 (the study that compared the speed is named
    in docs/results/README.md). float32/float16 layers would take the exact bit-stream path, which dequantizes the weight at every call;
    on a CUDA machine a model usually moves to the GPU, where the CPU kernel does not run."""
    return dtype == torch.bfloat16 and not torch.cuda.is_available()


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
