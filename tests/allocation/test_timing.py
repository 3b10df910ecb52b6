"""The search's clock: the seconds a process has run, read from /proc, against the wall time its parent measured."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from matgptq.allocation.timing import process_seconds

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads Linux's /proc")

TICK = 0.01  # /proc/self/stat's start time is in clock ticks (100 per second on Linux): the reading's resolution


def test_process_seconds_counts_from_the_process_start():
    """A child sleeps 0.5 s after its imports, then reads its own age: at least the sleep, at most the wall time its
    parent saw from before the spawn to after the exit (plus one tick of rounding)."""
    code = "import time; time.sleep(0.5); from matgptq.allocation.timing import process_seconds; print(process_seconds())"
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - t0
    age = float(out)
    assert 0.5 <= age <= wall + TICK


def test_process_seconds_of_this_process_grows_with_the_wall_clock():
    a = process_seconds()
    time.sleep(0.2)
    assert 0.2 - TICK <= process_seconds() - a <= 0.2 + 1.0  # 1 s of slack: only the lower side is the claim
