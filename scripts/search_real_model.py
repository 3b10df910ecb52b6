"""Mix'n'Match on SmolLM2-135M-Instruct: searched mixes against uniform slices and per-width GPTQ, scored as
`make real-model-table` scores every row (`make search-real-model`, after `make real-model-table`).

Protocol:
  parent      a MatGPTQ parent made as scripts/real_model_table.py makes its Table-1 row (c = 8, R = {3,4,8}, g128
              symmetric, 64 × 512 tokens of the second half of WikiText-2 test, seed 0) with the current default
              variant (`matgptq quantize --method matgptq --bits 3,4,8`), in --work/parent; the search slices it at
              2..8 bits
  search      `matgptq search` with its default settings (--seed 0), every budget in one process (the teacher and the
              sensitivities are shared), calibration text = the second half of WikiText-2 test (what the parent was
              calibrated on); a measured child process: wall, CPU and peak RSS
  scoring     real_model_table.evaluate: WikiText-2 perplexity and KL to fp32 on the first 32 × 2048 tokens of the
              first half, ARC-Easy and PIQA (first 300 questions) through lm-eval, float32, one load per model
  rows        the searched mix and the knapsack (DP) mix per budget; the parent's uniform 2/3/4/6/8-bit slices; fp32
              and per-width GPTQ 3/4/6/8 read from docs/real_model_table.json (`make real-model-table`: the same
              calibration and the same scoring)
  curve       the searched parent after every 5th generation re-scored on 16 fixed windows from the end of the
              calibration text, not among the search's (fitness vs evaluations; the search's own record is on fresh
              windows each generation)

Runs: a parent's float rounding depends on the CPU (the same command gave a 3-bit slice of ppl 47.19 on an AMD EPYC
and 47.36 on an Intel Xeon), so every number of a run comes from one parent on one machine, and a run that a session
cannot finish is continued only where the parent re-quantizes to the same tensors. Each run keeps its state in
docs/search_real_model/run-NAME.json: every measurement, each budget's mix (widths and summary, not the search
history), the machine and the parent's tensor hash. A clean checkout re-quantizes the parent, checks the hash (another
hash: a one-line error saying to start a new --run) and searches and scores only what is missing; work files live in
runs/search-real-model/NAME (the search resumes there with --resume). docs/search_real_model.{md,png} and the README
block show every run, each against its own parent's uniform slices.

    python scripts/search_real_model.py [MODEL_DIR] [--run NAME] [--budgets 2.5,3.0,3.5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from bench_pipeline import run_measured
from real_model_table import DEFAULT_MODEL, SHARED, WIKI, evaluate, quantize, readme_block
from search_results import uniform_line

ROOT = Path(__file__).resolve().parents[1]
TABLE_JSON = ROOT / "docs" / "real_model_table.json"  # fp32 and per-width GPTQ rows (scripts/real_model_table.py)
RUNS = ROOT / "docs" / "search_real_model"  # run-NAME.json: one run's measurements, mixes, machine, parent hash


def parent_digest(parent: Path) -> str:
    """sha256 over the parent's tensors (names, dtypes, shapes, bytes): equal digests, equal slices."""
    import hashlib

    import torch
    from safetensors import safe_open

    h = hashlib.sha256()
    for file in sorted(parent.glob("*.safetensors")):
        with safe_open(file, "pt") as f:
            for name in sorted(f.keys()):
                t = f.get_tensor(name).contiguous()
                h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), or the platform's processor string."""
    import platform

    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=str(DEFAULT_MODEL), help="the fp32 model directory (make real-model)")
    p.add_argument("--budgets", default="3.0,2.5,3.5,4.0,2.25,2.75,3.25",
                   help="code bits per weight, searched in this order (a killed run resumes where it stopped)")
    p.add_argument("--threads", type=int, default=2, help="threads of every process")
    p.add_argument("--limit", type=int, default=300, help="questions per zero-shot task")
    p.add_argument("--run", default="2", help="the run to continue or start (docs/search_real_model/run-RUN.json)")
    p.add_argument("--work", help="mix files and measurements (default: runs/search-real-model/RUN)")
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--no-render", action="store_true", help="measure only; leave docs/ and README.md as they are")
    a = p.parse_args()
    work = Path(a.work or ROOT / "runs" / "search-real-model" / a.run)
    work.mkdir(parents=True, exist_ok=True)
    state_file = RUNS / f"run-{a.run}.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {"search": {}, "eval": {}, "curve": {}}
    state.setdefault("quant", None)
    state.setdefault("mixes", {})
    state.setdefault("machine", cpu_name())

    def save() -> None:
        RUNS.mkdir(exist_ok=True)
        tmp = state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1) + "\n")
        tmp.replace(state_file)

    parent = work / "parent"
    if not a.render_only:
        if not TABLE_JSON.is_file():
            sys.exit(f"search_real_model: error: no {TABLE_JSON}; run `make real-model-table` first")
        if not (parent / "matgptq.json").is_file():
            # the Table-1 row's own command and settings (real_model_table.quantize), into work/parent
            table = argparse.Namespace(model=a.model, threads=a.threads, **{
                k: v for k, v in json.loads(TABLE_JSON.read_text())["settings"].items()
                if k in ("group_size", "nsamples", "seqlen", "seed")})  # fmt: skip
            usage = quantize("matgptq348", table, work, None, out=parent)
            if not usage["ok"]:
                sys.exit(f"search_real_model: error: quantizing the parent failed; see {work}/matgptq348.log")
            state["quant"] = usage
            save()
        digest = parent_digest(parent)
        if state.setdefault("parent_sha256", digest) != digest:
            sys.exit(f"search_real_model: error: {parent} is not the parent run {a.run} was measured on (its tensors "
                     f"hash differently: another machine rounds differently); start a new run beside it with "
                     f"--run NAME (make search-real-model RUN=NAME)")  # fmt: skip
        save()
        budgets = [b for b in a.budgets.split(",") if b]
        todo = [b for b in budgets if b not in state["mixes"] and not (work / f"mix-{b}.json").is_file()]
        if todo:
            cmd = [sys.executable, "-m", "matgptq", "search", str(parent), "--budget", ",".join(todo), "--calib",
                   str(WIKI), "--calib-range", "0.5:1", "--kl-to", a.model, "--out", str(work), "--resume", "--quiet"]  # fmt: skip
            env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "PYTHONPATH": str(ROOT / "src")}
            usage = run_measured(cmd, env, work / f"search-{'_'.join(todo)}.log")
            if not usage["ok"]:
                sys.exit(f"search_real_model: error: the search failed; see {work}/search-*.log")
            state["search"][",".join(todo)] = usage
            save()
        for b in budgets:
            if b not in state["mixes"]:
                mix = json.loads((work / f"mix-{b}.json").read_text())
                state["mixes"][b] = {k: mix[k] for k in ("summary", "bits", "dp_bits", "start_bits", "search_bits")}
        save()
        measure(a, work, parent, budgets, state, save)
    if not a.no_render:
        render()


