"""Which GPTQ settings are `matgptq quantize --method gptq`'s defaults: an ablation against the peers, in one run.

Protocol (benchmarks/quality/real_model_table.py's; every row sees the same data):
  model        SmolLM2-135M-Instruct, the fp32 copy of `make real-model` (a dequantized Q4_1 model: its weights sit
               on a 4-bit asymmetric grid per 32 columns, so g32 numbers flatter round-to-nearest; decide on g128 and
               per channel), or any model directory with --calib/--text of its own (stories260K: TinyStories)
  grid         symmetric, --group-sizes (128 and -1 = per channel)
  calibration  --nsamples windows of --seqlen tokens drawn with each of --seeds from the second half (by characters)
               of the calibration text; the same token ids for every tool (the peers get them from a file)
  scoring      perplexity on the first --eval-windows windows of --eval-seqlen tokens of the text's *first* half,
               KL(fp32 ‖ model) on the same positions, ARC-Easy and PIQA through lm-eval (first --limit questions
               of each; 0 = none, the default: 500 questions cost about three times the perplexity's time, and their
               accuracy's standard error, ~2.2 points a task, is larger than most differences between these rows);
               every model in float32. --limit N on runs already scored without it quantizes them again (same
               seed, same windows) and adds the accuracies: the recorded time and memory stay, and the re-run's
               perplexity is recorded beside the first to show it is the same model
  time, RSS    end to end (load → calibrate → quantize → save), one child process per quantization (os.wait4's
               wall, CPU user+sys, peak RSS), --threads threads each; the load average is recorded beside each
Rows: every row spells every option of ALL (so a row means the same whatever the defaults are); `default` is the
command with no option but bits and group size, whatever the defaults are when it runs. The peers (GPTQModel 7.6.0
with its own defaults, llm-compressor 0.14 GPTQ with `bypass_divisibility_checks=True` so SmolLM2's 576 columns
quantize at g128) run from the bench venv (`make bench-venv`).
Results per (row, group size, bits) are the mean over seeds with the spread (max − min) beside it.

Rows: gptq_defaults_rows.py; the page: gptq_defaults_report.py; the guide's table of defaults and the README block:
gptq_defaults_blocks.py.
Resumable: every quantization and score is kept in --work (default runs/gptq-defaults/<model name>); a second run
continues where the first stopped. Writes docs/results/gptq_defaults.{json,md} (`python -m benchmarks.render_docs`
re-renders the page from the JSON alone).

    python -m benchmarks.quality.gptq_defaults [MODEL_DIR] [--rows a,b] [--bits 3,4] [--group-sizes 128,-1] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from pathlib import Path

from benchmarks._harness import RESULTS, ROOT, load_json, measured_child, write_atomic, write_block, write_page
from benchmarks._harness.smollm2 import BENCH_PYTHON, DEFAULT_MODEL, WIKI, ZERO_SHOT, peer_command
from benchmarks.quality._gptq_defaults_blocks import defaults_block, parent_block, readme_block
from benchmarks.quality._gptq_defaults_page import page
from benchmarks.quality._gptq_defaults_rows import AS_TYPED, PARENT_WIDTHS, PEER_GROUP, ROWS, flags, is_parent

OUT = RESULTS / "gptq_defaults.json"
BLOCKS = {
    "README.md#gptq-defaults": readme_block,
    "docs/guide/quantize.md#defaults": defaults_block,
    "docs/decisions/matgptq-defaults.md#parent-defaults": parent_block,
}  # render_docs lists them too
# A re-quantized run is the recorded model when its perplexity is within this relative distance of the recorded one.
# Measured: stories260K's default row quantized again on the same machine came back within 6e-9 of its record (the
# same codes; only summation order moves); GPTQModel's SmolLM2 3-bit seed 0, quantized again on another machine than
# its record's, came back 2.8% away (another model). 1e-5 lies far from both.
SAME_MODEL = 1e-5


def quantize(name: str, key: str, a, gs: int, bits: int, seed: int, ids_file: Path, out: Path) -> dict:
    """One end-to-end quantization in a child process; its wall, CPU, peak RSS (or the failing line)."""
    log = out.parent / f"{out.name}.log"  # not with_suffix: "damp0.05-g128-3-seed0" has a dot of its own
    # a killed run's state (quantization/resume.py): start afresh, so that CPU s counts the whole run
    shutil.rmtree(out.parent / f".{out.name}.resume", ignore_errors=True)
    if ROWS[name] == "peer":
        cmd = peer_command(
            name.split("-")[0],
            a.model,
            ids_file,
            out,
            bits,
            PEER_GROUP.get(name, gs),
            out.parent / f"{out.name}.report.json",
        )
    else:
        parent = is_parent(name)
        cmd = [
            sys.executable,
            "-m",
            "matgptq",
            "quantize",
            a.model,
            "--out",
            str(out),
            "--method",
            "matgptq" if parent else "gptq",
            "--bits",
            PARENT_WIDTHS if parent else str(bits),
            "--group-size",
            str(gs),
            "--calib",
            str(a.calib),
            "--calib-range",
            "0.5:1",
            *([] if ROWS[name] == AS_TYPED else ["--nsamples", str(a.nsamples), "--seqlen", str(a.seqlen)]),
            "--seed",
            str(seed),
            "--overwrite",
            "--quiet",
        ]
        cmd += flags(ROWS[name]) if isinstance(ROWS[name], dict) else []
    return {**measured_child(cmd, a.threads, log), "command": cmd[1:], "measured": measured_at()}


def measured_at() -> str:
    """When, on which commit of this tree and on which CPU a quantization ran (the page names the rows measured on
    another: their CPU seconds are not comparable with the others')."""
    import time

    from benchmarks._harness import cpu_name, git_commit

    return f"{time.strftime('%Y-%m-%d', time.gmtime())} at {git_commit() or 'an unknown commit'} on {cpu_name()}"


def dense_model(path: Path, bits: int | None = None):
    """The model a checkpoint holds (a parent's `bits`-bit slice), every weight dense float32: `matgptq.load` for
    float, matgptq and GPTQ checkpoints, transformers + compressed-tensors (decompressed on load) for
    llm-compressor's."""
    import torch

    config = load_json(Path(path) / "config.json")
    if config.get("quantization_config", {}).get("quant_method") == "compressed-tensors":
        from transformers import AutoModelForCausalLM
        from transformers.utils.quantization_config import CompressedTensorsConfig

        return AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True)
        )
    from matgptq.runtime import load

    return load(path, bits=bits, dtype=torch.float32)


