"""Which mix a budget starts its search from and which it writes: the lowest calibration KL among its candidates,
unless that is only noise.

The candidates (the evolved mix and every one-shot allocation) are scored on the whole calibration pool, and the
lowest wins, with one exception. The budget's uniform slice (the widest uniform mix among the candidates) is what a
user gets without a search; a mix that scores lower on a few thousand calibration tokens may only fit them (the
sensitivity windows are part of the pool, so an allocation made from them is favoured there). So the lowest
candidate replaces the uniform slice only when it is shown better window by window: with d_w = F(lowest; w) −
F(uniform; w) on each of the pool's n windows (the pool's scoring gives them: no extra pass),

    mean(d) + MARGIN · sd(d) / √n < 0,

a one-sided paired test. MARGIN = 2 is at least the one-sided 0.95 quantile of Student's t for n ≥ 7 windows
(t₆ = 1.94; the search's default pool is 65 windows, the 10-minute recipe's 8), so a mix that is not better on
average passes it in at most about one pool in twenty. With fewer than 2 windows there is no spread, and the uniform
slice stays.
"""

from __future__ import annotations

import math
import statistics
from typing import NamedTuple

from ..evaluation.perplexity import score
from .budget import BudgetKind, CostModel
from .fitness import Fitness, Mix
from .spread import from_rank0, score_windows
from .timing import OutOfTime, Timebox

MARGIN = 2.0


class Gap(NamedTuple):
    """The lowest candidate against the uniform slice, window by window: mean and standard error of d_w."""

    against: str
    mean: float
    se: float
    windows: int

    @property
    def shown(self) -> bool:
        return self.windows > 1 and self.mean + MARGIN * self.se < 0


def paired_gap(lowest: list[float], uniform: list[float], against: str) -> Gap:
    """`Gap` of the per-window scores `lowest` against `uniform` (the same windows, in the same order)."""
    d = [a - b for a, b in zip(lowest, uniform, strict=True)]
    se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else math.inf
    return Gap(against, statistics.fmean(d), se, len(d))


def choose(candidates: dict[str, Mix], per_window: dict[Mix, list[float]]) -> tuple[str, Gap | None]:
    """The label of the written mix among `candidates` (each scored per window in `per_window`; ties go to the
    first), and the paired test that decided against the uniform slice (None where the lowest is the uniform slice
    or there is none)."""
    kl = {m: statistics.fmean(v) for m, v in per_window.items()}  # as Fitness.kl averages them
    lowest = min(candidates, key=lambda k: kl[candidates[k]])
    uniform = [k for k, m in candidates.items() if len(set(m)) == 1]
    if not uniform:
        return lowest, None
    slice_ = max(uniform, key=lambda k: candidates[k][0])  # every candidate fits: the widest is the budget's slice
    if candidates[lowest] == candidates[slice_]:
        return lowest, None
    gap = paired_gap(per_window[candidates[lowest]], per_window[candidates[slice_]], slice_)
    return (lowest if gap.shown else slice_), gap


def pool_scores(
    fitness: Fitness,
    mixes,
    windows: tuple[int, ...],
    known: dict[Mix, list[float]] | None = None,
    box: Timebox | None = None,
) -> dict[Mix, list[float]]:
    """{mix: its float32 KL on each of `windows`} for every distinct mix of `mixes`, those in `known` (scored on the
    same windows) not scored again. With a `box`, chunk by chunk: a chunk that would end past the deadline is left
    unfinished, and every mix, those of `known` too, holds the scores of the chunks before it (maybe none)."""
    out = dict(known or {})
    todo = [m for m in dict.fromkeys(mixes) if m not in out]
    if box is None or not todo:
        with fitness.exact():
            out.update(zip(todo, score_windows(fitness, todo, windows)))
        return out
    rows: list[list[float]] = [[] for _ in todo]
    with fitness.exact():
        for c0 in range(0, len(windows), box.chunk):
            part = windows[c0 : c0 + box.chunk]
            try:
                scored = score_windows(fitness, todo, part, deadline=box.deadline, first=box.pace * len(part))
            except OutOfTime:
                break
            for row, more in zip(rows, scored):
                row.extend(more)
    done = len(rows[0])
    return {**{m: v[:done] for m, v in out.items()}, **dict(zip(todo, rows))}


