"""What `matgptq search` is asked to do (`SearchRequest`: the budgets, the files, and one typed group per step) and
where its files go; the checks that need nothing loaded.

`SearchRequest.of` takes the options flat, by the names the Python API has always taken (`calib_range`, `seqlen`,
`sensitivity_tokens`, `baselines`, `text`, `time_limit`, ...), and sorts them into the groups."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import torch

from ..errors import UserError
from ..execution import native_bfloat16
from ..formats import is_checkpoint
from .allocators import Allocator
from .budget import BudgetKind
from .evopress import EvoConfig
from .plot import require_matplotlib
from .refine import RefineConfig
from .sensitivity import DEFAULT_TOKENS, Sensitivity


class ScoreDtype(str, Enum):
    """Precision of the candidates' forward passes during the search (fitness.py); reported scores are float32."""

    AUTO = "auto"  # bfloat16 where the device has it natively (devices.native_bfloat16), float32 elsewhere
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"

    def resolve(self, device: torch.device) -> torch.dtype:
        if self is ScoreDtype.AUTO:
            return torch.bfloat16 if native_bfloat16(device) else torch.float32
        if self is ScoreDtype.BFLOAT16 and device.type == "cuda" and not native_bfloat16(device):
            raise UserError(f"--score-dtype bfloat16: {device} has no bfloat16; use --score-dtype float32 or auto")
        return torch.bfloat16 if self is ScoreDtype.BFLOAT16 else torch.float32

    def tables(self, scored: torch.dtype, time_limited: bool) -> torch.dtype:
        """Precision of the one-shot tables (allocators.tables) given `scored`, what `resolve` gave the candidates:
        AUTO scores them in float32 unless the run has a time limit. bfloat16's rounding of the forward pass moves a
        one-layer KL increment by about as much as the increment itself at the wide widths
        (docs/decisions/code-constants.md), so a bfloat16 table ranks those widths on rounding:
        float32 tables' knapsack mixes had a lower held-out KL at 3, 4 and 6 bits, the same at 2.5-3.5, for more of
        the table's seconds (docs/guide/search.md, --score-dtype; its study: docs/results/README.md). Without a time
        limit the tables are a small part of the run (minutes against the evolution's hours); under one they are most
        of it, and the candidates' precision stays theirs. An explicit dtype is used as given."""
        return torch.float32 if self is ScoreDtype.AUTO and not time_limited else scored


@dataclass(frozen=True)
class PoolConfig:
    """The calibration windows every scoring draws from: `--calib-range`, `--seqlen`, `--calib-tokens`. A pool no
    larger than the last stage lets every generation score the same tokens, and the search then fits them."""

    range: tuple[float, float] = (0.0, 1.0)
    seqlen: int = 256
    tokens: int = 16384
    batch_size: int = 8


@dataclass(frozen=True)
class StartConfig:
    """The one-shot tables and allocations the search starts from (sensitivity.py, allocators.py)."""

    sensitivity: Sensitivity = Sensitivity.FULL
    tokens: int | None = None  # scored tokens per measurement; None: the mode's default (DEFAULT_TOKENS)
    top: int | None = None  # FULL: the highest level scored, the wider ones extrapolated; None: every one
    wide: tuple[int, int] | None = None  # FULL: (level, tokens), the levels from `level` up on `tokens` tokens
    # one-shot allocations that compete with the knapsack start as the first parent and with the evolved mix for the
    # written one; none unless asked for (each costs its table's scorings and its scoring on the pool every budget)
    baselines: tuple[Allocator, ...] = ()

    def __post_init__(self) -> None:
        if self.tokens is None:
            object.__setattr__(self, "tokens", DEFAULT_TOKENS[self.sensitivity])


@dataclass(frozen=True)
class HeldOut:
    """`--text`: held-out text the written mixes are also scored on (perplexity and KL); never part of a choice."""

    text: Path
    range: tuple[float, float] = (0.0, 1.0)
    tokens: int | None = None


@dataclass(frozen=True)
class TimeLimit:
    """`--time-limit`: wall-clock minutes for the whole run (timing.py), `spent` of them gone before run_search (the
    command counts its process's start), read from `clock` (seconds; injectable, so tests can slow time down)."""

    minutes: float
    spent: float = 0.0
    clock: Callable[[], float] = time.perf_counter


