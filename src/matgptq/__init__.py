"""matgptq: quantize a Hugging Face causal LM once into a Matryoshka parent; slice, load and export any width.

Importing it also lets transformers' `from_pretrained` load matgptq checkpoints (`MatGPTQConfig`, integrations/transformers.py).
"""

from ._version import __version__
from .api import quantize
from .runtime import load, set_bits
from .integrations.transformers import register as _register_with_transformers

MatGPTQConfig = _register_with_transformers()

__all__ = ["quantize", "load", "set_bits", "MatGPTQConfig", "__version__"]