def measure(a, work: Path, parent: Path, budgets: list[str], state: dict, save) -> None:
    jobs = [(f"uniform-{r}", r) for r in (2, 3, 4)]  # the slices the budgets' uniform lines need first
    for b in budgets:
        if f"mix-{b}" in state["eval"] and f"dp-{b}" in state["eval"]:
            continue
        mix = state["mixes"][b]
        dp_file, evolved_file = work / f"dp-{b}.json", work / f"evolved-{b}.json"
        dp_file.write_text(json.dumps({"bits": mix["dp_bits"]}))
        # the evolved mix: `matgptq search` writes the lower-KL of it and the knapsack mix as "bits" (runner._report)
        evolved_file.write_text(json.dumps({"bits": mix.get("search_bits", mix["bits"])}))
        jobs += [(f"mix-{b}", str(evolved_file)), (f"dp-{b}", str(dp_file))]
    jobs += [(f"uniform-{r}", r) for r in (6, 8)]

    def done(key: str, scores: dict) -> None:
        state["eval"][key] = scores
        save()

    for b in budgets:  # first: it needs the search's history, which only the work directory that searched holds
        if b not in state["curve"] and (work / f"mix-{b}.json").is_file():
            state["curve"][b] = curve(a, parent, work / f"mix-{b}.json")
            save()
    score_slices(a, parent, [(k, bits) for k, bits in jobs if k not in state["eval"]], done)


