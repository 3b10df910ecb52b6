"""`matgptq eval`: parse, call `matgptq.evaluate`, print the tables (and write --json)."""

from __future__ import annotations

import argparse
import json

from ..api import evaluate
from ..execution import DTYPES, format_table
from ..formats.mix import width_specs
from ..fsutil import atomic_output
from .argtypes import DefaultsHelpFormatter, add_device_option, add_verify_option, fraction_range


def add_parser(sub) -> None:
    e = sub.add_parser(
        "eval",
        formatter_class=DefaultsHelpFormatter,
        help="perplexity (and KL) and/or zero-shot accuracy of a model, checkpoint or parent widths",
    )
    e.add_argument(
        "model",
        help="unquantized model, matgptq checkpoint/parent, or GPTQ or compressed-tensors "
        "checkpoint: a directory or a Hugging Face id org/name[@revision]",
    )
    e.add_argument("--text", help="evaluation text file (UTF-8) for perplexity; --text and/or --tasks is required")
    e.add_argument("--text-range", type=fraction_range, default="0:1", help="character range START:END of --text")
    e.add_argument("--seqlen", type=int, default=256, help="tokens per non-overlapping window")
    e.add_argument("--max-tokens", type=int, help="use only the first N tokens of the text")
    e.add_argument(
        "--tasks",
        help="zero-shot multiple-choice tasks scored by lm-eval, e.g. arc_easy,piqa: each is "
        "<tasks-dir>/<name>.jsonl (needs pip install 'matgptq[tasks]')",
    )
    e.add_argument(
        "--tasks-dir",
        help="folder of <task>.jsonl files (default: $MATGPTQ_TASKS_DIR; one of them is needed with --tasks)",
    )
    e.add_argument("--limit", type=int, help="score only the first N questions of each task")
    e.add_argument("--bits", help="widths to evaluate from a parent (e.g. 3,4,6,8) or a mix JSON file")
    e.add_argument(
        "--kl-to", help="unquantized reference model (directory or Hugging Face id): also report KL(reference || model)"
    )
    e.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="windows per forward pass (default: 2048 tokens' worth, i.e. 2048 // --seqlen, at least 1)",
    )
    e.add_argument("--task-batch-size", type=int, default=16, help="lm-eval requests per forward pass (--tasks)")
    e.add_argument(
        "--dtype",
        choices=list(DTYPES),
        default="auto",
        help="dtype the models compute in (auto: each model's own, except that a bfloat16 or float16 model "
        "on a CPU without arithmetic in it computes in float32, which holds its values exactly and "
        "runs several times faster there)",
    )
    e.add_argument("--json", help="write the results as JSON to this file")
    add_device_option(e, "the models are scored")
    add_verify_option(e)


def run(a: argparse.Namespace) -> None:
    report = evaluate(
        a.model,
        bits=width_specs(a.bits) if a.bits else None,
        text=a.text,
        text_range=a.text_range,
        seqlen=a.seqlen,
        max_tokens=a.max_tokens,
        kl_to=a.kl_to,
        tasks=a.tasks,
        tasks_dir=a.tasks_dir,
        limit=a.limit,
        batch_size=a.batch_size,
        task_batch_size=a.task_batch_size,
        device=a.device,
        dtype=a.dtype,
        verify=not a.no_verify,
    )
    results, task_results = report.get("results", []), report.get("task_results", [])
    if results:
        headers = ["model", "bits", "tokens", "ppl"] + (["kl"] if a.kl_to else [])
        print(format_table(headers, [[r[h] for h in headers] for r in results]))
    if task_results:
        print(
            ("\n" if results else "")
            + format_table(
                ["model", "bits", "task", "n", "acc", "acc_norm"],
                [[r["model"], r["bits"], r["task"], r["n"], r["acc"], r["acc_norm"]] for r in task_results],
            )
        )
    if a.json:
        with atomic_output(a.json, overwrite=True, directory=False) as f:
            f.write_text(json.dumps(report, indent=2))
