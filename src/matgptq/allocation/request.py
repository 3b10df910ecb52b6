"""What `matgptq search` is asked to do (`SearchRequest`, one field per option) and where its files go; the checks
that need nothing loaded."""

from __future__ import annotations

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
from .refine import RefineConfig
from .plot import require_matplotlib
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
        the table's seconds (docs/guide/search.md, --score-dtype; docs/results/search_table_dtype.md). Without a time
        limit the tables are a small part of the run (search_long: minutes against hours); under one they are most
        of it, and the candidates' precision stays theirs. An explicit dtype is used as given."""
        return torch.float32 if self is ScoreDtype.AUTO and not time_limited else scored


@dataclass(frozen=True)
class SearchRequest:
    parent: Path
    budgets: tuple[str, ...]  # as typed: they name the output files
    calib: Path
    out: Path
    calib_range: tuple[float, float] = (0.0, 1.0)
    levels: tuple[int, ...] | None = None  # default: every width 2..c
    kind: BudgetKind = BudgetKind.CODE
    evo: EvoConfig = field(default_factory=EvoConfig)
    refine: RefineConfig = field(default_factory=RefineConfig)  # before the evolution (refine.py); its seed: evo's
    seqlen: int = 256
    sensitivity_tokens: int | None = None  # None: the mode's default (sensitivity.DEFAULT_TOKENS), set on creation
    # the pool the stages draw their windows from; a pool no larger than the last stage lets every generation score
    # the same tokens, and the search then fits them (its held-out scores get worse)
    calib_tokens: int = 16384
    sensitivity: Sensitivity = Sensitivity.FULL
    sensitivity_top: int | None = None  # FULL: the highest level scored, the wider ones extrapolated; None: every one
    # FULL: (level, tokens): the levels from `level` up scored on `tokens` tokens (sensitivity.Wide); None: all on
    # sensitivity_tokens
    sensitivity_wide: tuple[int, int] | None = None
    # one-shot allocations (allocators.py) that compete with the knapsack start as the search's first parent and with
    # the evolved mix for the written one; the default ones cost one forward pass (error) and one block-by-block
    # backward pass per fractional budget's floor width (gradient.py), plus dequantizing every slice once for each
    baselines: tuple[Allocator, ...] = (Allocator.UNIFORM, Allocator.ERROR, Allocator.GRADIENT)
    reference: str | Path | None = None  # a directory or Hugging Face id; default: the parent's recorded model
    text: Path | None = None
    text_range: tuple[float, float] = (0.0, 1.0)
    text_tokens: int | None = None
    batch_size: int = 8
    resume: bool = False
    overwrite: bool = False
    progress: bool = True
    device: str = "auto"  # where the candidates are scored (execution/devices.py)
    score_dtype: ScoreDtype = ScoreDtype.AUTO
    # one width per group an engine runs as one layer (q/k/v, gate/up, a block's experts: units.py), so that vLLM can
    # load the mix; False (the default, why: docs/guide/design.md): every layer chooses alone
    tie: bool = False
    plot: bool = False  # also draw each mix file's widths against their sensitivities (plot.py) as mix-<budget>.png
    # wall-clock minutes for the whole run (run_search's docstring); None: every budget runs all its generations
    time_limit: float | None = None
    # seconds already spent before run_search when the time limit began (the command counts its process's start)
    time_spent: float = 0.0

    def __post_init__(self) -> None:
        if self.sensitivity_tokens is None:
            object.__setattr__(self, "sensitivity_tokens", DEFAULT_TOKENS[self.sensitivity])


def mix_path(out: Path, budget: str) -> Path:
    return out / f"mix-{budget}.json"


def state_path(out: Path, budget: str) -> Path:
    return out / f".state-{budget}.json"


def check_request(req: SearchRequest) -> None:
    """Refuse a request that cannot run, before anything is loaded: one UserError naming the option."""
    if req.seqlen < 2 or req.sensitivity_tokens < 1 or req.batch_size < 1 or req.calib_tokens < 1:
        raise UserError("--seqlen must be ≥ 2, --calib-tokens, --sensitivity-tokens and --batch-size ≥ 1")
    if req.sensitivity_top is not None and req.sensitivity is not Sensitivity.FULL:
        raise UserError("--sensitivity-top sets the highest level --sensitivity full scores; probe scores one level")
    if req.sensitivity_wide is not None:
        if req.sensitivity is not Sensitivity.FULL:
            raise UserError("--sensitivity-wide sets the windows of --sensitivity full's wide levels; probe scores one "
                            "level")  # fmt: skip
        if req.sensitivity_wide[1] < 1:
            raise UserError(f"--sensitivity-wide {req.sensitivity_wide[0]}:{req.sensitivity_wide[1]}: the tokens must "
                            "be ≥ 1")  # fmt: skip
    if req.time_limit is not None and not req.time_limit > 0:
        raise UserError(f"--time-limit takes a positive number of minutes, got {req.time_limit:g}")
    if req.tie and Allocator.NOISE in req.baselines:
        raise UserError("--baselines noise probes each layer alone and has no tied form; drop it or pass --no-tie")
    if req.plot:
        require_matplotlib()
    if not is_checkpoint(req.parent):
        raise UserError(f"{req.parent} is not a matgptq parent (no matgptq.json); give the output of "
                        "`matgptq quantize --method matgptq`")  # fmt: skip