def score_slices(a, parent: Path, jobs: list[tuple[str, object]], done) -> None:
    """Score each (key, width or mix file) of `jobs` as real_model_table scores a row, one load each, then
    done(key, scores)."""
    import torch

    from matgptq.evaluation.perplexity import Teacher
    from matgptq.evaluation.tasks import resolve_tasks
    from matgptq.models import eval_windows, load_tokenizer, read_text, tokenize
    from matgptq.runtime import load

    if not jobs:
        return
    torch.set_num_threads(a.threads)
    tokenizer = load_tokenizer(a.model)
    windows = eval_windows(tokenize(tokenizer, read_text(WIKI, (0.0, 0.5))), 2048, 2048 * 32)
    specs = resolve_tasks("arc_easy,piqa", SHARED / "data" / "zero-shot")
    args = argparse.Namespace(limit=a.limit)
    teacher = Teacher(load(a.model), windows, batch_size=1, progress=True)
    for key, bits in jobs:
        done(key, evaluate(parent, [bits], windows, teacher, specs, args, tokenizer, parent=True)[str(bits)])
    teacher.close()


def curve(a, parent: Path, mix_file: Path, every: int = 5) -> list[dict]:
    """KL of the search's parent at its start and after generation every, 2·every, … on 16 fixed windows."""
    from matgptq.evaluation.teacher import Teacher
    from matgptq.models import eval_windows, load_tokenizer, read_text, tokenize
    from matgptq.runtime import load
    from matgptq.search.fitness import Fitness

    mix = json.loads(mix_file.read_text())
    names = tuple(mix["bits"])
    windows = eval_windows(tokenize(load_tokenizer(a.model), read_text(WIKI, (0.5, 1.0))), 256)[-16:]  # the text's last windows
    points = [(0, 0, tuple(mix.get("start_bits", mix["dp_bits"])[n] for n in names))]
    points += [(h["generation"], h["evaluations"], tuple(h["parent"])) for h in mix["history"]
               if h["generation"] % every == 0 or h is mix["history"][-1]]  # fmt: skip
    with Teacher(load(a.model), windows) as teacher:
        fitness = Fitness(load(parent, bits=8, packed=False), teacher, windows, names)
        all_w = tuple(range(windows.shape[0]))
        return [{"generation": g, "evaluations": e, "kl": fitness.kl(m, all_w)} for g, e, m in points]


def run_rows(state: dict) -> list[dict]:
    """One run's rows: its parent's uniform slices, then the searched and knapsack mix of each budget."""
    uniform = {r: state["eval"].get(f"uniform-{r}") for r in (2, 3, 4, 6, 8)}
    rows = [{"model": f"uniform {r}-bit slice", "bits": r, "kind": "uniform", **e} for r, e in uniform.items() if e]
    for key in sorted((k for k in state["eval"] if k.startswith(("dp-", "mix-"))), key=lambda k: float(k.split("-")[1])):
        budget, searched = key.split("-", 1)[1], key.startswith("mix")
        summary = state["mixes"][budget]["summary"]
        label = f"EvoPress mix (from {summary.get('start', 'knapsack')})" if searched else "knapsack (DP) mix"
        rows.append({"model": f"{label} @ {budget}", "kind": key.split("-")[0], **state["eval"][key],
                     "bits": summary["search_code_bits"] if searched else float(budget),
                     "storage_bits": summary["search_storage_bits"] if searched else None,
                     "search_s": summary["seconds"] if searched else None,
                     "evaluations": summary["evaluations"] if searched else None})  # fmt: skip
    return rows