def report(
    fitness: Fitness,
    cost_model: CostModel,
    kind: BudgetKind,
    label: str,
    mixes: dict[str, Mix],
    state,
    start_kind: str,
    all_windows: tuple[int, ...],
    held_out,
    batch_size: int,
    known: dict[Mix, list[float]] | None = None,
    box: Timebox | None = None,
) -> tuple[dict, Mix]:
    """A budget's summary row and written mix. Score the evolved parent (`state.parent`), its start (`state.start`:
    the one-shot start as refined, refine.py) and every one-shot allocation on the whole calibration pool (`known`:
    the scores `first_parent` made of them there, not made again), and choose the budget's output (`choose`: the
    lowest, unless the uniform slice is not shown worse): the written mix is never worse there than a baseline the
    search could have returned, and not replaced by a mix that only fits the pool. The stages score each generation on a
    few thousand fresh tokens; at budgets where candidates differ by less than that sample's noise, the generations
    can drift to a mix that is worse on the whole pool than where they began. The choice is made on calibration
    tokens only; the held-out `--text` scores are reported for the knapsack, the evolved and the written mix. With a
    `box` (a time limit), the choice is made on the windows every candidate was scored on by its deadline; where
    none was, the evolved mix is written unscored (its KLs None); a held-out scoring that would end past the
    deadline is left out, and `cut` says so."""
    text = held_out[0]
    dp_mix = mixes["knapsack"] if "knapsack" in mixes else next(iter(mixes.values()))
    candidates = {"search": state.parent, "refined": state.start, **mixes}  # ties go to the first
    per_window = pool_scores(fitness, candidates.values(), all_windows, known, box)
    kl_of = {m: statistics.fmean(v) for m, v in per_window.items() if v}  # = Fitness.kl
    chosen, gap = choose(candidates, per_window) if kl_of else ("search", None)
    mix = candidates[chosen]
    row = {
        "budget": label,
        "kind": kind.value,
        "code_bits": cost_model.average(mix, BudgetKind.CODE),
        "storage_bits": cost_model.average(mix, BudgetKind.STORAGE),
        "start": start_kind,
        "dp_kl": kl_of.get(dp_mix),
        "start_kl": kl_of.get(state.start),
        "search_kl": kl_of.get(state.parent),
        "search_code_bits": cost_model.average(state.parent, BudgetKind.CODE),
        "search_storage_bits": cost_model.average(state.parent, BudgetKind.STORAGE),
        "baseline_kl": {k: kl_of.get(m) for k, m in mixes.items()},
        "chosen": chosen,
        "kl": kl_of.get(mix),
        "uniform_gap": None if gap is None else gap._asdict() | {"shown": gap.shown},
        "choice_windows": len(next(iter(per_window.values()))),
        "cut": [],
    }
    if kind is BudgetKind.GGUF:
        row["gguf_bits"] = cost_model.average(mix, BudgetKind.GGUF)
    if text is not None:
        _held_out(
            fitness, row, {"dp_text": dp_mix, "search_text": state.parent, "text": mix}, held_out, batch_size, box
        )
    return row, mix


def _held_out(
    fitness: Fitness, row: dict, named: dict[str, Mix], held_out, batch_size: int, box: Timebox | None
) -> None:
    """`row`'s held-out perplexity and KL of each named mix (one scoring per distinct mix), those that would end past
    the box's deadline left out."""
    text, text_teacher = held_out
    text_of = {}
    for m in dict.fromkeys(named.values()):
        if box is not None and from_rank0(box.deadline.passes(box.pace * text.shape[0])):
            row["cut"].append("held-out text")
            break
        fitness.apply(m)
        text_of[m] = score(fitness.model, text, text_teacher, batch_size)
    for key, m in named.items():
        if m in text_of:
            row[f"{key}_ppl"], row[f"{key}_kl"] = text_of[m].ppl, text_of[m].kl


def first_parent(
    fitness: Fitness, mixes: dict[str, Mix], windows: tuple[int, ...], box: Timebox | None = None
) -> tuple[Mix, str, dict[Mix, list[float]]]:
    """The search's first parent: the one-shot allocation with the lowest float32 KL on `windows` (the whole
    calibration pool), the knapsack mix on a tie (an additive model can misjudge a network far from linear; the search
    then never starts behind a plain slice or another allocator); and those per-window scores, which the report reuses.
    The pool and not the sensitivity windows alone: one window can pick a start that is worse on every other, on the
    pool and on held-out text (docs/decisions/code-constants.md). With a `box`, on the windows scored by its deadline
    (pool_scores); where there are none, the first mix."""
    per_window = pool_scores(fitness, mixes.values(), windows, box=box)
    if not next(iter(per_window.values())):
        return next(iter(mixes.values())), next(iter(mixes)), {}
    kl_of = {m: statistics.fmean(v) for m, v in per_window.items()}
    label = min(mixes, key=lambda k: kl_of[mixes[k]])
    return mixes[label], label, per_window
