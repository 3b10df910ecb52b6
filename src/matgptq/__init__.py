"""matgptq: quantize a Hugging Face causal LM once into a Matryoshka parent; slice, load and export any width."""

__version__ = "0.1.0"

from .api import quantize  # noqa: E402
from .runtime import load, set_bits  # noqa: E402

__all__ = ["quantize", "load", "set_bits", "__version__"]
