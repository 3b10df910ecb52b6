"""`matgptq quantize`: parse, call `matgptq.quantize`, print the layers' errors."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..api import quantize
from ..execution import format_table, world
from .argtypes import DefaultsHelpFormatter
from .quantize_flags import add_flags, keywords


def add_parser(sub) -> None:
    q = sub.add_parser(
        "quantize",
        help="quantize a HF model directory (GPTQ, RTN or a MatGPTQ parent)",
        formatter_class=DefaultsHelpFormatter,
    )
    q.add_argument(
        "model",
        help="Hugging Face model: a local directory (config.json + safetensors) or an id "
        "org/name[@revision], fetched into the Hugging Face cache (HF_HUB_OFFLINE honoured)",
    )
    q.add_argument("--out", required=True, help="output checkpoint directory (written atomically)")
    add_flags(q)  # every option, from the one table of them (quantize_flags.py)


def run(a: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    finished = a.resume and not a.overwrite and Path(a.out).exists()  # quantize returns it if it is this run's
    out, reports = quantize(a.model, a.out, **keywords(a))
    if world()[0] > 0:  # torchrun: the other ranks hold the same result; rank 0 reports it
        return
    if finished:
        print(f"{out} is already complete; nothing to do")
        return
    widths = sorted({r for rep in reports for r in rep.rel_error})
    at = {r: [rep.rel_error[r] for rep in reports if r in rep.rel_error] for r in widths}  # a mix: its layers per width
    rows = [[f"{r}-bit", len(at[r]), sum(at[r]) / len(at[r]), max(at[r])] for r in widths]
    if rows:
        print(format_table(["width", "layers", "mean rel. output error", "max"], rows))
    print(f"wrote {out} ({len(reports)} layers, {time.perf_counter() - t0:.1f} s)")
    if a.bits_config:
        print(split_groups_note(out))


def split_groups_note(out) -> str:
    """What a mix means for engines that fuse layers (models/fused.py): every fused group at one width, or the first
    group that is not and what vLLM makes of it."""
    from ..formats import read_checkpoint
    from ..models.fused import describe, fused_groups, mixed_groups

    ckpt = read_checkpoint(out)
    widths = {n: q.master_bits for n, q in ckpt.layers.items()}
    mixed = mixed_groups(fused_groups(ckpt.config, widths), widths)
    if not mixed:
        return "each group an engine runs as one layer (q/k/v, gate/up, a block's experts) has one width"
    more = f" and {len(mixed) - 1} more" if len(mixed) > 1 else ""
    return (
        f"note: {describe(mixed[0])}{more} give layers vLLM runs as one different widths, so vLLM cannot load "
        "this checkpoint's exports (matgptq, transformers, GPTQModel and llama.cpp can); for vLLM, give each "
        "such group one width (`matgptq search` ties them by default)"
    )