def render() -> None:
    """docs/search_real_model.{md,png} and the README block from every run's JSON."""
    from matgptq.evaluation.report import format_table

    runs = {f.stem.removeprefix("run-"): json.loads(f.read_text()) for f in sorted(RUNS.glob("run-*.json"))}
    ev = json.loads(TABLE_JSON.read_text())["eval"]
    base = [{"model": "fp32", "bits": 32, **ev["fp32"]["32"]}]
    base += [{"model": f"GPTQ-{r}", "bits": r, "kind": "gptq", **ev[f"gptq{r}"][str(r)]} for r in (3, 4, 6, 8)]
    rows = {name: run_rows(state) for name, state in runs.items()}
    f = lambda r, k, fmt: (fmt % r[k]) if r.get(k) is not None else ""  # noqa: E731
    text = format_table(
        ["run", "model", "code bits", "storage bits", "WikiText-2 ppl", "KL to fp32", "ARC-e", "PIQA", "avg acc",
         "search s", "evaluations"],
        [[name, r["model"], f(r, "bits", "%.4g"), f(r, "storage_bits", "%.3f"), f(r, "ppl", "%.3f"),
          f(r, "kl", "%.4f"), f(r["tasks"]["arc_easy"], "acc", "%.3f"), f(r["tasks"]["piqa"], "acc", "%.3f"),
          f(r["tasks"]["average"], "acc", "%.4f"), f(r, "search_s", "%.0f"), f(r, "evaluations", "%d")]
         for name, rs in [("table", base), *rows.items()] for r in rs],
    )  # fmt: skip
    goals = [[name, *g] for name, state in runs.items() for g in goal_rows(base, state)]
    goal_text = format_table(
        ["run", "budget", "written", "code bits", "ppl", "uniform line ppl", "KL", "uniform line KL", "beats line",
         "≤ knapsack ppl", "GPTQ ppl (floor width)"], goals) if goals else ""  # fmt: skip
    usage = ["- table: fp32 and per-width GPTQ from docs/real_model_table.json (`make real-model-table`, AMD EPYC)"]
    for name, state in runs.items():
        usage.append(f"- run {name}: {state['machine']}, parent sha256 {state['parent_sha256'][:12]}…")
        if state.get("quant"):
            q = state["quant"]
            usage.append(f"  - parent (quantize, c = 8, R = {{3,4,8}}): wall {q['wall']:.0f} s, CPU {q['cpu']:.0f} s, "
                         f"peak RSS {q['rss_gb']:.2f} GB")  # fmt: skip
        usage += [f"  - search process for budgets {k}: wall {u['wall']:.0f} s, CPU {u['cpu']:.0f} s, peak RSS "
                  f"{u['rss_gb']:.2f} GB" for k, u in state["search"].items()]  # fmt: skip
        usage += [f"  - mix @ {b}: {m['note']}" for b, m in state["mixes"].items() if m.get("note")]
    curves = [f"- run {name}, {b} bits: " + ", ".join(f"gen {p['generation']} ({p['evaluations']} evals) {p['kl']:.4f}"
                                                       for p in c)
              for name, state in runs.items() for b, c in state["curve"].items()]  # fmt: skip
    md = ["<!-- generated by scripts/search_real_model.py; do not edit -->",
          "# Mix'n'Match search on SmolLM2-135M-Instruct", "", __doc__.split("\n\n")[1].strip(), "",
          __doc__.split("\n\n")[2].strip(), "", text, "", *usage, "",
          "The mix `matgptq search` writes (the lowest calibration KL of its knapsack start, its start and the evolved "
          "mix: `written`) against the straight line between the neighbouring uniform slices of the same parent, the "
          "search's knapsack start, and per-width GPTQ at the budget's floor width:", "", goal_text, "",
          "Fitness vs evaluations (KL on 16 fixed windows of 256 tokens from the end of the calibration text; generation 0 is the search's start):", "", *curves, ""]  # fmt: skip
    docs = ROOT / "docs"
    (docs / "search_real_model.md").write_text("\n".join(md))
    readme_block("search-real-model", "\n".join([text, "", *usage]))
    plot(base, rows, runs, docs / "search_real_model.png")
    print("\n".join(md))


