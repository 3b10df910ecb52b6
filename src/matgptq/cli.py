"""The `matgptq` command line: quantize, eval, slice, export, search. User errors print one line and exit with status 2."""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .argtypes import DefaultsHelpFormatter, add_device_option, floats, fraction_range, ints
from .errors import UserError
from .integrations.transformers import IMPORT_LOGGERS
from .models import quiet_loggers


def build_parser() -> argparse.ArgumentParser:
    from .formats.staged import SHARD_BYTES
    from .quantization.config import GGUF_BLOCK, MASTER_BIT_WEIGHT, CalibConfig, GPTQConfig, MatGPTQConfig, Target, Variant
    from .formats.gguf import KQuantType

    p = argparse.ArgumentParser(prog="matgptq", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

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
    q.add_argument("--group-size", type=int, help="columns per scale group; -1 = one group per output row "
                                                  f"({method_default('group_size')}; {GGUF_BLOCK} with --target gguf)")
    sym = q.add_mutually_exclusive_group()
    sym.add_argument("--sym", dest="sym", action="store_true", default=True, help="symmetric grid (default)")
    sym.add_argument("--asym", dest="sym", action="store_false", help="asymmetric grid with an integer zero point")
    q.add_argument("--act-order", action="store_true", help="quantize columns by decreasing Hessian diagonal")
    q.add_argument("--group-act-order", action=argparse.BooleanOptionalAction,
                   help="process whole groups by decreasing Hessian diagonal, and the columns inside each group too "
                        "(GAR, GPTQModel's act_group_aware): the plain layout, no g_idx; --act-order overrides it "
                        f"({method_default('group_act_order')})")
    q.add_argument("--static-groups", action="store_true", help="group scales/zeros from the original weights (before GPTQ updates and act-order)")
    q.add_argument("--mse", action=argparse.BooleanOptionalAction,
                   help=f"search the scale on a shrink grid (min L2.4 error) ({method_default('mse')})")
    q.add_argument("--mse-weighted", action=argparse.BooleanOptionalAction,
                   help="weight each column's error in the --mse search by the Hessian diagonal (the inputs' mean "
                        "square: llama.cpp's importance matrix); needs --mse, not with --method rtn "
                        f"({method_default('mse_weighted')})")
    q.add_argument("--refit-scales", action=argparse.BooleanOptionalAction,
                   help="after the solver, refit every group scale of the stored codes by Hessian-weighted least "
                        "squares, per row kept only where the layer's calibration error shrinks (codes unchanged; "
                        f"not with --method rtn) ({method_default('refit_scales')})")
    q.add_argument("--target", choices=[t.value for t in Target], default=Target.ANY.value,
                   help="the runtime the codes are shaped for: any = the plain grid every export takes (GPTQ v1/v2, "
                        "compressed-tensors, GGUF); gguf = llama.cpp's grid, for `export --format gguf`: the "
                        f"signed scale of Q4_0/Q5_0/Q8_0 and their {GGUF_BLOCK}-column groups (or --kquant's)")
    q.add_argument("--signed-scale", action=argparse.BooleanOptionalAction,
                   help="symmetric grid whose scale takes the sign of the largest-|w| weight (llama.cpp Q4_0's grid) "
                        "(default: on with --target gguf, else off)")
    q.add_argument("--kquant", choices=[t.value for t in KQuantType],
                   help="put group scales on this GGUF K-quant's super-block lattice (one fp16 d per 256 columns, "
                        "small integer sub-scales), so `export --format gguf` writes it, and every K-quant with wider "
                        "sub-scales, exactly; symmetric grids, group size 16-128 (32-128 for q4_k/q5_k)")
    q.add_argument("--skip", action="append", default=[], metavar="REGEX",
                   help="leave block Linears whose module name matches unquantized (repeatable)")
    q.add_argument("--damp", type=float, help="relative Hessian damping (retried x10 if needed) "
                                              f"({method_default('damp')})")
    q.add_argument("--block-size", type=int, default=GPTQConfig.block_size, help="GPTQ lazy-update block size")
    q.add_argument("--no-true-sequential", dest="true_sequential", action="store_false",
                   help="quantize all Linears of a block from the same inputs")  # fmt: skip
    q.add_argument("--calib", help="calibration text file (UTF-8); required except for --method rtn")
    q.add_argument("--calib-range", type=fraction_range, default="0:1", help="character range START:END of --calib")
    q.add_argument("--nsamples", type=int, default=CalibConfig.nsamples, help="number of calibration windows")
    q.add_argument("--seqlen", type=int, default=CalibConfig.seqlen, help="tokens per calibration window")
    q.add_argument("--seed", type=int, default=0, help="seed for drawing the windows")
    q.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="model dtype while calibrating, and of the unquantized tensors written (auto: the model's "
                        "own). bfloat16 halves memory and is faster on CPUs with AVX512-BF16 or AMX, as "
                        "GPTQModel does on CPU; results then differ slightly. Hessians and the solver stay float32")
    q.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    q.add_argument("--resume", action="store_true",
                   help="continue a killed run from its last finished block (progress is kept in .OUT.resume beside "
                        "--out until the checkpoint is written)")  # fmt: skip
    add_device_option(q, "the model runs and the solver computes (the model in its own dtype, Hessians and solver in "
                   "float32); under torchrun, auto and cuda mean each process's own GPU")  # fmt: skip
    q.add_argument("--no-stream", dest="stream", action="store_false", default=None,
                   help="load the whole model into memory first instead of reading each block from its safetensors "
                        "files when it is quantized (the checkpoint is the same; streaming keeps one block in memory)")
    q.add_argument("--shard-size", type=float, default=SHARD_BYTES / 2**20, metavar="MB",
                   help="largest file of the written checkpoint in MiB (default %(default)g): a larger checkpoint is "
                        "written as model-0000k-of-0000N.safetensors shards with model.safetensors.index.json")
    q.add_argument("--quiet", action="store_true", help="no progress bars")

    e = sub.add_parser("eval", formatter_class=DefaultsHelpFormatter,
                       help="perplexity (and KL) and/or zero-shot accuracy of a model, checkpoint or parent widths")
    e.add_argument("model", help="unquantized model, matgptq checkpoint/parent, or GPTQ checkpoint: a directory or a "
                                  "Hugging Face id org/name[@revision]")
    e.add_argument("--text", help="evaluation text file (UTF-8) for perplexity; --text and/or --tasks is required")
    e.add_argument("--text-range", type=fraction_range, default="0:1", help="character range START:END of --text")
    e.add_argument("--seqlen", type=int, default=256, help="tokens per non-overlapping window")
    e.add_argument("--max-tokens", type=int, help="use only the first N tokens of the text")
    e.add_argument("--tasks", help="zero-shot multiple-choice tasks scored by lm-eval, e.g. arc_easy,piqa: each is "
                                   "<tasks-dir>/<name>.jsonl (needs pip install 'matgptq[tasks]')")
    e.add_argument("--tasks-dir", help="folder of <task>.jsonl files (default: $MATGPTQ_TASKS_DIR, else "
                                       "../shared/data/zero-shot relative to the current directory)")
    e.add_argument("--limit", type=int, help="score only the first N questions of each task")
    e.add_argument("--bits", help="widths to evaluate from a parent (e.g. 3,4,6,8) or a mix JSON file")
    e.add_argument("--kl-to", help="unquantized reference model (directory or Hugging Face id): also report "
                                        "KL(reference || model)")
    e.add_argument("--batch-size", type=int, default=None,
                   help="windows per forward pass (default: 2048 tokens' worth, i.e. 2048 // --seqlen, at least 1)")
    e.add_argument("--task-batch-size", type=int, default=16, help="lm-eval requests per forward pass (--tasks)")
    e.add_argument("--json", help="write the results as JSON to this file")
    add_device_option(e, "the models are scored")

    s = sub.add_parser("slice", help="write a standalone r-bit checkpoint (only the r-bit data) from a parent",
                       formatter_class=DefaultsHelpFormatter)
    s.add_argument("parent", help="matgptq parent checkpoint directory")
    s.add_argument("--bits", type=int, required=True, help="slice width r (2..master)")
    s.add_argument("--out", required=True, help="output checkpoint directory")
    s.add_argument("--overwrite", action="store_true", help="replace --out if it exists")

    from .exporters import add_export_parser
    from .allocation.cli import add_search_parser

    add_export_parser(sub)
    add_search_parser(sub)
    return p


