"""The flags of `matgptq quantize`: one table, each flag giving one keyword of a quantize run (quantization/options.py
KEYWORDS, whose fields and defaults are the typed configs'), with its spelling, help and parsing. The parser is built
from it and its values go to `matgptq.quantize` as those keywords, so no option is spelled again;
tests/test_api_options.py checks that every keyword has a flag and every flag a keyword."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field

from ..execution import DTYPES
from ..formats.gguf import KQuantType
from ..quantization import CalibConfig, GPTQConfig, MatGPTQConfig, Method, Target, Variant
from ..quantization.config import GGUF_BLOCK, MASTER_BIT_WEIGHT
from ..quantization.method_configs import METHOD_DEFAULTS
from ..quantization.options import DEFAULT_METHOD, RunConfig
from .argtypes import device_help, floats, fraction_range, ints

BOOL = argparse.BooleanOptionalAction
MIB = 2**20


@dataclass(frozen=True)
class Flag:
    keyword: str  # the keyword it gives (its dest); flags giving one keyword are mutually exclusive (--sym / --asym)
    flags: tuple[str, ...]
    help: str
    arg: dict = field(default_factory=dict)  # add_argument's other arguments: type, choices, action, default, ...
    to_keyword: Callable | None = None  # the parsed value → the keyword's (MiB → bytes)


def method_default(option: str) -> str:
    """The defaults of `option` per method for --help: "default: 128", or "default: on for gptq, off for rtn, ..."."""
    values = {m.value: d[option] for m, d in METHOD_DEFAULTS.items() if option in d}
    show = lambda v: ("on" if v else "off") if isinstance(v, bool) else str(v)  # noqa: E731
    if len(set(values.values())) == 1:
        return f"default: {show(next(iter(values.values())))}"
    return "default: " + ", ".join(f"{show(v)} for {m}" for m, v in values.items())


WIDTH = (
    Flag(
        "method",
        ("--method",),
        "quantization method",
        dict(choices=[m.value for m in Method], default=DEFAULT_METHOD.value),
    ),
    Flag("bits", ("--bits",), "width (2-8, default 4); for matgptq the target set R, e.g. 3,4,8", dict(type=ints)),
    Flag(
        "bits_config",
        ("--bits-config",),
        'gptq/rtn instead of --bits: each layer at its own width, from a JSON {layer: bits} ("*" = default) such as '
        "a `matgptq search` mix-<budget>.json; every layer is solved as a one-width run at its width would solve it "
        "(the search's mix re-solved by dedicated GPTQ)",
        dict(metavar="MIX"),
    ),
    Flag(
        "master_bits",
        ("--master-bits",),
        "matgptq: master width c of the stored codes (default max of --bits)",
        dict(type=int),
    ),
    Flag(
        "bit_weights",
        ("--bit-weights",),
        "matgptq: weight λ_r per target width, same order as --bits (default: 1 each, and "
        f"{MASTER_BIT_WEIGHT:g} for the master width except with --variant paper)",
        dict(type=floats),
    ),
    Flag(
        "variant",
        ("--variant",),
        "matgptq: paper = the published MatGPTQ algorithm (mean error fed back, master scale); per-width = one "
        "error-feedback track per width; per-width-scales = that plus each width's own least-squares scales "
        "(docs/guide/quantize.md)",
        dict(choices=[v.value for v in Variant], default=MatGPTQConfig.variant.value),
    ),
)

GRID = (
    Flag(
        "group_size",
        ("--group-size",),
        "columns per scale group; -1 = one group per output row "
        f"({method_default('group_size')}; {GGUF_BLOCK} with --target gguf)",
        dict(type=int),
    ),
    Flag("sym", ("--sym",), "symmetric grid (default)", dict(action="store_true", default=GPTQConfig.sym)),
    Flag("sym", ("--asym",), "asymmetric grid with an integer zero point", dict(action="store_false")),
    Flag(
        "mse",
        ("--mse",),
        f"search the scale on a shrink grid (min L2.4 error) ({method_default('mse')})",
        dict(action=BOOL),
    ),
    Flag(
        "mse_weighted",
        ("--mse-weighted",),
        "weight each column's error in the --mse search by the Hessian diagonal (the inputs' mean square: "
        "llama.cpp's importance matrix); needs --mse, not with --method rtn "
        f"({method_default('mse_weighted')})",
        dict(action=BOOL),
    ),
    Flag(
        "refit_scales",
        ("--refit-scales",),
        "after the solver, refit every group scale of the stored codes by Hessian-weighted least squares, per row "
        "kept only where the layer's calibration error shrinks (codes unchanged; not with --method rtn) "
        f"({method_default('refit_scales')})",
        dict(action=BOOL),
    ),
    Flag(
        "target",
        ("--target",),
        "the runtime the codes are shaped for: any = the plain grid every export takes (GPTQ v1/v2, "
        "compressed-tensors, GGUF); gguf = llama.cpp's grid, for `export --format gguf`: the signed scale of "
        f"Q4_0/Q5_0/Q8_0 and their {GGUF_BLOCK}-column groups (or --kquant's)",
        dict(choices=[t.value for t in Target], default=GPTQConfig.target.value),
    ),
    Flag(
        "signed_scale",
        ("--signed-scale",),
        "symmetric grid whose scale takes the sign of the largest-|w| weight (llama.cpp Q4_0's grid) (default: on "
        "with --target gguf, else off)",
        dict(action=BOOL),
    ),
    Flag(
        "kquant",
        ("--kquant",),
        "put group scales on this GGUF K-quant's super-block lattice (one fp16 d per 256 columns, small integer "
        "sub-scales), so `export --format gguf` writes it, and every K-quant with wider sub-scales, exactly; "
        "symmetric grids, group size 16-128 (32-128 for q4_k/q5_k)",
        dict(choices=[t.value for t in KQuantType]),
    ),
)

SOLVER = (
    Flag(
        "act_order",
        ("--act-order",),
        "quantize columns by decreasing Hessian diagonal (desc_act); off when --group-act-order is asked for "
        f"({method_default('act_order')})",
        dict(action=BOOL),
    ),
    Flag(
        "static_groups",
        ("--static-groups",),
        "with --act-order: each group's scale and zero from its original columns, fixed before any GPTQ update, so "
        "groups stay contiguous (the plain layout, no g_idx); --no-static-groups stores act order's g_idx instead "
        "(default: on with --act-order)",
        dict(action=BOOL),
    ),
    Flag(
        "group_act_order",
        ("--group-act-order",),
        "process whole groups by decreasing Hessian diagonal, and the columns inside each group too (GAR, "
        "GPTQModel's act_group_aware): the plain layout, no g_idx; --act-order overrides it "
        f"({method_default('group_act_order')})",
        dict(action=BOOL),
    ),
    Flag(
        "skip",
        ("--skip",),
        "leave block Linears whose module name matches unquantized (repeatable)",
        dict(action="append", default=[], metavar="REGEX"),
    ),
    Flag(
        "damp",
        ("--damp",),
        f"relative Hessian damping (retried x10 if needed) ({method_default('damp')})",
        dict(type=float),
    ),
    Flag("block_size", ("--block-size",), "GPTQ lazy-update block size", dict(type=int, default=GPTQConfig.block_size)),
    Flag(
        "true_sequential",
        ("--no-true-sequential",),
        "quantize all Linears of a block from the same inputs",
        dict(action="store_false"),
    ),
)

CALIBRATION = (
    Flag("calib", ("--calib",), "calibration text file (UTF-8); required except for --method rtn"),
    Flag(
        "calib_range",
        ("--calib-range",),
        "character range START:END of --calib",
        dict(type=fraction_range, default=":".join(f"{x:g}" for x in CalibConfig.text_range)),
    ),
    Flag(
        "nsamples",
        ("--nsamples",),
        "number of calibration windows (for the same tokens, more and shorter windows measured better: "
        "docs/guide/quantize.md#defaults)",
        dict(type=int, default=CalibConfig.nsamples),
    ),
    Flag("seqlen", ("--seqlen",), "tokens per calibration window", dict(type=int, default=CalibConfig.seqlen)),
    Flag("seed", ("--seed",), "seed for drawing the windows", dict(type=int, default=CalibConfig.seed)),
    Flag(
        "dtype",
        ("--dtype",),
        "model dtype while calibrating, and of the unquantized tensors written. auto: the model's own, written in "
        "its own dtype, except: a bfloat16 model on a CPU without AVX512-BF16 or AMX, or a float16 one without "
        "AMX-FP16 (emulated there, several times slower), calibrates in float32; GPTQ or MatGPTQ of a float32 model on a "
        "CPU with AVX512-BF16 or AMX runs the calibration passes in bfloat16 from the float32 weights, as GPTQModel "
        "does on CPU (a tie in quality, in less CPU time: docs/guide/quantize.md#defaults). bfloat16 also rounds "
        "the weights and writes bfloat16. Hessians and the solver stay float32",
        dict(choices=list(DTYPES), default=RunConfig.dtype),
    ),
)

RUN = (
    Flag("overwrite", ("--overwrite",), "replace --out if it exists", dict(action="store_true")),
    Flag(
        "resume",
        ("--resume",),
        "continue a killed run from its last finished block (progress is kept in .OUT.resume beside --out until "
        "the checkpoint is written)",
        dict(action="store_true"),
    ),
    Flag(
        "device",
        ("--device",),
        device_help(
            "the model runs and the solver computes (the model in its own dtype, Hessians and solver in "
            "float32); under torchrun, auto and cuda mean each process's own GPU"
        ),
        dict(default=RunConfig.device),
    ),
    Flag(
        "stream",
        ("--no-stream",),
        "load the whole model into memory first instead of reading each block from its safetensors files when it "
        "is quantized (the checkpoint is the same; streaming keeps one block in memory)",
        dict(action="store_false", default=RunConfig.stream),
    ),
    Flag(
        "shard_bytes",
        ("--shard-size",),
        "largest file of the written checkpoint in MiB (default %(default)g): a larger checkpoint is written as "
        "model-0000k-of-0000N.safetensors shards with model.safetensors.index.json",
        dict(type=float, default=RunConfig.shard_bytes / MIB, metavar="MB"),
        to_keyword=lambda mb: int(mb * MIB),
    ),
    Flag("progress", ("--quiet",), "no progress bars", dict(action="store_false")),
)

# the --help sections (None: the command's own options) and their flags
SECTIONS = (
    (None, WIDTH),
    ("grid: how each group of weights is mapped to codes", GRID),
    ("solver: GPTQ's column-by-column error feedback", SOLVER),
    ("calibration", CALIBRATION),
    ("run", RUN),
)
FLAGS = tuple(f for _, flags in SECTIONS for f in flags)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Every flag of the table on `parser`, in its sections."""
    for title, flags in SECTIONS:
        group = parser if title is None else parser.add_argument_group(title)
        exclusive: dict = {}  # keyword → the mutually exclusive group of its flags
        for f in flags:
            target = group
            if sum(g.keyword == f.keyword for g in flags) > 1:
                if f.keyword not in exclusive:
                    exclusive[f.keyword] = group.add_mutually_exclusive_group()
                target = exclusive[f.keyword]
            target.add_argument(*f.flags, dest=f.keyword, help=f.help, **f.arg)


def keywords(args: argparse.Namespace) -> dict[str, object]:
    """The parsed flags as `matgptq.quantize`'s keywords."""
    out = {}
    for f in FLAGS:
        value = getattr(args, f.keyword)
        out[f.keyword] = f.to_keyword(value) if f.to_keyword and value is not None else value
    return out
