"""The paper's Table 1 (seed 001, §5.1) on SmolLM2-135M-Instruct, peers side by side: `make real-model-table`.

Protocol (every row sees the same data):
  model        the fp32 reference of `make real-model`
  grid         group size 128 (--group-size), symmetric: the paper's setting
  calibration  --nsamples windows of --seqlen tokens, --seed, drawn from the second half (by characters) of the
               WikiText-2 test text; the same token ids for every tool (matgptq draws them itself with the same
               function, calibration_windows; the peers get them from a file)
  perplexity   the first --eval-windows non-overlapping windows of 2048 tokens of the *first* half of the same text
               (never calibrated on); KL(fp32 ‖ model) on the same positions (streamed teacher, exact)
  zero-shot    ARC-Easy and PIQA through lm-eval (matgptq eval --tasks), first --limit questions of each
  scoring      every model in float32 (a checkpoint calibrated in bf16 stores bf16 embeddings; they are upcast)
  time, RSS    end to end (load → calibrate → quantize → save), one child process per quantization, os.wait4's
               wall, CPU (user+sys) and peak RSS; --threads threads each
Rows: fp32; RTN 3/4; GPTQ 3/4/6/8 (matgptq with plain options: no column order, the min-max grid, no scale refit:
the defaults before benchmarks/quality/gptq_defaults.py chose new ones; the model's float32); GPTQ 4 with --dtype bfloat16 (the
dtype GPTQModel calibrates in on CPU); GPTQ 3/4 with GPTQModel's default settings (--act-order --static-groups --damp 0.05); two
MatGPTQ parents (c = 8, R = {3,4,8}; the published algorithm and the default variant) sliced at 3/4/6/8; and, when the
bench venv is there
(.venv-bench, `make bench-venv`), GPTQModel 7.6.0 and llm-compressor 0.14 GPTQ at 3 and 4 bits (benchmarks/speed/pipeline.py's
workers), evaluated by the same code as ours (GPTQModel writes a GPTQ checkpoint, which `matgptq.load` reads).

Resumable: checkpoints and measurements are kept in --work (default runs/real-model-table); a second run continues
where the first stopped (a quantization killed half-way is redone). Writes docs/results/real_model_table.{json,md,png}
as measurements come in (page and figure are rendered from the JSON alone: `python -m benchmarks.render_docs`).

    python -m benchmarks.quality.real_model_table [MODEL_DIR] [--quick] [--rows NAME,...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks._harness import (
    RESULTS,
    ROOT,
    format_table,
    header,
    measured_child,
    pyplot,
    save_figure,
    write_atomic,
    write_page,
)
from benchmarks._harness.smollm2 import BENCH_PYTHON, DEFAULT_MODEL, WIKI, ZERO_SHOT, evaluate, peer_command

# name: (tool, quantization widths, widths evaluated)
QUANTS = {
    "rtn3": ("rtn", (3,), (3,)),
    "rtn4": ("rtn", (4,), (4,)),
    "gptq3": ("gptq", (3,), (3,)),
    "gptq4": ("gptq", (4,), (4,)),
    "gptq6": ("gptq", (6,), (6,)),
    "gptq8": ("gptq", (8,), (8,)),
    "gptq4-bf16": ("gptq-bf16", (4,), (4,)),
    "gptq3-ao": ("gptq-ao", (3,), (3,)),
    "gptq4-ao": ("gptq-ao", (4,), (4,)),
    "matgptq348-paper": ("matgptq-paper", (3, 4, 8), (3, 4, 6, 8)),
    "matgptq348": ("matgptq", (3, 4, 8), (3, 4, 6, 8)),
    "gptqmodel3": ("gptqmodel", (3,), (3,)),
    "gptqmodel4": ("gptqmodel", (4,), (4,)),
    "llmcompressor3": ("llmcompressor", (3,), (3,)),
    "llmcompressor4": ("llmcompressor", (4,), (4,)),
}
LABELS = {
    "rtn": "RTN",
    "gptq": "GPTQ (matgptq, plain options)",
    "gptq-bf16": "GPTQ (matgptq, plain options, bf16 calibration)",
    "gptq-ao": "GPTQ (matgptq, --act-order --static-groups --damp 0.05)",
    "matgptq-paper": "MatGPTQ slice (one parent, --variant paper)",
    "matgptq": "MatGPTQ slice (one parent, default per-width-scales)",
    "gptqmodel": "GPTQModel 7.6.0",
    "llmcompressor": "llm-compressor 0.14",
}
PEERS = ("gptqmodel", "llmcompressor")


def settings(a: argparse.Namespace) -> dict:
    return {
        "model": str(Path(a.model).resolve()),
        "group_size": a.group_size,
        "nsamples": a.nsamples,
        "seqlen": a.seqlen,
        "seed": a.seed,
        "eval_windows": a.eval_windows,
        "limit": a.limit,
        "threads": a.threads,
    }


def quantize(
    name: str,
    a: argparse.Namespace,
    work: Path,
    ids_file: Path | None,
    out: Path | None = None,
    bits: tuple[int, ...] | None = None,
) -> dict:
    """One end-to-end quantization in a child process into `out` (default work/name); returns its wall, CPU and peak
    RSS (or the failure line). `bits`: other target widths than the row's (a MatGPTQ parent with another R)."""
    tool, row_bits, _ = QUANTS[name]
    bits = bits or row_bits
    out, log = out or work / name, work / f"{name}.log"
    if tool in PEERS:
        cmd = peer_command(tool, a.model, ids_file, out, bits[0], a.group_size, work / f"{name}.report.json")
    else:
        method = {
            "rtn": "rtn",
            "gptq": "gptq",
            "gptq-bf16": "gptq",
            "gptq-ao": "gptq",
            "matgptq": "matgptq",
            "matgptq-paper": "matgptq",
        }[tool]
        cmd = [
            sys.executable,
            "-m",
            "matgptq",
            "quantize",
            a.model,
            "--out",
            str(out),
            "--method",
            method,
            "--bits",
            ",".join(map(str, bits)),
            "--group-size",
            str(a.group_size),
            "--overwrite",
            "--quiet",
        ]
        if method != "rtn":
            cmd += [
                "--calib",
                str(WIKI),
                "--calib-range",
                "0.5:1",
                "--nsamples",
                str(a.nsamples),
                "--seqlen",
                str(a.seqlen),
                "--seed",
                str(a.seed),
            ]
        if tool == "matgptq-paper":
            cmd += ["--variant", "paper"]
        if tool == "gptq-bf16":
            cmd += ["--dtype", "bfloat16"]
        if tool == "gptq-ao":  # GPTQModel's defaults: damp 0.05, act-order that keeps each group's columns together
            cmd += ["--act-order", "--static-groups", "--damp", "0.05"]
        if tool in ("gptq", "gptq-bf16"):  # the natural column order, as these rows were measured
            cmd += ["--no-act-order"]
        if tool in ("gptq", "gptq-bf16", "gptq-ao"):  # the options these rows were measured with, whatever the defaults
            cmd += ["--no-group-act-order", "--no-mse", "--no-mse-weighted", "--no-refit-scales"]
    return measured_child(cmd, a.threads, log)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=str(DEFAULT_MODEL), help="the fp32 model directory (make real-model)")
    p.add_argument("--group-size", type=int, default=128, help="columns per scale group (paper: 128)")
    p.add_argument("--nsamples", type=int, default=64, help="calibration windows")
    p.add_argument("--seqlen", type=int, default=512, help="tokens per calibration window")
    p.add_argument("--seed", type=int, default=0, help="seed of the calibration draw")
    p.add_argument("--eval-windows", type=int, default=32, help="WikiText-2 windows of 2048 tokens scored")
    p.add_argument("--limit", type=int, default=300, help="questions per zero-shot task")
    p.add_argument("--threads", type=int, default=2, help="threads of every process")
    p.add_argument("--rows", default=",".join(QUANTS), help=f"quantizations to run, from {','.join(QUANTS)}")
    p.add_argument("--work", default=str(ROOT / "runs" / "real-model-table"), help="checkpoints and measurements")
    p.add_argument("--render-only", action="store_true", help="re-render the JSON, page and figure from --work")
    return p


