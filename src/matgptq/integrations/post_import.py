"""Run a function right after a module is first imported, or at once if it already is: how `import matgptq` adds
its method to transformers' quantizer registry without importing transformers (whose registry imports every
quantization backend installed, Triton among them) until the user's program does."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable


class _Then(importlib.abc.Loader):
    """`loader`'s module, then `then()`."""

    def __init__(self, loader: importlib.abc.Loader, then: Callable[[], object]) -> None:
        self.loader, self.then = loader, then

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        self.then()


class _Finder(importlib.abc.MetaPathFinder):
    """Finds `name` as the other finders do, with a loader that calls `then` after it; once."""

    def __init__(self, name: str, then: Callable[[], object]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _Then(spec.loader, self.then)
        return spec


def when_imported(name: str, then: Callable[[], object]) -> None:
    """Call `then()` once `name` is imported: now if it is, else right after its module has run."""
    if name in sys.modules:
        then()
    elif not any(isinstance(f, _Finder) and f.name == name and f.then is then for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(name, then))
