"""Freed memory goes back to the operating system (glibc's malloc), so a long CPU run's peak RSS is its live data.

glibc serves an allocation of at least M_MMAP_THRESHOLD bytes with its own mmap, unmapped on free; smaller ones come
from the heap, whose freed pages stay with the process while anything above them is live. The threshold starts at
128 KiB and rises to the size of every larger mmapped block freed (up to 32 MiB), so after the first big temporary
tensor, the many 1-32 MiB tensors of a block's forward, Hessians and solver land in the heap and their pages are
kept: quantizing SmolLM2-135M in float32 held ~1.25 GB of anonymous memory for ~0.3 GB of live tensors
(docs/results/bench_pipeline.md). Fixing the threshold at 1 MiB (which also stops its rise) maps every tensor of
1 MiB or more on its own, returning it on free: the same run then holds ~0.55-0.95 GB. The cost is a page fault per
page of a new large tensor, a few percent of CPU time on that run.

mallopt is process-wide, so only programs call this (the command line), never the library on import.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

M_MMAP_THRESHOLD = -3  # glibc malloc.h
MMAP_THRESHOLD = 1 << 20


def return_freed_memory(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes (module docstring); False where the C library is not glibc or
    refuses (nothing changes then)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):
        return False
