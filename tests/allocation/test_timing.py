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
    code = (
        "import time; time.sleep(0.5); from matgptq.allocation.timing import process_seconds; print(process_seconds())"
    )
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - t0
    age = float(out)
    assert 0.5 <= age <= wall + TICK


def test_process_seconds_of_this_process_grows_with_the_wall_clock():
    a = process_seconds()
    time.sleep(0.2)
    assert 0.2 - TICK <= process_seconds() - a <= 0.2 + 1.0  # 1 s of slack: only the lower side is the claim


def test_the_next_step_is_priced_at_the_longer_of_the_mean_and_the_last():
    """A machine that slows down shows in the last step before the mean: three steps of 1 s then one of 10 s (13 s
    since `began`) price the next at 10 s, not the mean's 3.25 s; before any, at `first`."""
    from matgptq.allocation.timing import past

    assert not past(deadline=20.0, began=0.0, done=4, last=1.0, now=13.0)  # the mean: 13 + 3.25 ≤ 20
    assert past(deadline=20.0, began=0.0, done=4, last=10.0, now=13.0)  # the last: 13 + 10 > 20
    assert past(deadline=5.0, began=0.0, done=0, first=5.0, now=0.0) and not past(5.0, 0.0, 0, 4.9, now=0.0)


def test_a_schedule_shares_the_time_left_on_its_own_clock():
    """On a clock set by hand: a two-minute limit of which 30 s were spent before, the shares of what is left, and
    the windows a pool scoring fits, cut to whole batches of chunk (oracle: the arithmetic spelled out)."""
    from matgptq.allocation.request import TimeLimit
    from matgptq.allocation.timing import Schedule

    now = [100.0]
    schedule = Schedule(TimeLimit(2.0, spent=30.0, clock=lambda: now[0]))
    assert schedule.began == 70.0 and schedule.end == 190.0 and schedule.left() == 90.0
    assert schedule.at(1 / 3) == 130.0 and schedule.at(0.5, keep=10.0) == 140.0
    schedule.timed(2.0, 4)  # 0.5 s a window
    assert schedule.fitting(10.0, schedule.pace, 100) == 20 and schedule.fitting(10.0, schedule.pace, 5) == 5
    # 2 one-shot mixes and 2 report mixes on n windows at 0.5 s, 10 s kept: (190 − 10 − 100) / 2 = 40 windows
    n, box = schedule.choice(pool=100, mixes=2, batch=8, end=190.0, keep=10.0, report=2)
    assert n == 40 and box.deadline.at == 190.0 - 10.0 - 2 * 40 * 0.5 and box.chunk == 8  # a piece: 0.6 s
    assert Schedule(None).choice(100, 2, 8, None, 0.0, 2) == (100, None) and Schedule(None).end is None