def goal_rows(base: list[dict], state: dict) -> list[list]:
    """Per budget: the written mix (`chosen` in its summary: search → the mix-… row, knapsack → dp-…, uniform r →
    the parent's r-bit slice) against the uniform line, the knapsack start and GPTQ at the floor width."""
    ev = state["eval"]
    uniform = {r: ev[f"uniform-{r}"] for r in (2, 3, 4, 6, 8) if f"uniform-{r}" in ev}
    gptq = {r["bits"]: r for r in base if r.get("kind") == "gptq"}
    out = []
    for key in sorted((k for k in ev if k.startswith("mix-")), key=lambda k: float(k.split("-")[1])):
        budget = key.split("-", 1)[1]
        summary = state["mixes"][budget]["summary"]
        chosen = summary.get("chosen", "search")
        written = {"search": ev[key], "knapsack": ev.get(f"dp-{budget}")}.get(chosen)
        if written is None:  # "uniform r": the start was a uniform slice
            written = uniform.get(int(chosen.split()[-1]))
        dp = ev.get(f"dp-{budget}")
        if written is None or dp is None or len(uniform) < 2:
            continue
        bits = summary["code_bits"]
        line_ppl = uniform_line({r: e["ppl"] for r, e in uniform.items()}, bits)
        line_kl = uniform_line({r: e["kl"] for r, e in uniform.items()}, bits)
        floor = max((r for r in gptq if r <= bits), default=None)
        out.append([budget, chosen, round(bits, 4), round(written["ppl"], 3), round(line_ppl, 3),
                    round(written["kl"], 4), round(line_kl, 4),
                    "yes" if written["ppl"] < line_ppl and written["kl"] < line_kl else "NO",
                    "yes" if written["ppl"] <= dp["ppl"] else f"NO ({dp['ppl']:.3f})",
                    f"{gptq[floor]['ppl']:.3f} (GPTQ-{floor})" if floor else ""])  # fmt: skip
    return out


def plot(base: list[dict], rows: dict[str, list[dict]], runs: dict[str, dict], path: Path) -> None:
    """Perplexity, KL and zero-shot accuracy vs code bits (one marker fill per run), and each search's curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(19, 4.2))
    styles = {"uniform": ("o-", "gray", "uniform slices"), "dp": ("s", "tab:blue", "knapsack start"),
              "mix": ("*", "tab:red", "EvoPress mix")}  # fmt: skip
    value = lambda r, key: r["tasks"]["average"]["acc"] if key == "acc" else r[key]  # noqa: E731
    for ax, (key, ylabel) in zip(axes, (("ppl", "WikiText-2 perplexity"), ("kl", "KL to fp32"),
                                        ("acc", "zero-shot accuracy (ARC-e + PIQA)"))):  # fmt: skip
        gptq = sorted((r["bits"], value(r, key)) for r in base if r.get("kind") == "gptq")
        ax.plot(*zip(*gptq), "D", color="tab:green", label="per-width GPTQ")
        for i, (name, rs) in enumerate(rows.items()):
            for kind, (marker, color, label) in styles.items():
                pts = sorted((r["bits"], value(r, key)) for r in rs if r.get("kind") == kind)
                if pts:
                    ax.plot(*zip(*pts), marker, color=color, mfc=color if i == 0 else "none",
                            ms=10 if kind == "mix" else 6, label=f"{label} (run {name})")  # fmt: skip
        if key != "kl":  # the fp32 model's KL to itself is 0
            ax.axhline(value(base[0], key), color="k", ls=":", label="fp32")
        ax.set_xlabel("code bits per weight")
        ax.set_ylabel(ylabel)
        if key != "acc":
            ax.set_yscale("log")
        if key == "ppl":  # the 2-bit slice (millions) would flatten everything else
            ax.set_ylim(top=50 * base[0]["ppl"])
            ax.set_ylabel(f"{ylabel} (axis cut at 50× fp32)")
        ax.legend(fontsize=6)
    ax = axes[3]
    for name, state in runs.items():
        for b, c in state["curve"].items():
            ax.plot([p["evaluations"] for p in c], [p["kl"] for p in c], "o-", label=f"run {name}, {b} bits")
    ax.set_xlabel("fitness evaluations")
    ax.set_ylabel("KL on 16 fixed calibration windows")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.suptitle("SmolLM2-135M-Instruct: searched mixes of a MatGPTQ parent (g128) vs its uniform slices and GPTQ")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
