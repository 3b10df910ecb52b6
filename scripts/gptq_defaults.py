"""Which GPTQ settings are `matgptq quantize --method gptq`'s defaults: an ablation against the peers, in one run.

Protocol (scripts/real_model_table.py's; every row sees the same data):
  model        SmolLM2-135M-Instruct, the fp32 copy of `make real-model` (a dequantized Q4_1 model: its weights sit
               on a 4-bit asymmetric grid per 32 columns, so g32 numbers flatter round-to-nearest; decide on g128 and
               per channel), or any model directory with --calib/--text of its own (stories260K: TinyStories)
  grid         symmetric, --group-sizes (128 and -1 = per channel)
  calibration  --nsamples windows of --seqlen tokens drawn with each of --seeds from the second half (by characters)
               of the calibration text; the same token ids for every tool (the peers get them from a file)
  scoring      perplexity on the first --eval-windows windows of --eval-seqlen tokens of the text's *first* half,
               KL(fp32 ‖ model) on the same positions, ARC-Easy and PIQA through lm-eval (first --limit questions;
               0 = none, the default: 300 questions cost twice the perplexity's tokens, and their accuracy's standard
               error, ~2.8 points, is larger than any difference between these rows); every model in float32
  time, RSS    end to end (load → calibrate → quantize → save), one child process per quantization (os.wait4's
               wall, CPU user+sys, peak RSS), --threads threads each; the load average is recorded beside each
Rows: every row spells every option of ALL (so a row means the same whatever the defaults are); `default` is the
command with no option but bits and group size, whatever the defaults are when it runs. The peers (GPTQModel 7.6.0
with its own defaults, llm-compressor 0.14 GPTQ with `bypass_divisibility_checks=True` so SmolLM2's 576 columns
quantize at g128) run from the bench venv (`make bench-venv`).
Results per (row, group size, bits) are the mean over seeds with the spread (max − min) beside it.

Resumable: every quantization and score is kept in --work (default runs/gptq-defaults/<model name>); a second run
continues where the first stopped. Writes docs/results/gptq_defaults.{json,md} (`python scripts/render_docs.py`
re-renders the page from the JSON alone).

    python scripts/gptq_defaults.py [MODEL_DIR] [--rows a,b] [--bits 3,4] [--group-sizes 128,-1] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from _docs import RESULTS, header, load_json, write_page
from bench_pipeline import measured_child
from real_model_table import BENCH_PYTHON, DEFAULT_MODEL, WIKI

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # score with this tree's package, as the quantizing children (PYTHONPATH) do
SHARED = ROOT.parent / "shared"
OUT = RESULTS / "gptq_defaults.json"
# Every GPTQ option the ablation turns, at its value before the ablation (all off, damping 0.01, the model's dtype).
ALL = {"group_act_order": False, "act_order": False, "static_groups": False, "damp": 0.01, "mse": False,
       "mse_weighted": False, "refit_scales": False, "true_sequential": True, "dtype": "auto"}  # fmt: skip
GAR = {"group_act_order": True}
ROWS = {
    "default": None,  # no option at all: the defaults as they are when the script runs
    "plain": {},  # every option off: the defaults before this ablation
    "gar": GAR,
    "gar-damp0.05": {**GAR, "damp": 0.05},
    "gar-mse": {**GAR, "mse": True},
    "gar-mse-w": {**GAR, "mse": True, "mse_weighted": True},
    "gar-refit": {**GAR, "refit_scales": True},
    "gar-mse-w-refit": {**GAR, "mse": True, "mse_weighted": True, "refit_scales": True},
    # the same calibrating in bfloat16, as GPTQModel does on a CPU (and as `--dtype auto` does for a bf16 model)
    "gar-mse-w-refit-bf16": {**GAR, "mse": True, "mse_weighted": True, "refit_scales": True, "dtype": "bfloat16"},
    "gar-not-seq": {**GAR, "true_sequential": False},
    "gar-bf16": {**GAR, "dtype": "bfloat16"},
    "ao-static": {"act_order": True, "static_groups": True},
    "ao-static-damp0.05": {"act_order": True, "static_groups": True, "damp": 0.05},
    # one MatGPTQ parent per seed (target widths PARENT_WIDTHS), each width scored as its slice: `matgptq-parent` with
    # the plain options (MatGPTQ's defaults), then with GPTQ's scale choice (`--method matgptq` re-checked, item 2)
    "matgptq-parent": {"method": "matgptq"},
    "matgptq-parent-gar-mse-w-refit": {"method": "matgptq", **GAR, "mse": True, "mse_weighted": True,
                                       "refit_scales": True},
    "gptqmodel": "peer",
    "llmcompressor": "peer",
    "llmcompressor-g64": "peer",  # where it cannot run the row's group size: the largest it runs on SmolLM2 (576 columns)
}  # fmt: skip
PEER_GROUP = {"llmcompressor-g64": 64}
PARENT_WIDTHS = "3,4,8"
PEER_LABELS = {"gptqmodel": "GPTQModel 7.6.0 (its defaults)", "llmcompressor": "llm-compressor 0.14 (its defaults)",
               "llmcompressor-g64": "llm-compressor 0.14 (its defaults) at g64"}


def options(row: dict) -> list[str]:
    """The command-line options of a row, every option of ALL spelled out."""
    s = {**ALL, **{k: v for k, v in row.items() if k != "method"}}
    out = [f"--{'' if s[k] else 'no-'}{k.replace('_', '-')}" for k in ("group_act_order", "mse", "mse_weighted",
                                                                        "refit_scales")]  # fmt: skip
    out += ["--act-order"] * s["act_order"] + ["--static-groups"] * s["static_groups"]
    out += [] if s["true_sequential"] else ["--no-true-sequential"]
    return out + ["--damp", str(s["damp"]), "--dtype", s["dtype"]]


def quantize(name: str, key: str, a, gs: int, bits: int, seed: int, ids_file: Path, out: Path) -> dict:
    """One end-to-end quantization in a child process; its wall, CPU, peak RSS (or the failing line)."""
    log = out.with_suffix(".log")
    if ROWS[name] == "peer":
        cmd = [str(BENCH_PYTHON), str(ROOT / "scripts" / "bench_pipeline.py"), "--worker", name.split("-")[0], a.model,
               "--ids", str(ids_file), "--out-model", str(out), "--bits", str(bits), "--group-size",
               str(PEER_GROUP.get(name, gs)), "--report",
               str(out.with_suffix(".report.json"))]  # fmt: skip
    else:
        parent = is_parent(name)
        cmd = [sys.executable, "-m", "matgptq", "quantize", a.model, "--out", str(out), "--method",
               "matgptq" if parent else "gptq", "--bits", PARENT_WIDTHS if parent else str(bits), "--group-size",
               str(gs), "--calib", str(a.calib), "--calib-range", "0.5:1", "--nsamples", str(a.nsamples), "--seqlen",
               str(a.seqlen), "--seed", str(seed), "--overwrite", "--quiet"]  # fmt: skip
        cmd += [] if ROWS[name] is None else options(ROWS[name])
    return {**measured_child(cmd, a.threads, log), "command": cmd[1:]}


def is_parent(row: str) -> bool:
    return isinstance(ROWS[row], dict) and ROWS[row].get("method") == "matgptq"


def dense_model(path: Path, bits: int | None = None):
    """The model a checkpoint holds (a parent's `bits`-bit slice), every weight dense float32: `matgptq.load` for
    float, matgptq and GPTQ checkpoints, transformers + compressed-tensors (decompressed on load) for
    llm-compressor's."""
    import torch

    config = load_json(Path(path) / "config.json")
    if config.get("quantization_config", {}).get("quant_method") == "compressed-tensors":
        from transformers import AutoModelForCausalLM
        from transformers.utils.quantization_config import CompressedTensorsConfig

        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                    quantization_config=CompressedTensorsConfig(dequantize=True))  # fmt: skip
    from matgptq.runtime import load

    return load(path, bits=bits, dtype=torch.float32)