def method_default(option: str) -> str:
    """The defaults of `option` per method for --help: "default: 128", or "default: on for gptq, off for rtn, ..."."""
    from .quantization.config import METHOD_DEFAULTS

    values = {m.value: d[option] for m, d in METHOD_DEFAULTS.items() if option in d}
    show = lambda v: ("on" if v else "off") if isinstance(v, bool) else str(v)  # noqa: E731
    if len(set(values.values())) == 1:
        return f"default: {show(next(iter(values.values())))}"
    return "default: " + ", ".join(f"{show(v)} for {m}" for m, v in values.items())


def cmd_quantize(a: argparse.Namespace) -> None:
    from .api import quantize
    from .execution import format_table

    t0 = time.perf_counter()
    out, reports = quantize(
        a.model, a.out, calib=a.calib, method=a.method, bits=a.bits, bits_config=a.bits_config, master_bits=a.master_bits,
        bit_weights=a.bit_weights, calib_range=a.calib_range, nsamples=a.nsamples, seqlen=a.seqlen, seed=a.seed,
        overwrite=a.overwrite, progress=not a.quiet, dtype=a.dtype, resume=a.resume, group_size=a.group_size, sym=a.sym,
        act_order=a.act_order, group_act_order=a.group_act_order, static_groups=a.static_groups, mse=a.mse, damp=a.damp, block_size=a.block_size,
        true_sequential=a.true_sequential, signed_scale=a.signed_scale, target=a.target, skip=tuple(a.skip), variant=a.variant,
        kquant=a.kquant, refit_scales=a.refit_scales, mse_weighted=a.mse_weighted, device=a.device, stream=a.stream,
        shard_bytes=int(a.shard_size * 2**20),
    )  # fmt: skip
    from .execution import world

    if world()[0] > 0:  # torchrun: the other ranks hold the same result; rank 0 reports it
        return
    widths = sorted({r for rep in reports for r in rep.rel_error})
    at = {r: [rep.rel_error[r] for rep in reports if r in rep.rel_error] for r in widths}  # a mix: its layers per width
    rows = [[f"{r}-bit", len(at[r]), sum(at[r]) / len(at[r]), max(at[r])] for r in widths]
    if rows:
        print(format_table(["width", "layers", "mean rel. output error", "max"], rows))
    print(f"wrote {out} ({len(reports)} layers, {time.perf_counter() - t0:.1f} s)")