def main() -> None:
    p = build_parser()
    a = p.parse_args()
    rows = [r for r in a.rows.split(",") if r]
    if set(rows) - set(QUANTS):
        p.error(f"unknown rows {sorted(set(rows) - set(QUANTS))}")
    if not (Path(a.model) / "config.json").is_file():
        sys.exit(f"real_model_table: error: no model at {a.model}; run `make real-model` first")
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    state_file = work / "state.json"
    state = (
        json.loads(state_file.read_text())
        if state_file.is_file()
        else {"settings": settings(a), "quant": {}, "eval": {}}
    )
    if state["settings"] != settings(a):
        sys.exit(f"real_model_table: error: {work} holds a run with other settings; pass --work DIR or remove it")

    def save() -> None:
        write_atomic(state_file, json.dumps(state, indent=2))
        publish(state)

    if not a.render_only:
        measure(a, rows, work, state, save)
    publish(state, echo=True)


def measure(a, rows: list[str], work: Path, state: dict, save) -> None:
    """Quantize and evaluate every row not yet in `state` (the float model first), calling `save` after each step so
    that a killed run resumes where it stopped."""
    import torch
    from safetensors.torch import save_file

    from matgptq.evaluation.perplexity import Teacher
    from matgptq.evaluation.tasks import resolve_tasks
    from matgptq.models import calibration_windows, eval_windows, load_tokenizer, read_text, tokenize
    from matgptq.runtime import load

    torch.set_num_threads(a.threads)
    tokenizer = load_tokenizer(a.model)
    ids = calibration_windows(tokenize(tokenizer, read_text(WIKI, (0.5, 1.0))), a.nsamples, a.seqlen, a.seed)
    ids_file = work / "ids.safetensors"
    save_file({"ids": ids.contiguous()}, str(ids_file))
    windows = eval_windows(tokenize(tokenizer, read_text(WIKI, (0.0, 0.5))), 2048, 2048 * a.eval_windows)
    specs = resolve_tasks("arc_easy,piqa", ZERO_SHOT)
    print(
        f"{a.model}: g{a.group_size} sym, calibration {a.nsamples} x {a.seqlen} tokens, perplexity on "
        f"{windows.numel()} tokens, {a.limit} questions per task, {a.threads} threads",
        flush=True,
    )
    todo = [r for r in rows if str(QUANTS[r][2][-1]) not in state["eval"].get(r, {})]
    teacher = (
        Teacher(load(a.model), windows, batch_size=1, progress=True) if todo or "fp32" not in state["eval"] else None
    )
    if "fp32" not in state["eval"]:
        state["eval"]["fp32"] = evaluate(a.model, [32], windows, teacher, specs, a.limit, tokenizer)
        save()
    for name in todo:
        tool, _, widths = QUANTS[name]
        if tool in PEERS and not BENCH_PYTHON.exists():
            print(f"  {name}: skipped (no {BENCH_PYTHON}: `make bench-venv` builds it)", flush=True)
            continue
        if name not in state["quant"] or not (work / name).is_dir():
            state["quant"][name] = quantize(name, a, work, ids_file)
            save()
        q = state["quant"][name]
        print(
            f"  {name}: {'ok' if q['ok'] else 'FAILED: ' + q['error']} wall {q['wall']:.0f} s, CPU {q['cpu']:.0f} s, "
            f"peak RSS {q['rss_gb']:.2f} GB",
            flush=True,
        )
        if q["ok"]:
            state["eval"][name] = evaluate(work / name, list(widths), windows, teacher, specs, a.limit, tokenizer)
            save()


