"""The teachers of a search (evaluation.teacher.Teacher): the reference model's final hidden states on the calibration
pool, which every scoring draws from, and on the held-out text. Without a time limit each is built whole. Under one
(timing.py) the pool's is built a part at a time: the first batch prices a window, the pool is cut to the windows
that fit in TEACHER_SHARE of the time left (never below the fewest the stages and the tables need, and not with
--resume, whose states name their pool), and each part after is checked against that deadline; the held-out text is
cut to the windows whose teacher and scorings in every budget's report fit in TEXT_SHARE, or left out."""

from __future__ import annotations

import torch

from ..evaluation.teacher import Teacher
from .timing import TEACHER_SHARE, TEXT_SHARE, Schedule

REPORT_TEXT_MIXES = 3  # the held-out scorings a report makes at most: the knapsack, the evolved and the written mix


class JoinedTeacher:
    """Teachers of consecutive windows as one (Teacher's interface as fitness.py uses it); one copy of the head."""

    def __init__(self, parts: list[Teacher]) -> None:
        self.parts, self.head = parts, parts[0].head
        for part in parts[1:]:
            part.head = self.head
        self.starts = [0]
        for part in parts:
            self.starts.append(self.starts[-1] + part.windows_shape[0])
        self.windows_shape = (self.starts[-1], parts[0].windows_shape[1])

    def hidden(self, a: int, b: int) -> torch.Tensor:
        rows = []
        for part, s0, s1 in zip(self.parts, self.starts, self.starts[1:]):
            if a < s1 and b > s0:
                rows.append(part.hidden(max(a, s0) - s0, min(b, s1) - s0))
        return rows[0] if len(rows) == 1 else torch.cat(rows)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.parts[0].logits(hidden)

    def logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.parts[0].logprobs(hidden)

    def close(self) -> None:
        for part in self.parts:
            part.close()


def pool_teacher(
    model, windows: torch.Tensor, least: int, batch_size: int, progress: bool, schedule: Schedule, may_cut: bool
) -> tuple[Teacher | JoinedTeacher, torch.Tensor]:
    """(the teacher, the windows it holds): `windows` whole, or under a time limit the first of them that fit (module
    docstring); `schedule.pace` is set from its first batch."""
    t0 = schedule.now()
    if schedule.end is None:
        teacher = Teacher(model, windows, batch_size, progress=progress)
        schedule.seconds["teacher"] = schedule.now() - t0
        return teacher, windows
    n = windows.shape[0]
    parts = [Teacher(model, windows[:batch_size], batch_size)]
    done = parts[0].windows_shape[0]
    schedule.timed(schedule.now() - t0, done)
    deadline = schedule.deadline(schedule.at(TEACHER_SHARE))
    if may_cut:
        n = done + schedule.fitting(deadline.at - schedule.now(), schedule.pace, n - done, max(0, least - done))
    step = max(batch_size, schedule.fitting(schedule.piece(), schedule.pace, n) // batch_size * batch_size)
    while done < n:
        size = min(step, n - done)
        if may_cut and done >= least and schedule.agree(deadline.passes(schedule.price(size))):
            break
        t1 = schedule.now()
        parts.append(Teacher(model, windows[done : done + size], batch_size))
        schedule.timed(schedule.now() - t1, size)
        done += size
    schedule.seconds["teacher"] = schedule.now() - t0
    return JoinedTeacher(parts), windows[:done]


def text_teacher(
    model, text: torch.Tensor | None, batch_size: int, progress: bool, schedule: Schedule, budgets: int
) -> tuple[Teacher | None, torch.Tensor | None]:
    """(the held-out text's teacher, the windows it holds): the whole text, or under a time limit the windows that
    fit (module docstring); (None, None) without text or where none fits."""
    if text is None:
        return None, None
    if schedule.end is not None:
        per_window = schedule.pace * (1 + REPORT_TEXT_MIXES * budgets)
        text = text[: schedule.fitting(schedule.at(TEXT_SHARE) - schedule.now(), per_window, text.shape[0])]
        if text.shape[0] == 0:
            return None, None
    t0 = schedule.now()
    teacher = Teacher(model, text, batch_size, progress=progress)
    schedule.seconds["teacher"] += schedule.now() - t0
    return teacher, text