def evaluate(path: Path, windows, teacher, specs, a, tokenizer, bits: int | None = None) -> dict:
    """Perplexity, KL to the float model and (with `specs`) zero-shot accuracy of one checkpoint (a parent's slice)."""
    from matgptq.evaluation.perplexity import score
    from matgptq.evaluation.tasks import score_tasks, with_average, wrap_model

    model = dense_model(path, bits)
    sc = score(model, windows, teacher, batch_size=1, progress=True, desc=Path(path).name)
    tasks = with_average(score_tasks(wrap_model(model, tokenizer, 16), specs, a.limit)) if specs else {}
    return {"ppl": sc.ppl, "kl": sc.kl, "tokens": sc.tokens, "tasks": tasks, "limit": a.limit if specs else 0}


def wants_tasks(run: dict, a) -> bool:
    """Whether a scored run lacks the zero-shot accuracies --limit asks for."""
    return bool(a.limit) and "eval" in run and run["eval"].get("limit", 0) != a.limit


def settings(a) -> dict:
    return {
        "model": str(Path(a.model).resolve()),
        "calib": str(Path(a.calib).resolve()),
        "nsamples": a.nsamples,
        "seqlen": a.seqlen,
        "eval_windows": a.eval_windows,
        "eval_seqlen": a.eval_seqlen,
        "threads": a.threads,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=str(DEFAULT_MODEL), help="the fp32 model directory (make real-model)")
    p.add_argument("--calib", default=str(WIKI), help="text: calibration from its second half, scoring its first")
    p.add_argument("--rows", default=",".join(ROWS), help=f"rows to run, from {','.join(ROWS)}")
    p.add_argument("--bits", default="3,4", help="widths")
    p.add_argument("--group-sizes", default="128,-1", help="group sizes (-1: per channel)")
    p.add_argument("--seeds", default="0,1,2", help="calibration seeds")
    p.add_argument("--nsamples", type=int, default=64, help="calibration windows")
    p.add_argument("--seqlen", type=int, default=512, help="tokens per calibration window")
    p.add_argument("--eval-windows", type=int, default=8, help="windows of --eval-seqlen tokens scored")
    p.add_argument("--eval-seqlen", type=int, default=2048, help="tokens per scored window")
    p.add_argument(
        "--limit",
        type=int,
        default=0,
        help="questions per zero-shot task (0: no zero-shot); runs scored without it are quantized again to add it",
    )
    p.add_argument(
        "--redo",
        action="store_true",
        help="drop the recorded runs of --rows x --group-sizes x --bits x "
        "--seeds and measure them again (rows measured at an older commit)",
    )
    p.add_argument("--threads", type=int, default=2, help="threads of every process")
    p.add_argument("--work", help="checkpoints and measurements (default runs/gptq-defaults/<model name>)")
    p.add_argument("--keep", action="store_true", help="keep the checkpoints (default: deleted once scored)")
    a = p.parse_args()
    rows = [r for r in a.rows.split(",") if r]
    if set(rows) - set(ROWS):
        p.error(f"unknown rows {sorted(set(rows) - set(ROWS))}")
    if not (Path(a.model) / "config.json").is_file():
        sys.exit(f"gptq_defaults: error: no model at {a.model}; run `make real-model` first")
    if any(r.startswith("llmcompressor") for r in rows) and importlib.util.find_spec("compressed_tensors") is None:
        sys.exit(
            "gptq_defaults: error: scoring llm-compressor's checkpoints needs compressed-tensors in this venv: "
            "pip install -c .ci/constraints.txt compressed-tensors"
        )
    a.widths = [int(b) for b in a.bits.split(",")]
    run(a, rows, a.widths, [int(g) for g in a.group_sizes.split(",")], [int(s) for s in a.seeds.split(",")])