def evaluate(path: Path, windows, teacher, specs, a, tokenizer, bits: int | None = None) -> dict:
    """Perplexity, KL to the float model and (with `specs`) zero-shot accuracy of one checkpoint (a parent's slice)."""
    from matgptq.evaluation.perplexity import score
    from matgptq.evaluation.tasks import score_tasks, with_average, wrap_model

    model = dense_model(path, bits)
    sc = score(model, windows, teacher, batch_size=1, progress=True, desc=Path(path).name)
    tasks = with_average(score_tasks(wrap_model(model, tokenizer, 16), specs, a.limit)) if specs else {}
    return {"ppl": sc.ppl, "kl": sc.kl, "tokens": sc.tokens, "tasks": tasks}


def settings(a) -> dict:
    return {"model": str(Path(a.model).resolve()), "calib": str(Path(a.calib).resolve()), "nsamples": a.nsamples, "seqlen": a.seqlen,
            "eval_windows": a.eval_windows, "eval_seqlen": a.eval_seqlen, "limit": a.limit, "threads": a.threads}  # fmt: skip


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
    p.add_argument("--limit", type=int, default=0, help="questions per zero-shot task (0: no zero-shot)")
    p.add_argument("--threads", type=int, default=2, help="threads of every process")
    p.add_argument("--work", help="checkpoints and measurements (default runs/gptq-defaults/<model name>)")
    p.add_argument("--keep", action="store_true", help="keep the checkpoints (default: deleted once scored)")
    a = p.parse_args()
    rows = [r for r in a.rows.split(",") if r]
    if set(rows) - set(ROWS):
        p.error(f"unknown rows {sorted(set(rows) - set(ROWS))}")
    if not (Path(a.model) / "config.json").is_file():
        sys.exit(f"gptq_defaults: error: no model at {a.model}; run `make real-model` first")
    a.widths = [int(b) for b in a.bits.split(",")]
    run(a, rows, a.widths, [int(g) for g in a.group_sizes.split(",")],
        [int(s) for s in a.seeds.split(",")])  # fmt: skip


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
    if state["settings"] != settings(a):
        sys.exit(f"gptq_defaults: error: {OUT} holds {name} with other settings; remove its entry to start again")

    def save() -> None:
        everything["protocol"] = __doc__
        tmp = OUT.with_suffix(".tmp")
        tmp.write_text(json.dumps(everything, indent=1))
        tmp.replace(OUT)
        write_page(RESULTS / "gptq_defaults.md", page(everything))

    torch.set_num_threads(a.threads)
    tokenizer = load_tokenizer(a.model)
    windows = eval_windows(tokenize(tokenizer, read_text(a.calib, (0.0, 0.5))), a.eval_seqlen,
                           a.eval_seqlen * a.eval_windows)  # fmt: skip
    specs = resolve_tasks("arc_easy,piqa", SHARED / "data" / "zero-shot") if a.limit else []
    calib_ids = tokenize(tokenizer, read_text(a.calib, (0.5, 1.0)))
    teacher = Teacher(load(a.model), windows, batch_size=1, progress=True)
    scoring = (windows, teacher, specs, tokenizer)
    if "fp32" not in state["runs"]:
        state["runs"]["fp32"] = {"eval": evaluate(Path(a.model), windows, teacher, specs, a, tokenizer)}
        save()
    for seed in seeds:
        ids_file = work / f"ids-seed{seed}.safetensors"
        save_file({"ids": calibration_windows(calib_ids, a.nsamples, a.seqlen, seed).contiguous()}, str(ids_file))
        for gs in group_sizes:
            for bits in widths:
                for row in rows:
                    run_one(f"{row}/g{gs}/{bits}/seed{seed}", state, a, work, ids_file, scoring)
                    save()
    print(page(everything))


