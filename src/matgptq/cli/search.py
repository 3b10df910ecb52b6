"""`matgptq search`: parse, call the search, print one row per budget. --help lists the options a user needs first,
the rest in named groups after them."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..allocation import BudgetKind, EvoConfig, ScoreDtype, SearchRequest, mix_path, parse_stages, run_search
from ..allocation.allocators import Allocator
from ..allocation.evopress import format_stages
from ..allocation.refine import RefineConfig
from ..allocation.request import HeldOut, PoolConfig, StartConfig, TimeLimit
from ..allocation.sensitivity import DEFAULT_TOKENS, Sensitivity
from ..allocation.spread import is_writer
from ..allocation.timing import process_seconds
from ..execution import format_table
from .argtypes import DefaultsHelpFormatter, add_device_option, fraction_range, ints


def add_parser(sub) -> None:
    s = sub.add_parser(
        "search",
        help="best per-layer widths of a parent under bit budgets (knapsack start + EvoPress)",
        formatter_class=DefaultsHelpFormatter,
    )
    s.add_argument("parent", help="matgptq parent checkpoint (from quantize --method matgptq)")
    s.add_argument("--budget", required=True, help="average bits per quantized weight, one or several: 3.0,2.5")
    s.add_argument("--calib", required=True, help="calibration text file (UTF-8) the fitness KL is measured on")
    s.add_argument("--out", required=True, help="folder for mix-<budget>.json (and the resumable search states)")
    s.add_argument(
        "--time-limit",
        type=float,
        metavar="MINUTES",
        help="wall-clock minutes for the whole run, counted from the command's start; every step is "
        "priced as it goes and cut to fit, and every budget gets a mix file (each says what was cut)",
    )
    s.add_argument("--levels", type=ints, help="widths a layer may take (default: every width 2..c of the parent)")
    s.add_argument(
        "--budget-kind",
        choices=[k.value for k in BudgetKind],
        default=BudgetKind.CODE.value,
        help="enforce code bits (the paper's count), storage bits (codes + scales + zeros + indices of a "
        "sliced matgptq checkpoint) or gguf bits (the layers' tensors as `export --format gguf` writes "
        "the mix with --type auto; token_embd, output and norms not counted)",
    )
    s.add_argument(
        "--tie",
        action=argparse.BooleanOptionalAction,
        default=SearchRequest.tie,
        help="give each group of layers an engine runs as one (q/k/v, gate/up, a block's experts) one "
        "width, as vLLM needs to load the mix; without it (--no-tie, the default) every layer chooses "
        "alone: such a mix loads in matgptq, transformers, llama.cpp and GPTQModel, not in vLLM",
    )
    s.add_argument(
        "--text", help="held-out text: also report perplexity and KL of the knapsack, searched and written mixes"
    )
    s.add_argument(
        "--plot",
        action="store_true",
        help="also draw mix-<budget>.png: each layer's width against the measured cost of lowering it "
        "(needs matplotlib: pip install 'matgptq[plot]')",
    )
    s.add_argument("--resume", action="store_true", help="continue the searches whose states are in --out")
    s.add_argument("--overwrite", action="store_true", help="replace existing mix files")
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    add_device_option(s, "the candidates are scored")
    _add_data_options(s.add_argument_group("calibration and held-out text"))
    _add_start_options(s.add_argument_group("start: the one-shot tables and baselines"))
    _add_search_options(s.add_argument_group("refinement and evolution"))


def _add_data_options(g) -> None:
    pool = PoolConfig()  # the defaults live in the dataclasses; --help shows them
    g.add_argument("--calib-range", type=fraction_range, default="0:1", help="character range START:END of --calib")
    g.add_argument(
        "--calib-tokens",
        type=int,
        default=pool.tokens,
        help="calibration tokens the stages draw their windows from (default %(default)s; at least the last stage's)",
    )
    g.add_argument(
        "--seqlen", type=int, default=pool.seqlen, help="tokens per calibration window (default %(default)s)"
    )
    g.add_argument(
        "--kl-to",
        help="unquantized reference model, a directory or Hugging Face id (default: the "
        "parent's recorded source model)",
    )
    g.add_argument("--text-range", type=fraction_range, default="0:1", help="character range START:END of --text")
    g.add_argument("--max-tokens", type=int, help="use only the first N tokens of --text")


def _add_start_options(g) -> None:
    """The starting table and the one-shot baselines."""
    start = StartConfig()
    g.add_argument(
        "--sensitivity",
        choices=[k.value for k in Sensitivity],
        default=start.sensitivity.value,
        help="starting mix: score each layer alone at every level (full; levels − 1 scorings a layer; under "
        "--time-limit it scores the levels that leave every budget its time, lowest first, and "
        "extrapolates the rest as probe does), or at its lowest level only and extrapolate the "
        "others by its weight error (probe) (default %(default)s)",
    )
    g.add_argument(
        "--sensitivity-tokens",
        type=int,
        help="scored tokens per sensitivity measurement (default: "
        + ", ".join(f"{n} with {k.value}" for k, n in DEFAULT_TOKENS.items())
        + ")",
    )
    g.add_argument(
        "--sensitivity-top",
        type=int,
        metavar="LEVEL",
        help="with full: the highest level the table scores; each wider level is extrapolated from it by "
        "the layer's weight error, as probe does (its scorings saved for more --sensitivity-tokens "
        "at the narrow levels, whose losses decide most; default: every level)",
    )
    g.add_argument(
        "--sensitivity-wide",
        type=level_tokens,
        metavar="LEVEL:TOKENS",
        help="with full: score the levels from LEVEL up on TOKENS tokens instead of --sensitivity-tokens "
        "(one window's measurement of a middle level's small loss is mostly its noise), each as its "
        "increase over the top mix's KL on the same tokens (default: every level on "
        "--sensitivity-tokens)",
    )
    g.add_argument(
        "--baselines",
        type=allocators,
        help="one-shot allocations that compete with the knapsack start for the first parent and with the "
        "evolved mix for the written one, from " + ", ".join(a.value for a in Allocator) + " (default: "
        "none; error costs one forward pass, gradient one backward pass per fractional budget's floor "
        "width, additive and noise layers × (levels − 1) and layers × 2 scorings, and each its "
        "scoring on the pool every budget)",
    )
    g.add_argument(
        "--score-dtype",
        choices=[k.value for k in ScoreDtype],
        default=SearchRequest.score_dtype.value,
        help="precision of the candidates' forward passes: bfloat16 makes a generation faster "
        "where the hardware has it (AVX512-BF16/AMX CPUs, GPUs); auto = bfloat16 there, float32 "
        "elsewhere, and the one-shot tables in float32 unless --time-limit is given (bfloat16's "
        "rounding is of the order of one layer's KL at the wide widths); the reported KLs are "
        "float32 (default %(default)s)",
    )


def _add_search_options(g) -> None:
    """EvoPress' generations, selection, mutations and the start's refinement."""
    evo, refine = EvoConfig(), RefineConfig()
    g.add_argument(
        "--generations", type=int, default=evo.generations, help="EvoPress generations (default %(default)s)"
    )
    g.add_argument(
        "--offspring", type=int, default=evo.offspring, help="children per generation, λ (default %(default)s)"
    )
    g.add_argument(
        "--stages",
        default=format_stages(evo.stages),
        help="selection stages TOKENS:SURVIVORS,…; the parent re-enters at the last, which ends with :1 "
        "(default %(default)s)",
    )
    g.add_argument(
        "--mutation-temperature",
        type=float,
        default=evo.temperature,
        help="how greedily a child's lowered and raised layers follow the start's loss table: each move "
        "drawn with probability ∝ exp(−its predicted loss per bit / (T · the median)), so lower is "
        "greedier; 0 draws them uniformly, as EvoPress (default %(default)s)",
    )
    g.add_argument(
        "--refine-steps",
        type=int,
        default=refine.steps,
        help="before the evolution, at most this many measured refinement steps of the start: each scores "
        "one group of layers a level up and down at the current mix, re-solves the knapsack on those "
        "measurements and keeps the result only if it scores lower on other windows (0: none; "
        "default %(default)s)",
    )
    g.add_argument(
        "--refine-groups",
        type=int,
        default=refine.groups,
        help="groups the layers are dealt into for the refinement, one group a step (default %(default)s)",
    )
    g.add_argument("--seed", type=int, default=evo.seed, help="seed of every random draw (mutations, windows)")


def level_tokens(text: str) -> tuple[int, int]:
    level, sep, tokens = text.partition(":")
    try:
        if sep:
            return int(level), int(tokens)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected LEVEL:TOKENS such as 4:510, got {text!r}")


def allocators(text: str) -> tuple[Allocator, ...]:
    try:
        return tuple(Allocator(x.strip()) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected allocators from {', '.join(a.value for a in Allocator)}, got {text!r}"
        ) from None


def request(a: argparse.Namespace) -> SearchRequest:
    """The request the parsed options make."""
    evo = EvoConfig(
        generations=a.generations,
        offspring=a.offspring,
        stages=parse_stages(a.stages),
        seed=a.seed,
        temperature=a.mutation_temperature,
    )
    start = StartConfig(
        Sensitivity(a.sensitivity), a.sensitivity_tokens, a.sensitivity_top, a.sensitivity_wide, a.baselines or ()
    )
    return SearchRequest(
        Path(a.parent),
        tuple(b.strip() for b in a.budget.split(",")),
        Path(a.calib),
        Path(a.out),
        kind=BudgetKind(a.budget_kind),
        levels=a.levels,
        tie=a.tie,
        reference=a.kl_to,
        pool=PoolConfig(a.calib_range, a.seqlen, a.calib_tokens),
        start=start,
        refine=RefineConfig(a.refine_steps, a.refine_groups),
        evo=evo,
        held_out=HeldOut(Path(a.text), a.text_range, a.max_tokens) if a.text else None,
        time_limit=None if a.time_limit is None else TimeLimit(a.time_limit, process_seconds()),
        score_dtype=ScoreDtype(a.score_dtype),
        device=a.device,
        resume=a.resume,
        overwrite=a.overwrite,
        plot=a.plot,
        progress=not a.quiet,
    )


def _tie_line(groups: int | None, tie: bool) -> str:
    """Which search ran: tied (how many groups) or untied."""
    if not tie:
        return (
            "untied: each layer chose its width alone; a mix that splits q/k/v, gate/up or a block's experts does "
            "not load in vLLM (the export's readers line names such a group): search with --tie to serve there"
        )
    count = "" if groups is None else f"{groups} "
    return (
        f"tied: each of the {count}groups an engine runs as one layer (q/k/v, gate/up, a block's experts) has "
        "one width, so vLLM can load these mixes"
    )


def run(a: argparse.Namespace) -> None:
    rows = run_search(request(a))
    if not is_writer():  # torchrun: every rank holds the same mixes; rank 0 reports them
        return
    headers = ["budget", "kind", "code_bits", "storage_bits"] + (["gguf_bits"] if a.budget_kind == "gguf" else [])
    headers += ["start", "dp_kl", "search_kl", "chosen", "kl"]
    if a.text:
        headers += ["text_ppl", "text_kl"]
    headers += ["generations", "evaluations", "teacher_seconds", "tables_seconds", "search_seconds", "report_seconds"]
    # "-": kept from an older run, or not scored in the time limit
    print(format_table(headers, [["-" if r.get(h) is None else r[h] for h in headers] for r in rows]))
    print(_tie_line(rows[0].get("tied_groups"), a.tie))
    for r in rows:
        if r.get("cut"):
            print(f"{r['budget']}: the time limit cut " + "; ".join(r["cut"]))
    for verb, kept in (("wrote", False), ("kept (finished by the run before)", True)):
        paths = [mix_path(Path(a.out), r["budget"]) for r in rows if r.get("kept", False) is kept]
        if paths:
            plots = [p.with_suffix(".png") for p in paths] if a.plot else []
            print(f"{verb} " + ", ".join(str(p) for p in paths + plots))