def cmd_eval(a: argparse.Namespace) -> None:
    from .api import evaluate
    from .execution import format_table
    from .formats.mix import width_specs

    report = evaluate(a.model, bits=width_specs(a.bits) if a.bits else None, text=a.text, text_range=a.text_range,
                      seqlen=a.seqlen, max_tokens=a.max_tokens, kl_to=a.kl_to, tasks=a.tasks, tasks_dir=a.tasks_dir,
                      limit=a.limit, batch_size=a.batch_size, task_batch_size=a.task_batch_size,
                      device=a.device)  # fmt: skip
    results, task_results = report.get("results", []), report.get("task_results", [])
    if results:
        headers = ["model", "bits", "tokens", "ppl"] + (["kl"] if a.kl_to else [])
        print(format_table(headers, [[r[h] for h in headers] for r in results]))
    if task_results:
        print(("\n" if results else "") + format_table(["model", "bits", "task", "n", "acc", "acc_norm"],
              [[r["model"], r["bits"], r["task"], r["n"], r["acc"], r["acc_norm"]] for r in task_results]))  # fmt: skip
    if a.json:
        from .fsutil import atomic_output

        with atomic_output(a.json, overwrite=True, directory=False) as f:
            f.write_text(json.dumps(report, indent=2))


def cmd_slice(a: argparse.Namespace) -> None:
    from .api import slice as slice_parent

    out = slice_parent(a.parent, a.bits, a.out, a.overwrite)
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(f"wrote {a.out}: {a.bits}-bit slice, {size / 1e6:.2f} MB of tensors")


def _quiet_transformers() -> None:
    """Our own progress bars and one-line errors only: transformers' warnings and loading bars go to stderr."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    with _third_party_quiet():
        args = build_parser().parse_args(argv)
        _quiet_transformers()
        command = {"quantize": cmd_quantize, "eval": cmd_eval, "slice": cmd_slice, "search": _search}.get(args.command)
        try:
            (command or _export)(args)
        except UserError as e:
            _end_progress_bars()
            print(f"matgptq: error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            _end_progress_bars()
            print(f"matgptq: interrupted; {_left_behind(args)}", file=sys.stderr)
            return 130
    return 0


@contextmanager
def _third_party_quiet() -> Iterator[None]:
    """While a command runs, other libraries' deprecation and usage warnings are not shown (matgptq's own are), unless
    the user asked for warnings (-W, PYTHONWARNINGS), and the loggers of the backends transformers imports (torchao,
    torch's pytree: IMPORT_LOGGERS) log errors only; all as before afterwards."""
    format_warning = warnings.formatwarning
    with warnings.catch_warnings(), quiet_loggers(*IMPORT_LOGGERS):
        warnings.formatwarning = _one_line_warning
        if not sys.warnoptions:
            for category in (DeprecationWarning, FutureWarning, UserWarning):
                warnings.filterwarnings("ignore", category=category, module=r"(?!matgptq(\.|$))")
        try:
            yield
        finally:
            warnings.formatwarning = format_warning


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """A warning as the command's own line (`matgptq: warning: ...`), not Python's file:line and source excerpt."""
    return f"matgptq: warning: {message}\n"


def _end_progress_bars() -> None:
    """Close the progress bars still on screen, each ending its line, so that a message starts on a line of its own."""
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):
        bar.leave = True  # a closed bar that is not left would only return to the start of its line
        bar.close()


def _left_behind(a: argparse.Namespace) -> str:
    """What an interrupted command leaves: the resume state of quantize or search, else nothing (outputs are written
    atomically)."""
    states: list[Path] = []
    if a.command == "quantize":
        from .quantization.resume import resume_dir

        states = [resume_dir(a.out)]
    elif a.command == "search":
        from .allocation.runner import state_path

        states = [state_path(Path(a.out), b.strip()) for b in a.budget.split(",")]
    states = [p for p in states if p.exists()]
    if not states:
        return "nothing was written"
    again = "the same command again" if a.resume else "the same command with --resume"
    return f"the progress is kept in {', '.join(map(str, states))}; run {again} to continue"


def _search(a: argparse.Namespace) -> None:
    from .allocation.cli import cmd_search

    cmd_search(a)


def _export(a: argparse.Namespace) -> None:
    from .exporters import cmd_export

    cmd_export(a)


if __name__ == "__main__":
    sys.exit(main())