def table_rows(state: dict) -> list[dict]:
    """One row per evaluated model, in the order of QUANTS."""
    out = []
    for name in ["fp32", *QUANTS]:
        tool, _, widths = QUANTS.get(name, ("fp32", (), (32,)))
        q = state["quant"].get(name, {})
        for bits in widths:
            e = state["eval"].get(name, {}).get(str(bits))
            if e is None and not (q and not q["ok"]):
                continue
            row = {"key": name, "method": LABELS.get(tool, "fp32"), "tool": tool, "bits": bits}
            if e:
                t = e["tasks"]
                row.update(
                    ppl=e["ppl"],
                    kl=e["kl"],
                    arc_easy=t["arc_easy"]["acc"],
                    piqa=t["piqa"]["acc"],
                    avg_acc=t["average"]["acc"],
                    avg_acc_norm=t["average"]["acc_norm"],
                )
            if q:  # a parent's time and memory are paid once, for all its widths
                row.update({k: q[k] for k in ("wall", "cpu", "rss_gb", "ok")}, error=q.get("error"))
            out.append(row)
    return out


def publish(state: dict, echo: bool = False) -> None:
    """docs/results/real_model_table.json from the measurements, then its page and figure from that JSON."""
    data = {"protocol": __doc__, **state}
    (RESULTS / "real_model_table.json").write_text(json.dumps(data, indent=2))
    text = page(data)
    write_page(RESULTS / "real_model_table.md", text)
    plot_page(data, RESULTS / "real_model_table.png")
    if echo:
        print(text)


