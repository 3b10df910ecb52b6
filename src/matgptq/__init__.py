"""matgptq: quantize a Hugging Face causal LM once into a Matryoshka parent; slice, load and export any width.

`quantize`, `load`, `set_bits`, `slice`, `evaluate`, `export` and `search` do what the commands of the same names
do (api.py). Importing matgptq also lets transformers' `from_pretrained` load matgptq checkpoints (`MatGPTQConfig`,
integrations/transformers.py).
"""

from ._version import __version__
from .api import evaluate, export, quantize, search
from .api import slice  # noqa: A004 — matgptq.slice, as the command
from .runtime import load, set_bits
from .integrations.transformers import register as _register_with_transformers

MatGPTQConfig = _register_with_transformers()

__all__ = ["quantize", "load", "set_bits", "slice", "evaluate", "export", "search", "MatGPTQConfig", "__version__"]
