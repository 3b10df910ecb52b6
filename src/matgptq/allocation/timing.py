"""The clock of a time-limited search (runner.run_search's `time_limit`): how the time left is shared out over the
budgets, and what a budget's report will cost, from the latest measured time per scored window."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Clock:
    """The run's time: when it began, the shared work's seconds (teacher, tables), and the latest measured time of
    one full float32 scoring of one calibration window (the report's unit of cost). That pace is taken from scorings
    of the whole pool, as the report scores: the tables' timing, then each budget's choice of its start (its one-shot
    allocations on the pool) and each report (every mix file records its report's seconds and the guess)."""

    began: float
    teacher: float = 0.0
    tables: float = 0.0
    tables_reused: bool = False  # the tables were read back from the run before (--resume), not scored
    per_window: float | None = None

    def budget_end(self, minutes: float | None, budgets_left: int) -> float | None:
        """When the next budget must be done: an equal share of the time left (None without a limit)."""
        if minutes is None:
            return None
        now = time.perf_counter()
        return now + max(0.0, self.began + 60 * minutes - now) / budgets_left


def past(deadline: float, began: float, done: int, first: float = 0.0) -> bool:
    """Would the next step (a generation, a refinement step) end after `deadline`? (`done` steps since `began`, their
    mean as the guess; before the first, `first` seconds.)"""
    now = time.perf_counter()
    if done == 0:
        return now + first >= deadline
    return now + (now - began) / done > deadline


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


def text_windows(held_out) -> int:
    """Window scorings the report spends on the held-out text (up to three mixes: knapsack, evolved, written)."""
    text, _ = held_out
    return 0 if text is None else 3 * text.shape[0]


REPORT_MIXES = 2  # the mixes a budget's report scores on the pool: the evolved one and the refined start (choice.py)


def report_guess(clock: Clock, mixes: int, windows: tuple[int, ...], held_out) -> float:
    """Seconds the report of `mixes` mixes will take, from the latest measured time per window (0 before any)."""
    return (clock.per_window or 0.0) * (mixes * len(windows) + text_windows(held_out))


def tables_deadline(clock: Clock, minutes: float | None, fitness, top: int, mixes: int, budgets: int,
                    held_out) -> float | None:  # fmt: skip
    """When the measured additive table (`--sensitivity full`) must stop adding widths so that each budget's choice
    of its start (its `mixes` one-shot allocations on the whole pool) and its report (REPORT_MIXES more there) still
    fit in the limit (None without one). Their price comes from one float32 scoring of the top mix on the whole pool,
    timed here after the pool's teacher terms are made (the reports reuse them); it sets `clock.per_window`."""
    if minutes is None:
        return None
    windows = tuple(range(fitness.windows.shape[0]))
    if fitness.head.softcap is None:  # soft-capped heads are scored from both distributions, without terms
        for w in windows:
            fitness.window_terms(w)
    t0 = time.perf_counter()
    with fitness.exact():
        fitness.kl(fitness.uniform(top), windows)  # on every rank: each times its own pace
    clock.per_window = (time.perf_counter() - t0) / len(windows)
    start = clock.per_window * mixes * len(windows)
    return clock.began + 60 * minutes - budgets * (start + report_guess(clock, REPORT_MIXES, windows, held_out))
