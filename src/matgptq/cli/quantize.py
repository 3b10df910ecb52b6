"""`matgptq quantize`: parse, call `matgptq.quantize`, print the layers' errors."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..api import quantize
from ..execution import DTYPES, format_table, world
from ..formats.gguf import KQuantType
from ..formats.staged import SHARD_BYTES
from ..quantization.calibration import CalibConfig
from ..quantization.config import (
    GGUF_BLOCK, MASTER_BIT_WEIGHT, METHOD_DEFAULTS, GPTQConfig, MatGPTQConfig, Target, Variant,
)  # fmt: skip
from .argtypes import DefaultsHelpFormatter, add_device_option, floats, fraction_range, ints


def add_parser(sub) -> None:
    q = sub.add_parser("quantize", help="quantize a HF model directory (GPTQ, RTN or a MatGPTQ parent)",
                       formatter_class=DefaultsHelpFormatter)
    q.add_argument("model", help="Hugging Face model: a local directory (config.json + safetensors) or an id "
                                  "org/name[@revision], fetched into the Hugging Face cache (HF_HUB_OFFLINE honoured)")
    q.add_argument("--out", required=True, help="output checkpoint directory (written atomically)")
    q.add_argument("--method", choices=["gptq", "rtn", "matgptq"], default="gptq", help="quantization method")
    q.add_argument("--bits", type=ints, help="width (2-8, default 4); for matgptq the target set R, e.g. 3,4,8")
    q.add_argument("--bits-config", metavar="MIX",
                   help="gptq/rtn instead of --bits: each layer at its own width, from a JSON {layer: bits} (\"*\" = "
                        "default) such as a `matgptq search` mix-<budget>.json; every layer is solved as a one-width "
                        "run at its width would solve it (the search's mix re-solved by dedicated GPTQ)")
    q.add_argument("--master-bits", type=int, help="matgptq: master width c of the stored codes (default max of --bits)")
    q.add_argument("--bit-weights", type=floats,
                   help="matgptq: weight λ_r per target width, same order as --bits (default: 1 each, and "
                        f"{MASTER_BIT_WEIGHT:g} for the master width except with --variant paper)")
    q.add_argument("--variant", choices=[v.value for v in Variant], default=MatGPTQConfig.variant.value,
                   help="matgptq: paper = the published MatGPTQ algorithm (mean error fed back, master scale); "
                        "per-width = one error-feedback track per width; per-width-scales = that plus each width's "
                        "own least-squares scales (docs/guide/quantize.md)")
    _grid_options(q.add_argument_group("grid: how each group of weights is mapped to codes"))
    _solver_options(q.add_argument_group("solver: GPTQ's column-by-column error feedback"))
    _calibration_options(q.add_argument_group("calibration"))
    _run_options(q.add_argument_group("run"))


def _grid_options(g) -> None:
    g.add_argument("--group-size", type=int, help="columns per scale group; -1 = one group per output row "
                                                  f"({method_default('group_size')}; {GGUF_BLOCK} with --target gguf)")
    sym = g.add_mutually_exclusive_group()
    sym.add_argument("--sym", dest="sym", action="store_true", default=True, help="symmetric grid (default)")
    sym.add_argument("--asym", dest="sym", action="store_false", help="asymmetric grid with an integer zero point")
    g.add_argument("--mse", action=argparse.BooleanOptionalAction,
                   help=f"search the scale on a shrink grid (min L2.4 error) ({method_default('mse')})")
    g.add_argument("--mse-weighted", action=argparse.BooleanOptionalAction,
                   help="weight each column's error in the --mse search by the Hessian diagonal (the inputs' mean "
                        "square: llama.cpp's importance matrix); needs --mse, not with --method rtn "
                        f"({method_default('mse_weighted')})")
    g.add_argument("--refit-scales", action=argparse.BooleanOptionalAction,
                   help="after the solver, refit every group scale of the stored codes by Hessian-weighted least "
                        "squares, per row kept only where the layer's calibration error shrinks (codes unchanged; "
                        f"not with --method rtn) ({method_default('refit_scales')})")
    g.add_argument("--target", choices=[t.value for t in Target], default=Target.ANY.value,
                   help="the runtime the codes are shaped for: any = the plain grid every export takes (GPTQ v1/v2, "
                        "compressed-tensors, GGUF); gguf = llama.cpp's grid, for `export --format gguf`: the "
                        f"signed scale of Q4_0/Q5_0/Q8_0 and their {GGUF_BLOCK}-column groups (or --kquant's)")
    g.add_argument("--signed-scale", action=argparse.BooleanOptionalAction,
                   help="symmetric grid whose scale takes the sign of the largest-|w| weight (llama.cpp Q4_0's grid) "
                        "(default: on with --target gguf, else off)")
    g.add_argument("--kquant", choices=[t.value for t in KQuantType],
                   help="put group scales on this GGUF K-quant's super-block lattice (one fp16 d per 256 columns, "
                        "small integer sub-scales), so `export --format gguf` writes it, and every K-quant with wider "
                        "sub-scales, exactly; symmetric grids, group size 16-128 (32-128 for q4_k/q5_k)")


def _solver_options(g) -> None:
    g.add_argument("--act-order", action=argparse.BooleanOptionalAction,
                   help="quantize columns by decreasing Hessian diagonal (desc_act); off when --group-act-order "
                        f"is asked for ({method_default('act_order')})")
    g.add_argument("--static-groups", action=argparse.BooleanOptionalAction,
                   help="with --act-order: each group's scale and zero from its original columns, fixed before any "
                        "GPTQ update, so groups stay contiguous (the plain layout, no g_idx); --no-static-groups "
                        "stores act order's g_idx instead (default: on with --act-order)")
    g.add_argument("--group-act-order", action=argparse.BooleanOptionalAction,
                   help="process whole groups by decreasing Hessian diagonal, and the columns inside each group too "
                        "(GAR, GPTQModel's act_group_aware): the plain layout, no g_idx; --act-order overrides it "
                        f"({method_default('group_act_order')})")
    g.add_argument("--skip", action="append", default=[], metavar="REGEX",
                   help="leave block Linears whose module name matches unquantized (repeatable)")
    g.add_argument("--damp", type=float, help="relative Hessian damping (retried x10 if needed) "
                                              f"({method_default('damp')})")
    g.add_argument("--block-size", type=int, default=GPTQConfig.block_size, help="GPTQ lazy-update block size")
    g.add_argument("--no-true-sequential", dest="true_sequential", action="store_false",
                   help="quantize all Linears of a block from the same inputs")  # fmt: skip


def _calibration_options(g) -> None:
    g.add_argument("--calib", help="calibration text file (UTF-8); required except for --method rtn")
    g.add_argument("--calib-range", type=fraction_range, default="0:1", help="character range START:END of --calib")
    g.add_argument("--nsamples", type=int, default=CalibConfig.nsamples,
                   help="number of calibration windows (for the same tokens, more and shorter windows measured "
                        "better: docs/guide/quantize.md#defaults)")  # fmt: skip
    g.add_argument("--seqlen", type=int, default=CalibConfig.seqlen, help="tokens per calibration window")
    g.add_argument("--seed", type=int, default=0, help="seed for drawing the windows")
    g.add_argument("--dtype", choices=list(DTYPES), default="auto",
                   help="model dtype while calibrating, and of the unquantized tensors written. auto: the model's "
                        "own, written in its own dtype, except: a bfloat16 model on a CPU without AVX512-BF16 or "
                        "AMX, or a float16 one without AMX-FP16 (emulated there, several times slower), calibrates "
                        "in float32; GPTQ of a float32 model on a CPU with AVX512-BF16 or AMX runs the calibration "
                        "passes in bfloat16 from the float32 weights, as GPTQModel does on CPU (a tie in quality, in "
                        "less CPU time: docs/guide/quantize.md#defaults). bfloat16 also rounds the "
                        "weights and writes bfloat16. Hessians and the solver stay float32")


def _run_options(g) -> None:
    g.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    g.add_argument("--resume", action="store_true",
                   help="continue a killed run from its last finished block (progress is kept in .OUT.resume beside "
                        "--out until the checkpoint is written)")  # fmt: skip
    add_device_option(g, "the model runs and the solver computes (the model in its own dtype, Hessians and solver in "
                   "float32); under torchrun, auto and cuda mean each process's own GPU")  # fmt: skip
    g.add_argument("--no-stream", dest="stream", action="store_false", default=None,
                   help="load the whole model into memory first instead of reading each block from its safetensors "
                        "files when it is quantized (the checkpoint is the same; streaming keeps one block in memory)")
    g.add_argument("--shard-size", type=float, default=SHARD_BYTES / 2**20, metavar="MB",
                   help="largest file of the written checkpoint in MiB (default %(default)g): a larger checkpoint is "
                        "written as model-0000k-of-0000N.safetensors shards with model.safetensors.index.json")
    g.add_argument("--quiet", action="store_true", help="no progress bars")


def method_default(option: str) -> str:
    """The defaults of `option` per method for --help: "default: 128", or "default: on for gptq, off for rtn, ..."."""
    values = {m.value: d[option] for m, d in METHOD_DEFAULTS.items() if option in d}
    show = lambda v: ("on" if v else "off") if isinstance(v, bool) else str(v)  # noqa: E731
    if len(set(values.values())) == 1:
        return f"default: {show(next(iter(values.values())))}"
    return "default: " + ", ".join(f"{show(v)} for {m}" for m, v in values.items())


def run(a: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    finished = a.resume and not a.overwrite and Path(a.out).exists()  # quantize returns it if it is this run's
    out, reports = quantize(
        a.model, a.out, calib=a.calib, method=a.method, bits=a.bits, bits_config=a.bits_config, master_bits=a.master_bits,
        bit_weights=a.bit_weights, calib_range=a.calib_range, nsamples=a.nsamples, seqlen=a.seqlen, seed=a.seed,
        overwrite=a.overwrite, progress=not a.quiet, dtype=a.dtype, resume=a.resume, group_size=a.group_size, sym=a.sym,
        act_order=a.act_order, group_act_order=a.group_act_order, static_groups=a.static_groups, mse=a.mse, damp=a.damp, block_size=a.block_size,
        true_sequential=a.true_sequential, signed_scale=a.signed_scale, target=a.target, skip=tuple(a.skip), variant=a.variant,
        kquant=a.kquant, refit_scales=a.refit_scales, mse_weighted=a.mse_weighted, device=a.device, stream=a.stream,
        shard_bytes=int(a.shard_size * 2**20),
    )  # fmt: skip
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
    return (f"note: {describe(mixed[0])}{more} give layers vLLM runs as one different widths, so vLLM cannot load "
            "this checkpoint's exports (matgptq, transformers, GPTQModel and llama.cpp can); for vLLM, give each "
            "such group one width (`matgptq search` ties them by default)")  # fmt: skip
