"""(1+λ) EvoPress (Sieberling et al., 2024) with multi-stage selection, resumable (MatGPTQ paper §3.3, App. B.3).

One generation, from parent P:
1. λ distinct children of P (mutation.py; P itself and duplicates are rejected and redrawn, at most
   λ·MAX_DRAWS_PER_CHILD draws), their moves drawn by the start's loss table at `temperature` (mutation.Guide) when
   `evolve` is given one, uniformly (EvoPress' draws) when not or at temperature 0;
2. stage s = 1..S: draw ⌈tokens_s / (L − 1)⌉ calibration windows without replacement, score the survivors of the
   previous stage on them (fitness.py), keep the best `survivors_s` (ties: the earlier-made child). At the last stage
   P re-enters and competes on the same windows (elitism): the best of survivors and P is the next parent.
Fitness is the mean KL to the unquantized model; the last stage's score of the winner is the generation's record.

Reproducible and resumable: every random draw (windows, mutations) comes from one numpy PCG64 generator seeded with
`seed`; after each generation the state — parent, the generator's state, the history — is written atomically
(fsutil.atomic_output) next to the output. `resume` continues from it; since a generation depends only on the parent
and the generator state, the resumed run ends with the same mix as an uninterrupted one (tested). The state records
the settings it was made with; resuming with other settings is refused. `generations` is not among them, so a
finished run can be extended.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ..errors import UserError
from ..fsutil import atomic_output
from ..untrusted import read_json
from .fitness import Fitness, Mix
from .mutation import Guide, Levels, mutate
from .spread import from_rank0, is_writer, score_all
from .timing import Deadline, OutOfTime, past

STATE_FORMAT = "matgptq-search-state"
STATE_VERSION = 1
MAX_DRAWS_PER_CHILD = 20


@dataclass(frozen=True)
class Stage:
    tokens: int  # predicted positions scored per candidate
    survivors: int  # candidates kept for the next stage


def format_stages(stages: tuple[Stage, ...]) -> str:
    return ",".join(f"{s.tokens}:{s.survivors}" for s in stages)


def parse_stages(text: str) -> tuple[Stage, ...]:
    """'1024:4,4096:2,16384:1' → stages; tokens must grow, survivors shrink to 1."""
    try:
        stages = tuple(Stage(*(int(x) for x in part.split(":"))) for part in text.split(","))
    except (TypeError, ValueError):
        raise UserError(f"--stages takes TOKENS:SURVIVORS,… like 1024:4,4096:2,16384:1, got {text!r}") from None
    return stages


@dataclass(frozen=True)
class EvoConfig:
    # The defaults trade search quality for time: a generation scores the offspring on the first stage's tokens and
    # each stage's survivors on the next stage's tokens, `generations` times per budget; more generations, offspring
    # or tokens per stage make the selection less noisy and cost proportionally more forward passes
    generations: int = 25
    offspring: int = 16
    stages: tuple[Stage, ...] = (Stage(512, 4), Stage(2048, 2), Stage(4096, 1))
    seed: int = 0
    max_flips: int = 3
    prefix_cache: bool = True
    # how greedily the mutations follow the start's loss table (mutation.Guide); 0: uniform draws, as EvoPress
    temperature: float = 0.5

    def __post_init__(self) -> None:
        if self.generations < 0 or self.offspring < 1 or self.max_flips < 1:
            raise UserError("--generations must be ≥ 0 and --offspring ≥ 1")
        if not 0 <= self.temperature < float("inf"):
            raise UserError(f"--mutation-temperature must be a number ≥ 0, got {self.temperature:g}")
        if not self.stages:
            raise UserError("give at least one selection stage")
        tokens = [s.tokens for s in self.stages]
        survivors = [s.survivors for s in self.stages]
        if min(tokens) < 1 or tokens != sorted(tokens):
            raise UserError(f"--stages: token counts must be positive and non-decreasing, got {tokens}")
        if survivors[-1] != 1 or survivors != sorted(survivors, reverse=True) or survivors[0] > self.offspring:
            raise UserError(
                f"--stages: survivors must shrink from at most --offspring ({self.offspring}) to 1, got {survivors}"
            )

    def settings(self) -> dict:
        """What the search result depends on (everything but the number of generations)."""
        d = asdict(self)
        d.pop("generations")
        d.pop("prefix_cache")  # bit-identical scores with or without (fitness.py)
        return d


@dataclass
class EvoState:
    generation: int
    parent: Mix
    rng: dict
    start: Mix
    history: list[dict] = field(default_factory=list)  # per generation: kl, evaluations, tokens, seconds
    evaluations: int = 0
    tokens: int = 0
    seconds: float = 0.0
    refine: dict = field(default_factory=dict)  # what made `start` from the one-shot start (refine.Refined.record)


def write_state(path: Path, settings: dict, state: EvoState) -> None:
    body = {"format": STATE_FORMAT, "version": STATE_VERSION, "settings": settings, "state": asdict(state)}
    with atomic_output(path, overwrite=True, directory=False) as f:
        f.write_text(json.dumps(body))


def read_state(path: Path, settings: dict, n_layers: int) -> EvoState:
    """The state at `path`, made with exactly `settings`; anything else is one UserError."""
    fix = "delete it or run without --resume to start afresh"
    body = read_json(path, fix)
    if body.get("format") != STATE_FORMAT or body.get("version") != STATE_VERSION:
        raise UserError(f"{path} is not a matgptq search state (v{STATE_VERSION}); {fix}")
    if body.get("settings") != json.loads(json.dumps(settings)):
        theirs = body.get("settings") if isinstance(body.get("settings"), dict) else {}
        diff = sorted(
            k for k in set(theirs) | set(settings) if theirs.get(k) != json.loads(json.dumps(settings.get(k)))
        )
        raise UserError(
            f"{path} was made with other settings ({', '.join(diff[:4]) or 'unreadable'}); resume with the "
            f"same parent, calibration and search options, or {fix}"
        )
    try:
        s = body["state"]
        state = EvoState(
            int(s["generation"]),
            tuple(int(x) for x in s["parent"]),
            dict(s["rng"]),
            tuple(int(x) for x in s["start"]),
            list(s["history"]),
            int(s["evaluations"]),
            int(s["tokens"]),
            float(s["seconds"]),
            dict(s.get("refine", {})),
        )
        rng = np.random.Generator(np.random.PCG64())
        rng.bit_generator.state = state.rng
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{path} is damaged (its state record is incomplete); {fix}") from None
    if len(state.parent) != n_layers or len(state.start) != n_layers or state.generation < 0:
        raise UserError(f"{path} is damaged (its mix has {len(state.parent)} layers, the parent {n_layers}); {fix}")
    return state


def window_count(n_windows: int, seqlen: int, tokens: int) -> int:
    """Windows of `seqlen` (seqlen − 1 scored tokens each) that hold `tokens` scored tokens, at most the pool's
    `n_windows`."""
    return min(n_windows, math.ceil(tokens / (seqlen - 1)))


def draw_windows(rng: np.random.Generator, n_windows: int, seqlen: int, tokens: int) -> tuple[int, ...]:
    count = window_count(n_windows, seqlen, tokens)
    return tuple(sorted(int(i) for i in rng.choice(n_windows, size=count, replace=False)))


def stage_pools(config: EvoConfig) -> list[int]:
    """Candidates each stage of a generation scores: the offspring at the first, then the survivors of the stage
    before, the parent competing in the last (their sum: a generation's evaluations)."""
    pools = [config.offspring, *(s.survivors for s in config.stages[:-1])]
    pools[-1] += 1
    return pools


def generation_windows(config: EvoConfig, n_windows: int, seqlen: int) -> int:
    """Window scorings one generation makes at most: each stage's pool (stage_pools) on that stage's windows."""
    return sum(p * window_count(n_windows, seqlen, s.tokens) for p, s in zip(stage_pools(config), config.stages))


def guide_of(table: list[list[float]] | None, config: EvoConfig) -> Guide | None:
    """The mutations' guide: `table` at the config's temperature; None (uniform draws) without one or at 0."""
    return None if table is None or config.temperature == 0 else Guide(table, config.temperature)


def offspring(
    parent: Levels,
    costs: list[list[int]],
    limit: int,
    rng: np.random.Generator,
    config: EvoConfig,
    guide: Guide | None = None,
) -> list[Levels]:
    """Up to `config.offspring` distinct children of `parent` within the budget (MAX_DRAWS_PER_CHILD draws each)."""
    children: list[Levels] = []
    for _ in range(config.offspring * MAX_DRAWS_PER_CHILD):
        if len(children) == config.offspring:
            break
        child = mutate(parent, costs, limit, rng, config.max_flips, guide)
        if child is None:
            break
        if child != parent and child not in children:
            children.append(child)
    return children


def _initial_state(
    start: Mix, config: EvoConfig, state_path: Path, settings: dict, resume: bool, refined: dict | None
) -> EvoState:
    """The state to continue from: the one on disk when resuming, else a fresh one at `start`; under torchrun every
    rank continues from rank 0's (allocation/spread.py)."""
    state = None
    if is_writer():
        if resume and state_path.exists():
            state = read_state(state_path, settings, len(start))
        else:
            rng0 = np.random.Generator(np.random.PCG64(config.seed))
            state = EvoState(0, tuple(start), rng0.bit_generator.state, tuple(start), refine=dict(refined or {}))
    return from_rank0(state)


def _generation(
    fitness: Fitness,
    parent: Mix,
    costs: list[list[int]],
    limit: int,
    rng: np.random.Generator,
    config: EvoConfig,
    guide: Guide | None,
    weights: int | None,
    bar,
    stop: Deadline | None,
    convert,
) -> tuple[list[Mix], float | None]:
    """One generation from `parent` (module docstring): (the survivors of the last stage, best first; its best KL)."""
    to_levels, to_mix = convert
    n_windows, seqlen = fitness.windows.shape
    survivors = [to_mix(c) for c in offspring(to_levels(parent), costs, limit, rng, config, guide)]
    best_kl = None
    for s, stage in enumerate(config.stages):
        windows = draw_windows(rng, n_windows, seqlen, stage.tokens)
        last = s == len(config.stages) - 1
        pool = survivors + ([parent] if last else [])
        if not pool:
            break
        cache = fitness.prefix_cache(parent, windows) if config.prefix_cache else None
        scores = score_all(fitness, pool, windows, cache, deadline=stop)
        order = sorted(range(len(pool)), key=lambda i: (scores[i], i))[: stage.survivors]
        survivors, best_kl = [pool[i] for i in order], scores[order[0]]
        shown = {"stage": f"{s + 1}/{len(config.stages)}", "kl": f"{best_kl:.4g}"}
        if weights:
            shown["bits"] = f"{sum(costs[i][lv] for i, lv in enumerate(to_levels(survivors[0]))) / weights:.4f}"
        bar.set_postfix(shown)
    return survivors, best_kl


def _advance(state: EvoState, survivors, best_kl: float, evaluations: int, tokens: int, seconds: float, rng) -> None:
    """`state` one generation on: its best survivor the next parent (the parent kept where none survived), the
    generation's evaluations, tokens and seconds counted, the generator's state kept, a line of history."""
    state.parent = tuple(survivors[0]) if survivors else state.parent
    state.generation += 1
    state.evaluations += evaluations
    state.tokens += tokens
    state.seconds += seconds
    state.rng = rng.bit_generator.state
    state.history.append(
        {
            "generation": state.generation,
            "kl": best_kl,
            "evaluations": state.evaluations,
            "tokens": state.tokens,
            "seconds": round(state.seconds, 3),
            "parent": list(state.parent),
        }
    )


def evolve(
    fitness: Fitness,
    levels: tuple[int, ...],
    costs: list[list[int]],
    limit: int,
    start: Mix,
    config: EvoConfig,
    state_path: Path,
    settings: dict,
    resume: bool = False,
    progress: bool = False,
    stop_after: int | None = None,
    weights: int | None = None,
    deadline: float | None = None,
    refined: dict | None = None,
    table: list[list[float]] | None = None,
    per_window: float = 0.0,
    clock: Callable[[], float] | None = None,
) -> EvoState:
    """Run (or continue) the search from `start` to `config.generations` (`refined`: how `start` was made, kept in
    the state; `table`: the loss table v[l][i] over `levels` that guides the mutations, guide_of); `stop_after` ends
    early after that generation (as a kill would, for tests). `weights` (Σ N·K): the progress bar then shows the
    parent's bits per weight. `deadline` (on `clock`, default time.perf_counter): no generation starts that would end
    after it, judged by the longer of the mean time of this call's generations so far and the last one's, the first
    by `per_window` seconds per window scoring (`generation_windows` of them; a full float32 pass, an overestimate of
    a cached one, as refine.py's first step; 0: the first starts if the deadline has not passed); a generation whose
    next scoring would end past it is dropped (the state stays that of the one before)."""
    index = {r: i for i, r in enumerate(levels)}
    to_levels = lambda mix: tuple(index[r] for r in mix)  # noqa: E731
    to_mix = lambda lv: tuple(levels[i] for i in lv)  # noqa: E731
    state = _initial_state(start, config, state_path, settings, resume, refined)
    rng = np.random.Generator(np.random.PCG64())
    rng.bit_generator.state = state.rng
    n_windows, seqlen = fitness.windows.shape
    bar = tqdm(
        total=config.generations,
        initial=min(state.generation, config.generations),
        desc="search",
        unit="gen",
        disable=not progress,
        leave=False,
    )
    clock = clock or time.perf_counter
    began, done, guide, last = clock(), 0, guide_of(table, config), 0.0
    first = per_window * generation_windows(config, n_windows, seqlen)
    stop = None if deadline is None else Deadline(deadline, clock)
    while state.generation < config.generations:
        if deadline is not None and from_rank0(past(deadline, began, done, first, last, clock())):
            break  # every rank stops together
        t0, evals0, tokens0 = clock(), fitness.evaluations, fitness.tokens
        try:
            survivors, best_kl = _generation(
                fitness, state.parent, costs, limit, rng, config, guide, weights, bar, stop, (to_levels, to_mix)
            )
        except OutOfTime:
            break
        last = clock() - t0
        _advance(state, survivors, best_kl, fitness.evaluations - evals0, fitness.tokens - tokens0, last, rng)
        if is_writer():
            write_state(state_path, settings, state)
        bar.update(1)
        done += 1
        if stop_after is not None and state.generation >= stop_after:
            break
    bar.close()
    return state
