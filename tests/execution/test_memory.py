"""execution/memory.py: after release_free_memory, freed tensors under live ones leave the process's resident memory;
without it, glibc keeps them. Each case runs in its own process (a fresh heap)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc only"
)

# The pattern of a block's work: one big temporary (freed: glibc's threshold rises to its size), then many tensors of
# a few MiB, each followed by a small long-lived one that pins the heap above it; all the big ones are freed.
# Prints the anonymous resident memory (MiB) the frees gave back.
CHILD = """
import sys, torch
from matgptq.execution import release_free_memory
def anon():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("RssAnon")) / 1024
t = torch.ones(24 << 18); del t          # 24 MiB (under glibc's 32 MiB cap), mmapped and freed
big, pins = [], []
for _ in range(40):
    big.append(torch.ones(4 << 18))      # 4 MiB each, 160 MiB in all, touched
    pins.append(torch.ones(16 << 10))    # 64 KiB: from the heap top, above the big one
before = anon()
big.clear()
if sys.argv[1] == "release":
    assert release_free_memory()
print(round(before - anon()))
"""


def _returned(mode: str) -> int:
    r = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
    return int(r.stdout.strip())


def test_freed_tensors_leave_resident_memory_only_when_released():
    # 160 MiB were freed in the heap, each 4 MiB under a live 64 KiB tensor: glibc keeps them (nothing above them is
    # free, so nothing is trimmed from the top); malloc_trim returns their whole pages. 120 / 40 MiB leave room for
    # the allocator's and the interpreter's own small movements.
    assert _returned("release") >= 120
    assert _returned("keep") <= 40