def run(a, rows: list[str], widths: list[int], group_sizes: list[int], seeds: list[int]) -> None:
    import torch
    from safetensors.torch import save_file

    from matgptq.evaluation.perplexity import Teacher
    from matgptq.evaluation.tasks import resolve_tasks
    from matgptq.models import calibration_windows, eval_windows, load_tokenizer, read_text, tokenize
    from matgptq.runtime import load

    name = Path(a.model).resolve().name
    work = Path(a.work or ROOT / "runs" / "gptq-defaults" / name)
    work.mkdir(parents=True, exist_ok=True)
    everything = load_json(OUT) if OUT.is_file() else {"protocol": __doc__, "models": {}}
    state = everything["models"].setdefault(name, {"settings": settings(a), "runs": {}})
    state["settings"].pop("limit", None)  # recorded per run now ("eval"/"limit"), so runs with and without tasks mix
    if state["settings"] != settings(a):
        sys.exit(f"gptq_defaults: error: {OUT} holds {name} with other settings; remove its entry to start again")

    def save() -> None:
        everything["protocol"] = __doc__
        write_atomic(OUT, json.dumps(everything, indent=1))
        write_page(RESULTS / "gptq_defaults.md", page(everything))

    torch.set_num_threads(a.threads)
    tokenizer = load_tokenizer(a.model)
    windows = eval_windows(
        tokenize(tokenizer, read_text(a.calib, (0.0, 0.5))), a.eval_seqlen, a.eval_seqlen * a.eval_windows
    )
    specs = resolve_tasks("arc_easy,piqa", ZERO_SHOT) if a.limit else []
    calib_ids = tokenize(tokenizer, read_text(a.calib, (0.5, 1.0)))
    teacher = Teacher(load(a.model), windows, batch_size=1, progress=True)
    scoring = (windows, teacher, specs, tokenizer)
    if "fp32" not in state["runs"] or wants_tasks(state["runs"]["fp32"], a):
        state["runs"]["fp32"] = {"eval": evaluate(Path(a.model), windows, teacher, specs, a, tokenizer)}
        save()
    if a.redo:
        keys = {f"{r}/g{g}/{b}/seed{s}" for r in rows for g in group_sizes for b in widths for s in seeds}
        for key in keys & set(state["runs"]):
            del state["runs"][key]
        save()
    for seed in seeds:
        ids_file = work / f"ids-seed{seed}.safetensors"
        save_file({"ids": calibration_windows(calib_ids, a.nsamples, a.seqlen, seed).contiguous()}, str(ids_file))
        for gs in group_sizes:
            for bits in widths:
                for row in rows:
                    run_one(f"{row}/g{gs}/{bits}/seed{seed}", state, a, work, ids_file, scoring)
                    save()
    for where, block in BLOCKS.items():  # the hand-written pages' blocks, from the same JSON
        file, name = where.split("#")
        write_block(ROOT / file, name, block(everything))
    print(page(everything))