def page(data: dict) -> str:
    """docs/results/real_model_table.md from its JSON."""
    rows = table_rows(data)
    s = data["settings"]
    fmt = lambda r, k, f: (f % r[k]) if r.get(k) is not None else "-"  # noqa: E731
    table = format_table(
        [
            "method",
            "bits",
            "WikiText-2 ppl",
            "KL to fp32",
            "ARC-e acc",
            "PIQA acc",
            "avg acc",
            "avg acc_norm",
            "quantize wall s",
            "CPU s",
            "peak RSS GB",
        ],
        [
            [
                r["method"],
                r["bits"],
                fmt(r, "ppl", "%.3f"),
                fmt(r, "kl", "%.4f"),
                fmt(r, "arc_easy", "%.3f"),
                fmt(r, "piqa", "%.3f"),
                fmt(r, "avg_acc", "%.4f"),
                fmt(r, "avg_acc_norm", "%.4f"),
                fmt(r, "wall", "%.0f"),
                fmt(r, "cpu", "%.0f"),
                fmt(r, "rss_gb", "%.2f"),
            ]
            for r in rows
        ],
    )
    failed = [f"- {r['method']} {r['bits']}-bit failed: `{r['error']}`" for r in rows if r.get("ok") is False]
    ratios = peer_ratios(rows)
    head = (
        f"SmolLM2-135M-Instruct, g{s['group_size']} symmetric, calibration {s['nsamples']} x {s['seqlen']} tokens "
        f"(seed {s['seed']}, second half of WikiText-2 test), perplexity on the first {s['eval_windows']} x 2048 "
        f"tokens of the first half, zero-shot on the first {s['limit']} questions of ARC-Easy and PIQA, "
        f"{s['threads']} threads per process."
    )
    body = "\n\n".join(x for x in [head, table, "\n".join(failed), ratios] if x)
    return header("benchmarks/quality/real_model_table.py", "real_model_table.json") + "\n" + body + "\n"


def peer_ratios(rows: list[dict]) -> str:
    """The goals at each width: matgptq GPTQ perplexity vs the best peer's, CPU time vs the fastest peer's."""
    lines = []
    for bits in (3, 4):
        ours = [r for r in rows if r["tool"] in ("gptq", "gptq-bf16", "gptq-ao") and r["bits"] == bits and r.get("ppl")]
        peers = [r for r in rows if r["tool"] in PEERS and r["bits"] == bits and r.get("ppl")]
        if not ours or not peers:
            continue
        best, fastest = min(peers, key=lambda r: r["ppl"]), min(peers, key=lambda r: r["cpu"])
        for r in ours:
            lines.append(
                f"| {bits} | {r['method']} | {r['ppl']:.3f} / {best['ppl']:.3f} ({best['method']}) = "
                f"{r['ppl'] / best['ppl']:.3f} | {r['cpu']:.0f} / {fastest['cpu']:.0f} s = "
                f"{r['cpu'] / fastest['cpu']:.2f} | {r['rss_gb'] / min(p['rss_gb'] for p in peers):.2f} |"
            )
    if not lines:
        return ""
    return (
        "| bits | ours | ppl / best peer's (goal ≤ 1) | CPU s / fastest peer's (goal ≤ 0.5) | RSS / lowest peer's |\n"
        "|---|---|---|---|---|\n" + "\n".join(lines)
    )


def plot_page(data: dict, path: Path) -> None:
    """docs/results/real_model_table.png from its JSON: perplexity and zero-shot accuracy against bits per method."""
    rows = table_rows(data)
    plt = pyplot()
    fig, (ax, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    fp = next((r for r in rows if r["tool"] == "fp32" and r.get("ppl")), None)
    for tool in ("rtn", "gptq", "gptq-ao", "matgptq-paper", "matgptq", "gptqmodel", "llmcompressor"):
        pts = sorted((r["bits"], r["ppl"], r["avg_acc"]) for r in rows if r["tool"] == tool and r.get("ppl"))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=LABELS[tool])
            ax_acc.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=LABELS[tool])
    if fp:
        ax.axhline(fp["ppl"], color="gray", ls=":", label=f"fp32 ({fp['ppl']:.2f})")
        ax_acc.axhline(fp["avg_acc"], color="gray", ls=":", label=f"fp32 ({fp['avg_acc']:.3f})")
    ax.set_yscale("log")
    ax.set_xlabel("bits per weight (codes)")
    ax.set_ylabel("WikiText-2 perplexity")
    ax_acc.set_xlabel("bits per weight (codes)")
    ax_acc.set_ylabel("zero-shot accuracy, ARC-e + PIQA average")
    ax.legend(fontsize=8)
    fig.suptitle("SmolLM2-135M-Instruct, g128 symmetric: one MatGPTQ parent vs per-width GPTQ and peers")
    save_figure(fig, path)


if __name__ == "__main__":
    main()
