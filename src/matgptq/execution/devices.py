"""`--device auto|cpu|cuda[:i]`: where a command computes.

auto = CUDA when present, else the CPU. Under torchrun with CUDA, `auto` and a bare `cuda` mean this process's own GPU,
cuda:LOCAL_RANK (one process per GPU, the torch.distributed convention). A CUDA device on a machine without CUDA, or an
index past the last GPU, is a one-line UserError before any work.

What runs where (quantization): the model in its own dtype on the device, one decoder block at a time; the Hessians
and the solver in float32 on the device; what is written goes through the CPU. The CPU device is the code path as it
was before devices existed: nothing is moved or copied, so CPU results stay bit-identical.
"""

from __future__ import annotations

import os

import torch

from ..errors import UserError

CHOICES_HELP = "auto (CUDA when present, else CPU), cpu, cuda or cuda:INDEX"
# `--dtype` of quantize and eval: what a model computes in (compute_dtype); auto: the model's own, with one exception
DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """The torch.device for `spec`; UserError for a CUDA device this machine does not have or an unknown name."""
    if isinstance(spec, torch.device):
        spec = str(spec)
    text = (spec or "auto").strip().lower()
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "cpu"
    if text == "cpu":
        return torch.device("cpu")
    kind, _, index = text.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise UserError(f"--device {spec!r} is not a device; use {CHOICES_HELP}")
    if not torch.cuda.is_available():
        raise UserError(
            f"--device {spec} needs CUDA, and torch finds no CUDA device on this machine "
            f"(torch {torch.__version__}); use --device cpu or auto"
        )
    if not index:  # one process per GPU under torchrun; the current GPU otherwise
        local = os.environ.get("LOCAL_RANK")
        torchrun = local is not None and int(os.environ.get("WORLD_SIZE", "1")) > 1
        index = local if torchrun else str(torch.cuda.current_device())
    count = torch.cuda.device_count()
    if int(index) >= count:
        raise UserError(f"--device cuda:{index}: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}")
    return torch.device("cuda", int(index))


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's first parameter (the CPU for a model without parameters)."""
    p = next(iter(model.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


def native_bfloat16(device: torch.device) -> bool:
    """Whether `device` multiplies bfloat16 matrices in hardware (native_half)."""
    return native_half(torch.bfloat16, device)


def native_half(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether `device` multiplies `dtype` (bfloat16 or float16) matrices in hardware, so that the half dtype is
    faster there rather than emulated: CUDA (bfloat16 where the GPU has it), a CPU with AVX512-BF16 or AMX for
    bfloat16, with AMX-FP16 for float16. On a plain AVX-512 or AVX2 CPU oneDNN converts, several times slower than
    float32 (docs/decisions/code-constants.md)."""
    if device.type == "cuda":
        return dtype is torch.float16 or torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    names = (
        ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        if dtype is torch.bfloat16
        else ("_is_amx_fp16_supported",)
    )
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in names)


def compute_dtype(choice: str, stored: str | None, device: torch.device) -> torch.dtype | None:
    """The dtype a model whose config.json names `stored` computes in on `device` for `--dtype choice` (DTYPES);
    None: its own. `auto` is the model's own, except for a bfloat16 or float16 model on a CPU without arithmetic in that
    dtype (native_half): that one computes in float32, which holds every half value exactly. There the half dtype is
    emulated, several times slower, a whole quantization too (docs/decisions/code-constants.md)."""
    chosen = DTYPES[choice]
    half = DTYPES.get(stored) if stored in ("bfloat16", "float16") else None
    if chosen is None and half is not None and device.type == "cpu" and not native_half(half, device):
        return torch.float32
    return chosen