def this_pass(record: dict, again: bool) -> dict | None:
    """The finished quantization a record holds from this pass over the runs: the first one, or, when the runs are
    quantized `again` for the zero-shot, the re-run: kept as `requant` when it was the recorded model, moved to
    `quant` (the old one under `replaced`) when it was another."""
    if not again:
        q = record.get("quant")
    else:
        q = record.get("requant") or (record.get("quant") if "replaced" in record else None)
    return q if q and q.get("ok") else None


def run_one(key: str, state: dict, a, work: Path, ids_file: Path, scoring: tuple) -> None:
    """Quantize and score one (row, group, bits, seed) into state["runs"][key], unless it is there (scored, with the
    zero-shot --limit asks for, or its quantization failed: delete the entry to try again). A checkpoint quantized but
    not yet scored is scored; a scored run without the zero-shot is quantized again (the first time and memory kept)."""
    row, gs, bits, seed = key.split("/")
    gs, bits, seed = int(gs[1:]), int(bits), int(seed[4:])
    done = state["runs"].get(key, {})
    if ("eval" in done and not wants_tasks(done, a)) or done.get("quant", {}).get("ok") is False:
        return
    if ROWS[row] == "peer" and not BENCH_PYTHON.exists():
        print(f"  {key}: skipped (no {BENCH_PYTHON}: `make bench-venv` builds it)", flush=True)
        return
    parent = is_parent(row)  # one parent per (row, group, seed), each width scored as its slice
    out = work / (f"{row}-g{gs}-seed{seed}" if parent else key.replace("/", "-"))
    widths = {
        int(k.split("/")[2]): r
        for k, r in state["runs"].items()  # this parent's widths so far
        if parent and k.startswith(f"{row}/g{gs}/") and k.endswith(f"/seed{seed}")
    }
    # a checkpoint on disk counts only where a record says it was finished (a killed run leaves a partial one); a
    # parent's record may sit in another width's entry
    made = next(filter(None, (this_pass(r, "eval" in done) for r in {**widths, bits: done}.values())), None)
    if not (out.is_dir() and made):
        shutil.rmtree(out, ignore_errors=True)
        made = quantize(row, key, a, gs, bits, seed, ids_file, out)
    if "eval" in done:  # quantized again for the zero-shot: the first run's measurements stand
        done["requant"] = made
    else:
        done = state["runs"][key] = {"quant": made}
    q = done.get("requant", done["quant"])
    print(
        f"  {key}: {'ok' if q['ok'] else 'FAILED: ' + q['error']} CPU {q['cpu']:.0f} s, peak RSS {q['rss_gb']:.2f} GB",
        flush=True,
    )
    if q["ok"]:
        scored = evaluate(out, *scoring[:3], a, scoring[3], bits if parent else None)
        if "eval" in done and abs(scored["ppl"] / done["eval"]["ppl"] - 1) <= SAME_MODEL:  # the recorded model again
            scored["rerun_ppl"], scored["ppl"], scored["kl"] = scored["ppl"], done["eval"]["ppl"], done["eval"]["kl"]
        elif "eval" in done:  # another model (a peer on another machine): the re-run is the record now
            done["replaced"] = {"quant": done["quant"], "ppl": done["eval"]["ppl"], "kl": done["eval"]["kl"]}
            done["quant"] = done.pop("requant")
        done["eval"] = scored
        scored_all = {b for b, r in {**widths, bits: done}.items() if "eval" in r and not wants_tasks(r, a)}
        if not a.keep and not (parent and set(a.widths) - scored_all):  # a parent: once its last width is scored
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
