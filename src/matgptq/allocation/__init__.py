"""Mix'n'Match: the best per-layer widths of a parent under a bit budget. Exact code and storage bit counts (budget),
KL to the unquantized model of a candidate built in memory (fitness), per-layer sensitivities and the exact knapsack
start (sensitivity, knapsack, allocators), the level-switch mutation (mutation), resumable (1+λ) EvoPress (evopress),
and `matgptq search` from parent to mix files: the request (request), its steps (runner: inputs, pool, start,
refine, evopress, choice), the mix file (record), the time limit (timing), what --resume keeps (resume)."""

from .budget import BudgetKind, CostModel, parse_budget
from .evopress import EvoConfig, Stage, parse_stages
from .request import ScoreDtype, SearchRequest, mix_path
from .runner import run_search

__all__ = [
    "BudgetKind",
    "CostModel",
    "parse_budget",
    "EvoConfig",
    "Stage",
    "parse_stages",
    "ScoreDtype",
    "SearchRequest",
    "mix_path",
    "run_search",
]