def run_one(key: str, state: dict, a, work: Path, ids_file: Path, scoring: tuple) -> None:
    """Quantize and score one (row, group, bits, seed) into state["runs"][key], unless it is there (scored, or its
    quantization failed: delete the entry to try again). A checkpoint quantized but not yet scored is scored."""
    import shutil

    row, gs, bits, seed = key.split("/")
    gs, bits, seed = int(gs[1:]), int(bits), int(seed[4:])
    done = state["runs"].get(key, {})
    if "eval" in done or done.get("quant", {}).get("ok") is False:
        return
    if ROWS[row] == "peer" and not BENCH_PYTHON.exists():
        print(f"  {key}: skipped (no {BENCH_PYTHON}: `make bench-venv` builds it)", flush=True)
        return
    parent = is_parent(row)  # one parent per (row, group, seed), each width scored as its slice
    out = work / (f"{row}-g{gs}-seed{seed}" if parent else key.replace("/", "-"))
    siblings = [k for k in state["runs"] if parent and k.startswith(f"{row}/g{gs}/") and k.endswith(f"/seed{seed}")]
    made = next((state["runs"][k]["quant"] for k in siblings if state["runs"][k].get("quant", {}).get("ok")), None)
    if not (done.get("quant", {}).get("ok") and out.is_dir()):
        q = made if made and out.is_dir() else quantize(row, key, a, gs, bits, seed, ids_file, out)
        done = state["runs"][key] = {"quant": q}
    q = done["quant"]
    print(f"  {key}: {'ok' if q['ok'] else 'FAILED: ' + q['error']} CPU {q['cpu']:.0f} s, peak RSS {q['rss_gb']:.2f} GB",
          flush=True)  # fmt: skip
    if q["ok"]:
        done["eval"] = evaluate(out, *scoring[:3], a, scoring[3], bits if parent else None)
        scored = {int(k.split("/")[2]) for k, r in state["runs"].items()
                  if k.startswith(f"{row}/g{gs}/") and k.endswith(f"/seed{seed}") and "eval" in r}  # fmt: skip
        if not a.keep and not (parent and set(a.widths) - scored):  # a parent: once its last width is scored
            shutil.rmtree(out, ignore_errors=True)


