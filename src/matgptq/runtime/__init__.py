"""Parent or slice → a model that runs: `load`, `set_bits` and the checkpoint opening they share with the exporters
(loader)."""

from .loader import attach, check_layers, default_packed, load, open_checkpoint, resolve_bits, set_bits

__all__ = ["load", "set_bits", "open_checkpoint", "resolve_bits", "attach", "check_layers", "default_packed"]
