"""The report of benchmarks/search/real_model.py: docs/results/search_real_model.{md,png}, rendered from every run's JSON
(docs/results/search_real_model/run-NAME.json) and the fp32 / per-width GPTQ rows of docs/results/real_model_table.json.

    python -m benchmarks.search.real_model --render-only      (or python -m benchmarks.render_docs)
"""

from __future__ import annotations

import ast
from pathlib import Path

from benchmarks._harness import RESULTS, format_table, header, load_json, pyplot, save_figure, write_page

TABLE_JSON = RESULTS / "real_model_table.json"  # fp32 and per-width GPTQ rows (benchmarks/quality/real_model_table.py)
RUNS = RESULTS / "search_real_model"  # run-NAME.json: one run's measurements, mixes, machine, parent hash
# the page's protocol paragraphs: benchmarks/search/real_model.py's docstring, read without importing it
PROTOCOL = ast.get_docstring(ast.parse((Path(__file__).parent / "real_model.py").read_text(encoding="utf-8")))
PARENTS = {"matgptq348": (3, 4, 8), "matgptq2348": (2, 3, 4, 8)}  # the target widths R of the parents a run can search


def uniform_line(uniform: dict[int, float], bits: float) -> float:
    """The straight line between the neighbouring uniform slices at `bits`."""
    lo = max(r for r in uniform if r <= bits)
    hi = min(r for r in uniform if r >= bits)
    return uniform[lo] if lo == hi else uniform[lo] + (bits - lo) / (hi - lo) * (uniform[hi] - uniform[lo])


def run_rows(state: dict) -> list[dict]:
    """One run's rows: its parent's uniform slices, then the searched and knapsack mix of each budget."""
    uniform = {r: state["eval"].get(f"uniform-{r}") for r in (2, 3, 4, 6, 8)}
    rows = [{"model": f"uniform {r}-bit slice", "bits": r, "kind": "uniform", **e} for r, e in uniform.items() if e]
    keys = (k for k in state["eval"] if k.startswith(("dp-", "random-", "mix-")))
    order = {"dp": 0, "random": 1, "mix": 2}
    for key in sorted(keys, key=lambda k: (float(k.split("-", 1)[1]), order[k.split("-")[0]])):
        kind, budget = key.split("-", 1)
        summary = state["mixes"][budget]["summary"]
        row = {"kind": kind, **state["eval"][key], "bits": float(budget)}
        if kind == "mix":
            row.update(
                model=f"EvoPress mix (from {summary.get('start', 'knapsack')}) @ {budget}",
                bits=summary["search_code_bits"],
                storage_bits=summary["search_storage_bits"],
                search_s=summary["seconds"],
                evaluations=summary["evaluations"],
            )
        elif kind == "random":
            rnd = state["random"][budget]
            row.update(
                model=f"random search @ {budget}",
                bits=rnd["code_bits"],
                search_s=rnd["seconds"],
                evaluations=rnd["evaluations"],
            )
        else:
            row.update(model=f"knapsack (DP) mix @ {budget}")
        rows.append(row)
    return rows


def publish() -> None:
    """docs/results/search_real_model.{md,png} from every run's JSON and the table's."""
    runs = {f.name: load_json(f) for f in sorted(RUNS.glob("run-*.json"))}
    table = load_json(TABLE_JSON)
    text = page(runs, table)
    write_page(RESULTS / "search_real_model.md", text)
    plot_page(runs, table, RESULTS / "search_real_model.png")
    print(text)


def _base(table: dict) -> list[dict]:
    """fp32 and per-width GPTQ 3/4/6/8 from docs/results/real_model_table.json."""
    ev = table["eval"]
    base = [{"model": "fp32", "bits": 32, **ev["fp32"]["32"]}]
    return base + [{"model": f"GPTQ-{r}", "bits": r, "kind": "gptq", **ev[f"gptq{r}"][str(r)]} for r in (3, 4, 6, 8)]


def _runs(runs: dict[str, dict]) -> dict[str, dict]:
    """{run name: its JSON} from {file name run-NAME.json: its JSON}."""
    return {f.removeprefix("run-").removesuffix(".json"): state for f, state in runs.items()}


