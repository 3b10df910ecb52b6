"""matgptq: quantize a Hugging Face causal LM once into a Matryoshka parent; slice, load and export any width.

`quantize`, `load`, `set_bits`, `slice`, `evaluate`, `export` and `search` do what the commands of the same names
do (api.py). `quantize` takes the method's settings as a config (`GPTQConfig`, `MatGPTQConfig`, `RTNConfig`:
quantization/config.py) or as keywords. Importing matgptq also lets transformers' `from_pretrained` load matgptq
checkpoints (`MatGPTQQuantizationConfig` picks the width: integrations/transformers.py).

`import matgptq` is light: each name is imported on first use (PEP 562), and the method is added to transformers'
quantizer registry when the program imports that registry (integrations/post_import.py), not before.
"""

import importlib
import importlib.util

from ._version import __version__
from .integrations.post_import import when_imported

_WHERE = {  # name: the module that defines it
    **dict.fromkeys(("quantize", "slice", "evaluate", "export", "search"), ".api"),
    **dict.fromkeys(("load", "set_bits"), ".runtime"),
    **dict.fromkeys(("GPTQConfig", "MatGPTQConfig", "RTNConfig"), ".quantization"),
}

__all__ = [
    "quantize",
    "load",
    "set_bits",
    "slice",
    "evaluate",
    "export",
    "search",
    "GPTQConfig",
    "MatGPTQConfig",
    "RTNConfig",
    "MatGPTQQuantizationConfig",
    "__version__",
]


def _register_with_transformers():
    from .integrations.transformers import register

    return register()


def __getattr__(name: str):
    if name == "MatGPTQQuantizationConfig":
        value = _register_with_transformers()
    elif name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f".{name}", __name__)  # a subpackage, as `import matgptq` once imported them
    else:
        raise AttributeError(f"module 'matgptq' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


when_imported("transformers.quantizers.auto", _register_with_transformers)
