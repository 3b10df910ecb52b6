"""What a search reads before it computes anything, each part checked, so that bad input fails before the teacher:
the parent's widths and units, the budgets against them, the outputs, the reference model, the calibration pool and
the held-out text."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import NamedTuple

import torch

from ..errors import UserError
from ..formats import read_checkpoint
from ..fsutil import check_output
from ..models import eval_windows, load_tokenizer, read_text, require_model_dir, resolve_model, tokenize
from ..models.fused import fused_groups
from .budget import BudgetKind, CostModel, parse_budget
from .evopress import format_stages, window_count
from .request import SearchRequest, mix_path
from .sensitivity import Wide
from .units import Units


class Inputs(NamedTuple):
    ckpt: object  # the parent (formats.read_checkpoint)
    units: Units
    levels: tuple[int, ...]
    cost_model: CostModel  # of the units
    budgets: list[tuple[str, Fraction]]  # (label as typed, budget)
    reference: Path  # the unquantized model's directory
    calib: torch.Tensor  # the pool's windows [n, seqlen]
    least: int  # the fewest windows the pool may be cut to (the stages' and the tables')
    text: torch.Tensor | None  # the held-out windows


def read_inputs(req: SearchRequest) -> Inputs:
    ckpt = read_checkpoint(req.parent)
    names = tuple(ckpt.layers)
    units = Units.grouped(names, fused_groups(ckpt.config, names)) if req.tie else Units.each(names)
    levels, cost_model, budgets = budgets_of(req, ckpt, units)
    reference = reference_model(ckpt, req.reference)
    tokenizer = load_tokenizer(req.parent)
    calib, least = calib_pool(req, tokenizer)
    text = None
    if (held := req.held_out) is not None:
        text = eval_windows(tokenize(tokenizer, read_text(held.text, held.range)), req.pool.seqlen, held.tokens)
    return Inputs(ckpt, units, levels, cost_model, budgets, reference, calib, least, text)


def levels_of(ckpt, requested: tuple[int, ...] | None) -> tuple[int, ...]:
    master = max(q.master_bits for q in ckpt.layers.values())
    if any(q.shift for q in ckpt.layers.values()):
        raise UserError(f"{ckpt.path} is a slice and holds only one width; search needs the parent checkpoint")
    if master < 3:
        raise UserError(
            f"{ckpt.path} stores {master}-bit codes, so it has no widths to choose between; use a parent "
            "with a master width of 3 or more"
        )
    levels = tuple(sorted(set(requested))) if requested else tuple(range(2, master + 1))
    bad = [r for r in levels if not 2 <= r <= master]
    if bad:
        raise UserError(f"--levels {bad[0]} is not a width of this parent; it can slice 2..{master}")
    if len(levels) < 2:
        raise UserError(f"--levels {levels[0]} leaves nothing to choose; give at least two widths")
    return levels


def reference_model(ckpt, requested: str | Path | None) -> Path:
    """The unquantized model: --kl-to, else the one the parent records (a directory, or a Hugging Face id pinned to
    the commit it was quantized from, resolved through the cache)."""
    ref = requested or ckpt.meta.get("source_model")
    if not isinstance(ref, (str, Path)):
        raise UserError(f"{ckpt.path} does not record its unquantized model; pass --kl-to MODEL")
    path = resolve_model(ref).path
    if not path.is_dir():
        raise UserError(f"the unquantized model of {ckpt.path} ({ref}) is not available; pass --kl-to MODEL")
    return require_model_dir(path)


def _windows(tokens: torch.Tensor, seqlen: int, needed_tokens: int, what: str, by: str) -> torch.Tensor:
    needed = math.ceil(needed_tokens / (seqlen - 1))
    if tokens.numel() < needed * seqlen:
        raise UserError(
            f"{what} has {tokens.numel():,} tokens, fewer than the {needed * seqlen:,} the search needs "
            f"for {by} ({needed} windows of --seqlen {seqlen}, {seqlen - 1} scored tokens each); give more "
            f"text (or a wider --calib-range) or lower {by.split(' ')[0]}"
        )
    return tokens[: needed * seqlen].view(needed, seqlen)


def calib_pool(req: SearchRequest, tokenizer) -> tuple[torch.Tensor, int]:
    """The windows every scoring draws from, enough for --calib-tokens, --sensitivity-tokens, --sensitivity-wide and
    the last stage; and the fewest of them the others than --calib-tokens need (what a time limit may cut it to)."""
    pool, start = req.pool, req.start
    tokens = tokenize(tokenizer, read_text(req.calib, pool.range))
    others = [
        (start.tokens, f"--sensitivity-tokens {start.tokens}"),
        *([] if start.wide is None else [(start.wide[1], "--sensitivity-wide {}:{}".format(*start.wide))]),
        (req.evo.stages[-1].tokens, f"--stages {format_stages(req.evo.stages)}"),
    ]
    # the option that asks for the most tokens (a tie names --calib-tokens, the pool's own option)
    needed, by = max((pool.tokens, f"--calib-tokens {pool.tokens}"), *others, key=lambda option: option[0])
    a, b = pool.range
    windows = _windows(
        tokens, pool.seqlen, needed, f"the calibration text ({req.calib}, --calib-range {a:g}:{b:g})", by
    )
    return windows, math.ceil(max(n for n, _ in others) / (pool.seqlen - 1))


def first_windows(tokens: int, seqlen: int, pool: int) -> tuple[int, ...]:
    """The first windows of the pool that hold `tokens` scored tokens (all of them where it has fewer)."""
    return tuple(range(window_count(pool, seqlen, tokens)))


def wide_of(req: SearchRequest, pool: int) -> Wide | None:
    """--sensitivity-wide LEVEL:TOKENS as the table's wide levels: LEVEL and up on the pool's first windows."""
    if req.start.wide is None:
        return None
    level, tokens = req.start.wide
    return Wide(level, first_windows(tokens, req.pool.seqlen, pool))


def budgets_of(req: SearchRequest, ckpt, units: Units) -> tuple[tuple[int, ...], CostModel, list[tuple[str, Fraction]]]:
    """(levels, cost model of `units`, [(label, budget)]) of the request, every budget checked against the parent and
    every output checked writable, before any model is loaded."""
    levels = levels_of(ckpt, req.levels)
    top, wide = req.start.top, req.start.wide
    named = [(top, f"--sensitivity-top {top}")]  # the options that name a level
    if wide is not None:
        named.append((wide[0], f"--sensitivity-wide {wide[0]}:{wide[1]}: {wide[0]}"))
    for level, said in named:
        if level is not None and level not in levels[:-1]:
            raise UserError(
                f"{said} is not a level below the top one; this search's levels are {', '.join(map(str, levels))}"
            )
    cost_model = CostModel.from_checkpoint(ckpt, levels, gguf=req.kind is BudgetKind.GGUF).grouped(units)
    budgets = [(label, parse_budget(label)) for label in req.budgets]
    for _, b in budgets:
        cost_model.check_budget(b, req.kind)
    if len({b for _, b in budgets}) != len(budgets):
        raise UserError("--budget lists the same budget twice")
    for label, _ in budgets:
        if not req.resume:
            check_output(mix_path(req.out, label), req.overwrite)
    return levels, cost_model, budgets