def page(runs: dict[str, dict], table: dict) -> str:
    """docs/results/search_real_model.md from {run-NAME.json: JSON} and real_model_table.json."""

    runs = _runs(runs)
    base = _base(table)
    rows = {name: run_rows(state) for name, state in runs.items()}
    f = lambda r, k, fmt: (fmt % r[k]) if r.get(k) is not None else ""  # noqa: E731
    text = format_table(
        [
            "run",
            "model",
            "code bits",
            "storage bits",
            "WikiText-2 ppl",
            "KL to fp32",
            "ARC-e",
            "PIQA",
            "avg acc",
            "search s",
            "evaluations",
        ],
        [
            [
                name,
                r["model"],
                f(r, "bits", "%.4g"),
                f(r, "storage_bits", "%.3f"),
                f(r, "ppl", "%.3f"),
                f(r, "kl", "%.4f"),
                f(r["tasks"]["arc_easy"], "acc", "%.3f"),
                f(r["tasks"]["piqa"], "acc", "%.3f"),
                f(r["tasks"]["average"], "acc", "%.4f"),
                f(r, "search_s", "%.0f"),
                f(r, "evaluations", "%d"),
            ]
            for name, rs in [("table", base), *rows.items()]
            for r in rs
        ],
    )
    goals = [[name, *g] for name, state in runs.items() for g in goal_rows(base, state)]
    goal_text = (
        format_table(
            [
                "run",
                "budget",
                "written",
                "code bits",
                "ppl",
                "uniform line ppl",
                "KL",
                "uniform line KL",
                "beats line",
                "≤ knapsack ppl",
                "< random search ppl",
                "GPTQ ppl (floor width)",
            ],
            goals,
        )
        if goals
        else ""
    )
    machine = f", {table['machine']}" if table.get("machine") else ""
    usage = [
        f"- table: fp32 and per-width GPTQ from [real_model_table.json](real_model_table.json) (`make "
        f"real-model-table`{machine})"
    ]
    for name, state in runs.items():
        usage.append(f"- run {name}: {state['machine']}, parent sha256 {state['parent_sha256'][:12]}…")
        if state.get("quant"):
            q = state["quant"]
            widths = ",".join(map(str, PARENTS[state.get("parent", "matgptq348")]))
            usage.append(
                f"  - parent (quantize, c = 8, R = {{{widths}}}): wall {q['wall']:.0f} s, CPU {q['cpu']:.0f} s, "
                f"peak RSS {q['rss_gb']:.2f} GB"
            )
        usage += [
            f"  - search process for budgets {k}: wall {u['wall']:.0f} s, CPU {u['cpu']:.0f} s, peak RSS "
            f"{u['rss_gb']:.2f} GB"
            for k, u in state["search"].items()
        ]
        usage += [f"  - mix @ {b}: {m['note']}" for b, m in state["mixes"].items() if m.get("note")]
    curves = [
        f"- run {name}, {b} bits: "
        + ", ".join(f"gen {p['generation']} ({p['evaluations']} evals) {p['kl']:.4f}" for p in c)
        for name, state in runs.items()
        for b, c in state["curve"].items()
    ]
    md = [
        header("benchmarks/search/_real_model_page.py", "search_real_model/run-*.json", "real_model_table.json"),
        "# Mix'n'Match search on SmolLM2-135M-Instruct",
        "",
        PROTOCOL.split("\n\n")[1].strip(),
        "",
        PROTOCOL.split("\n\n")[2].strip(),
        "",
        text,
        "",
        *usage,
        "",
        "The mix `matgptq search` writes (the lowest calibration KL of its knapsack start, its start and the evolved "
        "mix: `written`) against the straight line between the neighbouring uniform slices of the same parent, the "
        "search's knapsack start, and per-width GPTQ at the budget's floor width:",
        "",
        goal_text,
        "",
        "Fitness vs evaluations (KL on 16 fixed windows of 256 tokens from the end of the calibration text; generation 0 is the search's start):",
        "",
        *curves,
        "",
    ]
    return "\n".join(md)


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
        dp, rnd = ev.get(f"dp-{budget}"), ev.get(f"random-{budget}")
        if written is None or dp is None or len(uniform) < 2:
            continue
        bits = summary["code_bits"]
        line_ppl = uniform_line({r: e["ppl"] for r, e in uniform.items()}, bits)
        line_kl = uniform_line({r: e["kl"] for r, e in uniform.items()}, bits)
        floor = max((r for r in gptq if r <= bits), default=None)
        out.append(
            [
                budget,
                chosen,
                round(bits, 4),
                round(written["ppl"], 3),
                round(line_ppl, 3),
                round(written["kl"], 4),
                round(line_kl, 4),
                "yes" if written["ppl"] < line_ppl and written["kl"] < line_kl else "NO",
                "yes" if written["ppl"] <= dp["ppl"] else f"NO ({dp['ppl']:.3f})",
                (("yes" if written["ppl"] < rnd["ppl"] else "NO") + f" ({rnd['ppl']:.3f})") if rnd else "",
                f"{gptq[floor]['ppl']:.3f} (GPTQ-{floor})" if floor else "",
            ]
        )
    return out


def plot_page(runs: dict[str, dict], table: dict, path: Path) -> None:
    """docs/results/search_real_model.png: perplexity, KL and zero-shot accuracy vs code bits (one marker fill per
    run), and each search's curve."""
    runs = _runs(runs)
    base = _base(table)
    rows = {name: run_rows(state) for name, state in runs.items()}
    plt = pyplot()

    fig, axes = plt.subplots(1, 4, figsize=(19, 4.2))
    styles = {
        "uniform": ("o-", "gray", "uniform slices"),
        "dp": ("s", "tab:blue", "knapsack start"),
        "random": ("x", "tab:purple", "random search"),
        "mix": ("*", "tab:red", "EvoPress mix"),
    }
    value = lambda r, key: r["tasks"]["average"]["acc"] if key == "acc" else r[key]  # noqa: E731
    for ax, (key, ylabel) in zip(
        axes, (("ppl", "WikiText-2 perplexity"), ("kl", "KL to fp32"), ("acc", "zero-shot accuracy (ARC-e + PIQA)"))
    ):
        gptq = sorted((r["bits"], value(r, key)) for r in base if r.get("kind") == "gptq")
        ax.plot(*zip(*gptq), "D", color="tab:green", label="per-width GPTQ")
        for i, (name, rs) in enumerate(rows.items()):
            for kind, (marker, color, label) in styles.items():
                pts = sorted((r["bits"], value(r, key)) for r in rs if r.get("kind") == kind)
                if pts:
                    ax.plot(
                        *zip(*pts),
                        marker,
                        color=color,
                        mfc=color if i == 0 else "none",
                        ms=10 if kind == "mix" else 6,
                        label=f"{label} (run {name})",
                    )
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
    save_figure(fig, path)
