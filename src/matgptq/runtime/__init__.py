"""Parent or slice → a model that runs: `load` and the checkpoint opening it shares with the exporters (loader); the
quantized state a loaded model carries, `set_bits` and the widths of a checkpoint (state); the quantized layers'
kinds: PackedLinear (CPU, packed) and NestedLinear (GPU, nested)."""

from .loader import check_layers, load, open_checkpoint
from .nested import Resident
from .state import Packing, attach, default_packed, default_packing, resolve_bits, set_bits

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