def summary(runs: dict) -> list[dict]:
    """One row per (row, group size, bits): mean and spread (max − min) over the seeds measured."""
    groups: dict[tuple, list[dict]] = {}
    for key, r in runs.items():
        if key != "fp32" and "eval" in r:
            row, gs, bits, _ = key.split("/")
            groups.setdefault((row, int(gs[1:]), int(bits)), []).append(r)
    out = []
    for (row, gs, bits), rs in groups.items():
        s = {"row": row, "group_size": gs, "bits": bits, "seeds": len(rs)}
        for name, get in (("ppl", lambda r: r["eval"]["ppl"]), ("kl", lambda r: r["eval"]["kl"]),
                          ("acc", lambda r: r["eval"]["tasks"].get("average", {}).get("acc")),
                          ("cpu", lambda r: r["quant"]["cpu"]), ("rss", lambda r: r["quant"]["rss_gb"]),
                          ("load", lambda r: r["quant"].get("load_average"))):  # fmt: skip
            values = [v for v in map(get, rs) if v is not None]
            if values:
                s[name], s[name + "_spread"] = statistics.fmean(values), max(values) - min(values)
        out.append(s)
    order = list(ROWS)
    return sorted(out, key=lambda s: (s["group_size"] == -1, s["bits"], order.index(s["row"])))


def page(data: dict) -> str:
    """docs/results/gptq_defaults.md from its JSON alone."""
    from matgptq.execution import format_table

    parts = [header("gptq_defaults.py", "gptq_defaults.json")]
    for name, m in data["models"].items():
        s = m["settings"]
        rows = summary(m["runs"])
        parts.append(f"## {name}\n\nCalibration {s['nsamples']} x {s['seqlen']} tokens from the second half of "
                     f"`{Path(s['calib']).name}`; perplexity and KL on the first {s['eval_windows']} x "
                     f"{s['eval_seqlen']} tokens of its first half; {s['threads']} threads. Each cell: mean over the "
                     "seeds, ± the spread (max − min). CPU s and peak RSS: the quantizing process's own (os.wait4); "
                     "load is the machine's 1-minute load average when it ended (2 cores: above 2, other work shared "
                     "them and inflated CPU s).")  # fmt: skip
        cell = lambda r, k, f: "-" if k not in r else f"{r[k]:{f}} ± {r[k + '_spread']:{f}}"  # noqa: E731
        tasks = any("acc" in r for r in rows)
        body = [[PEER_LABELS.get(r["row"], r["row"]), r["group_size"], r["bits"], r["seeds"], cell(r, "ppl", ".3f"),
                 cell(r, "kl", ".4f")] + ([cell(r, "acc", ".4f")] if tasks else []) +
                [cell(r, "cpu", ".0f"), cell(r, "rss", ".2f"), f"{r['load']:.1f}", ratio(r, rows, "ppl"),
                 ratio(r, rows, "kl")] for r in rows]  # fmt: skip
        fp = m["runs"].get("fp32", {}).get("eval")
        if fp:
            acc = [f"{fp['tasks']['average']['acc']:.4f}" if fp.get("tasks") else "-"] if tasks else []
            body.insert(0, ["fp32", "-", 32, "-", f"{fp['ppl']:.3f}", "0"] + acc + ["-"] * 5)
        parts.append(format_table(["row", "group", "bits", "seeds", "ppl", "KL to fp32"] + (["zero-shot acc"] if tasks
                                  else []) + ["CPU s", "peak RSS GB", "load", "ppl / best peer's",
                                              "KL / best peer's"], body))  # fmt: skip
        fails = sorted({f"- {k}: `{r['quant']['error']}`" for k, r in m["runs"].items() if not r.get("quant", {}).get("ok", True)})
        if fails:
            parts.append("Failed:\n" + "\n".join(fails))
    ran = {k.split("/")[0] for m in data["models"].values() for k in m["runs"]}
    parts.append("Rows (every option spelled out; `default` passes none):\n\n" + "\n".join(
        f"- `{k}`: " + ("the peer's own defaults" if v == "peer" else "no option" if v is None else
                        f"--method matgptq --bits {PARENT_WIDTHS} " * is_parent(k) + " ".join(options(v))) + (f" (group size {PEER_GROUP[k]})" if k in PEER_GROUP else "")
        for k, v in ROWS.items() if k in ran))  # fmt: skip
    return "\n\n".join(parts) + "\n"


