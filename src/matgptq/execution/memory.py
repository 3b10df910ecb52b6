"""Freed memory handed back to the operating system between a quantization's steps (glibc's malloc_trim).

glibc serves allocations below its mmap threshold from the heap, and that threshold rises to the size of every larger
block freed (up to 32 MiB), so after the first big temporary, the many 1-32 MiB tensors of a block's forwards,
Hessians and solver come from the heap; their freed pages stay with the process while anything above them is live.
Quantizing SmolLM2-135M in float32 thus held more than twice its live tensors in resident memory. `malloc_trim(0)`
returns every whole free page of every arena (madvise), so calling it after each group of layers bounds what one group
leaves behind, at no measurable CPU time. Fixing the threshold low instead (mallopt, 1 MiB) returned more but made every
new tensor fault in fresh pages, far slower (docs/decisions/code-constants.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
from functools import cache


@cache
def _libc():
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def release_free_memory() -> bool:
    """Hand the process's free heap pages back to the OS (module docstring); False where the C library is not glibc."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
