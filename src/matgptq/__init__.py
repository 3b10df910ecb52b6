"""matgptq: quantize a Hugging Face causal LM once into a Matryoshka parent; slice, load and export any width."""

from ._version import __version__
from .api import quantize
from .runtime import load, set_bits

__all__ = ["quantize", "load", "set_bits", "__version__"]