@dataclass(frozen=True)
class SearchRequest:
    parent: Path
    budgets: tuple[str, ...]  # as typed: they name the output files
    calib: Path
    out: Path
    kind: BudgetKind = BudgetKind.CODE
    levels: tuple[int, ...] | None = None  # default: every width 2..c
    # one width per group an engine runs as one layer (q/k/v, gate/up, a block's experts: units.py), so that vLLM can
    # load the mix; False (the default, why: docs/guide/design.md): every layer chooses alone
    tie: bool = False
    reference: str | Path | None = None  # a directory or Hugging Face id; default: the parent's recorded model
    pool: PoolConfig = field(default_factory=PoolConfig)
    start: StartConfig = field(default_factory=StartConfig)
    refine: RefineConfig = field(default_factory=RefineConfig)  # before the evolution (refine.py); its seed: evo's
    evo: EvoConfig = field(default_factory=EvoConfig)
    held_out: HeldOut | None = None
    time_limit: TimeLimit | None = None  # None: every budget runs all its refinement steps and generations
    score_dtype: ScoreDtype = ScoreDtype.AUTO
    device: str = "auto"  # where the candidates are scored (execution/devices.py)
    resume: bool = False
    overwrite: bool = False
    plot: bool = False  # also draw each mix file's widths against their sensitivities (plot.py) as mix-<budget>.png
    progress: bool = True

    @classmethod
    def of(cls, parent, budgets, calib, out, **options) -> "SearchRequest":
        """The request of the flat options the Python API takes (module docstring); the grouped fields pass as
        they are. An unknown name is a TypeError, as a dataclass's."""
        grouped = {
            "pool": (
                PoolConfig,
                {"calib_range": "range", "seqlen": "seqlen", "calib_tokens": "tokens", "batch_size": "batch_size"},
            ),
            "start": (
                StartConfig,
                {
                    "sensitivity": "sensitivity",
                    "sensitivity_tokens": "tokens",
                    "sensitivity_top": "top",
                    "sensitivity_wide": "wide",
                    "baselines": "baselines",
                },
            ),
        }
        for group, (config, names) in grouped.items():
            given = {names[k]: options.pop(k) for k in list(options) if k in names}
            if (
                given
            ):  # over the group given whole, if any (its defaults otherwise: StartConfig's tokens follow its mode)
                options[group] = config(**{**(vars(options[group]) if group in options else {}), **given})
        text = {k: options.pop(k) for k in ("text", "text_range", "text_tokens") if k in options}
        if text.get("text") is not None:
            options["held_out"] = HeldOut(
                Path(text["text"]), text.get("text_range", (0.0, 1.0)), text.get("text_tokens")
            )
        minutes, spent, clock = (options.pop(k, None) for k in ("time_limit", "time_spent", "clock"))
        if isinstance(minutes, TimeLimit) or minutes is None:
            options["time_limit"] = minutes
        else:
            options["time_limit"] = TimeLimit(minutes, spent or 0.0, clock or time.perf_counter)
        return cls(Path(parent), tuple(budgets), Path(calib), Path(out), **options)


def mix_path(out: Path, budget: str) -> Path:
    return out / f"mix-{budget}.json"


def state_path(out: Path, budget: str) -> Path:
    return out / f".state-{budget}.json"


def check_request(req: SearchRequest) -> None:
    """Refuse a request that cannot run, before anything is loaded: one UserError naming the option."""
    pool, start = req.pool, req.start
    if pool.seqlen < 2 or start.tokens < 1 or pool.batch_size < 1 or pool.tokens < 1:
        raise UserError("--seqlen must be ≥ 2, --calib-tokens, --sensitivity-tokens and --batch-size ≥ 1")
    if start.top is not None and start.sensitivity is not Sensitivity.FULL:
        raise UserError("--sensitivity-top sets the highest level --sensitivity full scores; probe scores one level")
    if start.wide is not None:
        if start.sensitivity is not Sensitivity.FULL:
            raise UserError(
                "--sensitivity-wide sets the windows of --sensitivity full's wide levels; probe scores one level"
            )
        if start.wide[1] < 1:
            raise UserError(f"--sensitivity-wide {start.wide[0]}:{start.wide[1]}: the tokens must be ≥ 1")
    if req.time_limit is not None and not req.time_limit.minutes > 0:
        raise UserError(f"--time-limit takes a positive number of minutes, got {req.time_limit.minutes:g}")
    if req.tie and Allocator.NOISE in start.baselines:
        raise UserError("--baselines noise probes each layer alone and has no tied form; drop it or pass --no-tie")
    if req.plot:
        require_matplotlib()
    if not is_checkpoint(req.parent):
        raise UserError(
            f"{req.parent} is not a matgptq parent (no matgptq.json); give the output of "
            "`matgptq quantize --method matgptq`"
        )
