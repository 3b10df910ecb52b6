"""The clock of a search under `--time-limit` (request.TimeLimit): the run ends by the limit, and every budget with a
mix file.

Every step is priced before it starts, from the latest measured time of a window scoring (`Schedule.pace`), and cut
to fit; the long ones are made of pieces checked against their deadline as they go (a candidate's scoring, a chunk
of a pool scoring, a part of the teacher), each piece priced at the last one's time, so a machine that slows down
mid-run costs at most one piece past a deadline. The shares, of the time left when the step begins:

- the calibration pool's teacher: at most TEACHER_SHARE; priced by its first batch, the pool cut to the windows that
  fit (never below what the stages and the tables need; not with --resume, whose states name their pool);
- the held-out text: its teacher and its scorings in every report, at most TEXT_SHARE; cut by windows, or left out;
- the tables: the lowest width of the start's table until CLOSING_SHARE of the limit is left (without it every budget
  writes its uniform slice); each baseline's table and each wider width while every budget keeps the price of its
  choice and report on the pool, or for TABLES_SHARE, whichever is later;
- each budget: an equal share; its choice of start on the pool (on the windows that fit with its report), its
  refinement steps and generations (each priced at the longer of their mean and the last), its report on the same
  windows and the held-out text, and its mix file by the share's end.
What a budget's file says the limit cut is in its summary (`cut`). Without a limit nothing is priced or cut.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

TEACHER_SHARE = 1 / 4  # the pool's teacher is one forward pass a window: a long one leaves the search nothing
TEXT_SHARE = 1 / 10  # the held-out scores inform; they never decide
TABLES_SHARE = 1 / 2  # the wider widths are worth the budgets' choices on fewer windows, up to half the time
CLOSING_SHARE = 1 / 50  # of the limit: every budget's knapsack and mix file after the lowest width
PIECE_SHARE = 1 / 200  # of the limit: the longest piece a chunked step makes between two looks at the clock


class OutOfTime(Exception):
    """The next piece of a step would end past its deadline; the step keeps what it finished."""


@dataclass(frozen=True)
class Deadline:
    """A point on `clock` (seconds) that work must end by."""

    at: float
    clock: Callable[[], float] = time.perf_counter

    def passes(self, seconds: float = 0.0) -> bool:
        """Would `seconds` more work from now end past it? (Each process's own clock: callers under torchrun take
        rank 0's answer, spread.from_rank0.)"""
        return self.clock() + seconds > self.at


def past(
    deadline: float, began: float, done: int, first: float = 0.0, last: float = 0.0, now: float | None = None
) -> bool:
    """Would the next step (a generation, a refinement step) end after `deadline`? (`done` steps since `began`,
    priced at the longer of their mean and the `last` one's seconds; before the first, `first` seconds.)"""
    now = time.perf_counter() if now is None else now
    if done == 0:
        return now + first >= deadline
    return now + max((now - began) / done, last) > deadline


class Timebox(NamedTuple):
    """A pool scoring under a time limit: its deadline, the windows it scores at a time (every mix on a chunk before
    the next chunk), and the price of one window's scoring (`Schedule.pace`)."""

    deadline: Deadline
    chunk: int
    pace: float


class Schedule:
    """The run's time: when it began and must end (None without a limit), the measured seconds of the shared steps,
    and `pace`, the latest measured seconds of a full float32 window scoring (the teacher's forward first, then each
    scoring on the pool). `agree` makes every process take rank 0's decision (spread.from_rank0)."""

    def __init__(self, limit, agree: Callable = lambda value: value) -> None:
        self.agree = agree
        self.clock = time.perf_counter if limit is None else limit.clock
        self.began = self.clock() - (0.0 if limit is None else limit.spent)
        self.limit = None if limit is None else 60 * limit.minutes
        self.end = None if limit is None else self.began + self.limit
        self.pace = 0.0
        self.seconds = {"teacher": 0.0, "tables": 0.0}

    def now(self) -> float:
        return self.clock()

    def left(self) -> float:
        return math.inf if self.end is None else self.end - self.clock()

    def at(self, share: float, keep: float = 0.0) -> float | None:
        """The time `share` of what is left after `keep` seconds from now (None without a limit)."""
        return None if self.end is None else self.clock() + share * max(0.0, self.left() - keep)

    def deadline(self, at: float | None) -> Deadline | None:
        return None if at is None else Deadline(at, self.clock)

    def closing(self) -> float:
        """Seconds kept for the budgets' last steps while the lowest width of the table is scored."""
        return 0.0 if self.limit is None else CLOSING_SHARE * self.limit

    def piece(self) -> float:
        """The longest a piece of chunked work should take (inf without a limit)."""
        return math.inf if self.limit is None else PIECE_SHARE * self.limit

    def price(self, windows: int) -> float:
        return self.pace * windows

    def timed(self, seconds: float, windows: int) -> None:
        """Record that `windows` full window scorings took `seconds`."""
        if windows > 0:
            self.pace = seconds / windows

    def fitting(self, seconds: float, per_window: float, most: int, least: int = 0) -> int:
        """The most windows, between `least` and `most`, whose scorings at `per_window` each fit in `seconds` (rank
        0's count)."""
        if per_window <= 0 or math.isinf(seconds):
            return most
        return self.agree(max(least, min(most, int(max(0.0, seconds) / per_window))))

    def choice(
        self, pool: int, mixes: int, batch: int, end: float | None, keep: float, report: int
    ) -> tuple[int, Timebox | None]:
        """(the pool windows a budget's `mixes` one-shot allocations are scored on, the box of that scoring): every
        window without a limit; else as many as leave time by `end` for the report's `report` more mixes on them and
        `keep` seconds besides, scored a chunk of whole batches at a time, each chunk about a `piece`."""
        if end is None:
            return pool, None
        n = self.fitting(end - keep - self.clock(), self.pace * (mixes + report), pool)
        chunk = max(batch, self.fitting(self.piece(), self.pace * mixes, n) // batch * batch)
        return n, Timebox(Deadline(end - keep - self.price(report * n), self.clock), chunk, self.pace)


def process_seconds() -> float:
    """Wall seconds since this process started (Linux: /proc/self/stat's start time against /proc/uptime, to the
    clock tick; 0.0 where that is not readable), so that `matgptq search --time-limit` counts the interpreter, the
    imports and the reading of the inputs too."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0