def _cells(data: dict, model: str = "SmolLM2-135M-Instruct", group: int = 128) -> dict[tuple[str, int], dict]:
    """(row, bits) -> its summary, for one model and group size."""
    runs = data["models"].get(model, {}).get("runs", {})
    return {(r["row"], r["bits"]): r for r in summary(runs) if r["group_size"] == group}


def _step(cells: dict, before: str, after: str, after_cells: dict | None = None) -> str:
    """What going from row `before` to row `after` (of `after_cells`, default the same cells) did, per width:
    perplexity and KL ratios (seed means)."""
    parts = []
    for bits in (3, 4):
        a, b = cells.get((before, bits)), (cells if after_cells is None else after_cells).get((after, bits))
        if a and b:
            parts.append(f"{bits}-bit ppl ×{b['ppl'] / a['ppl']:.2f}, KL ×{b['kl'] / a['kl']:.2f} ({min(a['seeds'], b['seeds'])} seed"
                         f"{'s' if min(a['seeds'], b['seeds']) > 1 else ''})")  # fmt: skip
    return "; ".join(parts) or "not measured"


def defaults_block(data: dict) -> str:
    """docs/guide/quantize.md's table of defaults: each method's value (METHOD_DEFAULTS, the code) and, for GPTQ, what
    the ablation measured for it on SmolLM2-135M-Instruct at g128 (docs/results/gptq_defaults.json)."""
    from matgptq.quantization.config import METHOD_DEFAULTS, Method

    cells = _cells(data)
    show = lambda v: ("on" if v else "off") if isinstance(v, bool) else str(v)  # noqa: E731
    value = lambda k: " / ".join(show(METHOD_DEFAULTS[m][k]) for m in (Method.GPTQ, Method.MATGPTQ, Method.RTN))  # noqa: E731
    why = {
        "group_size": "the field's default (GPTQModel, llm-compressor, vLLM's kernels); -1 (one scale per row) stores "
                      "0.125 fewer bits per weight; -1 → 128 for `default`: " + _step(_cells(data, group=-1), "default",
                                                                             "default", cells),
        "group_act_order": "GAR, GPTQModel's default; plain → `gar`: " + _step(cells, "plain", "gar"),
        "mse": "the scale searched, its error weighted by H_kk, the codes' scales refit by least squares; "
               "`gar` → `gar-mse-w-refit`: " + _step(cells, "gar", "gar-mse-w-refit"),
        "damp": "GPTQ's and llm-compressor's; not ablated here",
    }  # fmt: skip
    rows = [("`--group-size`", value("group_size"), why["group_size"]),
            ("`--group-act-order`", value("group_act_order"), why["group_act_order"]),
            ("`--mse`, `--mse-weighted`, `--refit-scales`", " / ".join(
                "on" if all(METHOD_DEFAULTS[m][k] for k in ("mse", "mse_weighted", "refit_scales")) else "off"
                for m in (Method.GPTQ, Method.MATGPTQ, Method.RTN)), why["mse"]),
            ("`--damp`", value("damp"), why["damp"])]  # fmt: skip
    lines = ["| option | gptq / matgptq / rtn | why (SmolLM2-135M-Instruct, g128; [gptq_defaults](../results/gptq_defaults.md)) |",
             "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]  # fmt: skip
    lines += ["", "MatGPTQ and RTN keep their former options (only the group size changed): the ablation has not "
              "measured the new ones on a parent yet. `--nsamples`, `--seqlen` and `--dtype` were not ablated."]  # fmt: skip
    return "\n".join(lines)


def readme_block(data: dict) -> str:
    """The README's comparison: `quantize --method gptq` with no options against the peers' defaults, seed means."""
    cells = _cells(data)
    peers = [p for p in ("gptqmodel", "llmcompressor", "llmcompressor-g64") if any(k[0] == p for k in cells)]
    head = "| bits | matgptq, no options | " + " | ".join(PEER_LABELS[p] for p in peers) + " | ours / best peer |"
    lines = [head, "|---" * (3 + len(peers)) + "|"]
    def fmt(r: dict | None) -> str:
        if r is None:
            return "not run"
        spread = f"± {r['ppl_spread']:.1f}" if r["seeds"] > 1 else "(1 seed)"
        return f"{r['ppl']:.1f} {spread} (KL {r['kl']:.3f})"

    for bits in (3, 4):
        ours = cells.get(("default", bits))
        if not ours:
            continue
        got = [cells.get((p, bits)) for p in peers]
        found = [g for g in got if g]
        versus = (f"ppl ×{ours['ppl'] / min(g['ppl'] for g in found):.2f}, KL ×{ours['kl'] / min(g['kl'] for g in found):.2f}"
                  if found else "-")  # fmt: skip
        lines.append(f"| {bits} | {fmt(ours)} | " + " | ".join(fmt(g) for g in got) + f" | {versus} |")
    n = min((c["seeds"] for k, c in cells.items() if k[0] == "default"), default=0)
    return "\n".join(lines) + (f"\n\nWikiText-2 perplexity ± its spread over {n} calibration seeds (and KL to the "
                               "float model) of SmolLM2-135M-Instruct at group size 128, every tool on the same "
                               "windows; llm-compressor cannot quantize its 576-column layers at 128, so it runs at 64 "
                               "([gptq_defaults](docs/results/gptq_defaults.md): the ablation, CPU time, memory).")  # fmt: skip


def plot_page(data: dict, path: Path) -> None:
    """docs/results/gptq_defaults.png from its JSON: perplexity and KL per row at g128, seed means with the spread."""
    from _docs import pyplot, save_figure

    cells = _cells(data)
    rows = [r for r in ROWS if any(k[0] == r for k in cells)]
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "ppl", "WikiText-2 perplexity"), (axes[1], "kl", "KL to the float model")):
        for i, bits in enumerate((3, 4)):
            got = [(n, cells[(n, bits)]) for n in rows if (n, bits) in cells]
            x = [j + 0.4 * i for j in range(len(got))]
            ax.bar(x, [c[key] for _, c in got], width=0.4, label=f"{bits}-bit",
                   yerr=[c[key + "_spread"] / 2 for _, c in got], capsize=3)  # fmt: skip
        names = [PEER_LABELS.get(n, n).replace(" (its defaults)", "") for n in rows]
        ax.set_xticks([j + 0.2 for j in range(len(rows))], names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(label + " (lower is better)")
        ax.legend(fontsize=8)
    fig.suptitle("SmolLM2-135M-Instruct, g128: GPTQ options and the peers' defaults (bars: seed mean, whiskers: spread)")
    save_figure(fig, path)


def ratio(r: dict, rows: list[dict], key: str) -> str:
    """`key` (ppl or kl) of row r over the best peer's at the same group size and width."""
    peers = [p for p in rows if p["row"] in PEER_LABELS and (p["group_size"], p["bits"]) == (r["group_size"], r["bits"])
             and key in p]  # fmt: skip
    if not peers or key not in r:
        return "-"
    return f"{r[key] / min(p[key] for p in peers):.3f}"


if __name__ == "__main__":
    main()
