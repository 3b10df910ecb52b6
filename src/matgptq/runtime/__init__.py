"""Parent or slice → a model that runs: `load`, `set_bits` and the checkpoint opening they share with the exporters
(loader); the quantized layers' kinds: PackedLinear (CPU, packed) and NestedLinear (GPU, nested)."""

from .loader import (
    Packing,
    attach,
    check_layers,
    default_packed,
    default_packing,
    load,
    open_checkpoint,
    resolve_bits,
    set_bits,
)
from .nested import Resident

__all__ = [
    "load",
    "set_bits",
    "open_checkpoint",
    "resolve_bits",
    "attach",
    "check_layers",
    "default_packed",
    "default_packing",
    "Packing",
    "Resident",
]
