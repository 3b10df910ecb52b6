"""The report of benchmarks/quality/gptq_defaults.py, rendered from docs/results/gptq_defaults.json alone: the page
(docs/results/gptq_defaults.md) and its figure; `python -m benchmarks.render_docs` re-renders them. The blocks the
same JSON gives the guide's table of defaults and the README: gptq_defaults_blocks.py."""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks._harness import format_table, header
from benchmarks.quality._gptq_defaults_rows import (
    AS_TYPED,
    PARENT_WIDTHS,
    PEER_GROUP,
    PEER_LABELS,
    ROWS,
    flags,
    is_parent,
)

TASKS = ("arc_easy", "piqa")  # zero-shot accuracy (lm-eval's acc), when a run was scored with --limit
QUIET_LOAD = 2.5  # 1-minute load average on the 2-core machine at a run's end: above it, other work shared the cores


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
        for name, get in (
            ("ppl", lambda r: r["eval"]["ppl"]),
            ("kl", lambda r: r["eval"]["kl"]),
            *((task, lambda r, t=task: r["eval"]["tasks"].get(t, {}).get("acc")) for task in TASKS),
            ("cpu", lambda r: r["quant"]["cpu"]),
            ("rss", lambda r: r["quant"]["rss_gb"]),
            ("load", lambda r: r["quant"].get("load_average")),
        ):
            values = [v for v in map(get, rs) if v is not None]
            if values:
                s[name], s[name + "_spread"] = statistics.fmean(values), max(values) - min(values)
                s[name + "_n"] = len(values)
        quiet = [r["quant"] for r in rs if r["quant"].get("load_average", QUIET_LOAD + 1) <= QUIET_LOAD]
        if quiet:  # what the ratios of CPU time and memory use: only runs that had the cores to themselves
            s["cpu_quiet"], s["rss_quiet"] = (statistics.fmean(q[k] for q in quiet) for k in ("cpu", "rss_gb"))
            where = {_machine(q) for q in quiet}
            s["machine"] = where.pop() if len(where) == 1 else None
        out.append(s)
    order = list(ROWS)
    return sorted(out, key=lambda s: (s["group_size"] == -1, s["bits"], order.index(s["row"])))


def _machine(quant: dict) -> str | None:
    """Where a run was measured, as far as its record says: the CPU model where it names one ("... on AMD EPYC"),
    else the day (the older records name none; one day's runs shared a machine); None without a record."""
    measured = quant.get("measured")
    if not measured:
        return None
    return measured.split(" on ", 1)[1] if " on " in measured else measured.split()[0]


def page(data: dict) -> str:
    """docs/results/gptq_defaults.md from its JSON alone."""

    parts = [header("benchmarks/quality/gptq_defaults.py", "gptq_defaults.json")]
    for name, m in data["models"].items():
        s = m["settings"]
        rows = summary(m["runs"])
        parts.append(
            f"## {name}\n\nCalibration {s['nsamples']} x {s['seqlen']} tokens from the second half of "
            f"`{Path(s['calib']).name}`; perplexity and KL on the first {s['eval_windows']} x "
            f"{s['eval_seqlen']} tokens of its first half; {s['threads']} threads. Each cell: mean over the "
            "seeds, ± the spread (max − min). CPU s and peak RSS: the quantizing process's own (os.wait4); "
            "load is the machine's 1-minute load average when it ended (2 cores: above 2, other work shared "
            "them and inflated CPU s)."
        )
        fp = m["runs"].get("fp32", {}).get("eval")
        tasks = [t for t in TASKS if any(t in r for r in rows) or t in (fp or {}).get("tasks", {})]
        body = [
            [
                PEER_LABELS.get(r["row"], r["row"]),
                r["group_size"],
                r["bits"],
                r["seeds"],
                _cell(r, "ppl", ".3f"),
                _cell(r, "kl", ".4f"),
                *(_cell(r, t, ".3f") for t in tasks),
                _cell(r, "cpu", ".0f"),
                _cell(r, "rss", ".2f"),
                f"{r['load']:.1f}",
                ratio(r, rows, "ppl"),
                ratio(r, rows, "kl"),
            ]
            for r in rows
        ]
        if fp:
            acc = [f"{fp['tasks'][t]['acc']:.3f}" if t in fp.get("tasks", {}) else "-" for t in tasks]
            body.insert(0, ["fp32", "-", 32, "-", f"{fp['ppl']:.3f}", "0", *acc] + ["-"] * 5)
        parts.append(
            format_table(
                [
                    "row",
                    "group",
                    "bits",
                    "seeds",
                    "ppl",
                    "KL to fp32",
                    *(f"{t} acc" for t in tasks),
                    "CPU s",
                    "peak RSS GB",
                    "load",
                    "ppl / best peer's",
                    "KL / best peer's",
                ],
                body,
            )
        )
        if tasks:
            quantized = any(t in r for r in rows for t in tasks)
            parts.append(_tasks_note(m["runs"]) if quantized else _float_only_note(fp))
        when = sorted(
            {
                f"- `{k.split('/')[0]}`: measured {r['quant']['measured']}"
                for k, r in m["runs"].items()
                if r.get("quant", {}).get("measured")
            }
        )
        if when:
            parts.append(
                "Rows measured since the runs recorded their commit (the other rows predate these, and "
                "their CPU s the code of their day):\n" + "\n".join(when)
            )
        fails = sorted(
            {f"- {k}: `{r['quant']['error']}`" for k, r in m["runs"].items() if not r.get("quant", {}).get("ok", True)}
        )
        if fails:
            parts.append("Failed:\n" + "\n".join(fails))
    ran = {k.split("/")[0] for m in data["models"].values() for k in m["runs"]}
    parts.append(
        "Rows (every option spelled out; `default` passes none):\n\n"
        + "\n".join(
            f"- `{k}`: "
            + (
                "the peer's own defaults"
                if v == "peer"
                else "no option"
                if v is None
                else "no option, not even --nsamples and --seqlen (quantize's own)"
                if v == AS_TYPED
                else f"--method matgptq --bits {PARENT_WIDTHS} " * is_parent(k)
                + (" ".join(flags(v)) or "and no other option")
            )
            + (f" (group size {PEER_GROUP[k]})" if k in PEER_GROUP else "")
            for k, v in ROWS.items()
            if k in ran
        )
    )
    return "\n\n".join(parts) + "\n"


def _cell(r: dict, k: str, f: str) -> str:
    """Mean ± spread of summary field k, with the seed count where fewer seeds than the row's have it."""
    if k not in r:
        return "-"
    fewer = f" ({r[k + '_n']} seed{'s' * (r[k + '_n'] > 1)})" if r[k + "_n"] < r["seeds"] else ""
    return f"{r[k]:{f}} ± {r[k + '_spread']:{f}}{fewer}"


def _tasks_note(runs: dict) -> str:
    """How the zero-shot columns were scored: questions per task, and how close a re-quantized model's perplexity
    came to the recorded one (the runs quantized again to add the zero-shot)."""
    limits = sorted({r["eval"]["limit"] for r in runs.values() if r.get("eval", {}).get("limit")})
    again = [
        abs(r["eval"]["rerun_ppl"] / r["eval"]["ppl"] - 1) for r in runs.values() if "rerun_ppl" in r.get("eval", {})
    ]
    replaced = sorted(k for k, r in runs.items() if "replaced" in r)
    n = limits[-1] if limits else 0
    se = 100 * (0.25 / n) ** 0.5 if n else 0
    return (
        f"Zero-shot: lm-eval's accuracy on the first {' or '.join(map(str, limits))} questions of each task (a "
        f"task's standard error is at most {se:.1f} points at {n}; two rows' difference is less noisy, since "
        "they answer the same questions)."
        + (
            f" {len(again)} runs scored before the zero-shot existed were "
            "quantized again to add it; their perplexity came back within a relative "
            f"{max(again):.1e} of the recorded one, so the accuracies are of the same models."
            if again
            else ""
        )
        + (
            f" Quantized again, {', '.join(replaced)} came back another model; the re-run replaced the record "
            "(its first perplexity is kept in the JSON as `replaced`)."
            if replaced
            else ""
        )
    )


CHANCE = {"arc_easy": 0.25, "piqa": 0.5}  # a guess's accuracy: ARC-Easy has four choices for almost every question


def _float_only_note(fp: dict) -> str:
    """Why a model's zero-shot columns hold the float model alone: its accuracies against a guess's, in standard
    errors of a guess's accuracy over the questions scored (√(c(1 − c)/n))."""

    def far(task: str, c: float) -> str:
        r = fp["tasks"][task]
        errors = abs(r["acc"] - c) / (c * (1 - c) / r["n"]) ** 0.5
        return f"{task} {r['acc']:.3f} against {c} ({errors:.1f} standard errors)"

    against = ", ".join(far(t, c) for t, c in CHANCE.items() if t in fp["tasks"])
    return (
        f"Zero-shot: the float model alone, on the first {fp['limit']} questions of each task; against a guess's "
        f"accuracy: {against}. Where the float model is within a few standard errors of guessing, quantization "
        "cannot show in these tasks, so the quantized rows were not scored on them."
    )


def cells_of(data: dict, model: str = "SmolLM2-135M-Instruct", group: int = 128) -> dict[tuple[str, int], dict]:
    """(row, bits) -> its summary, for one model and group size."""
    runs = data["models"].get(model, {}).get("runs", {})
    return {(r["row"], r["bits"]): r for r in summary(runs) if r["group_size"] == group}


def plot_page(data: dict, path: Path) -> None:
    """docs/results/gptq_defaults.png from its JSON: perplexity and KL per row at g128, seed means with the spread."""
    from benchmarks._harness import pyplot, save_figure

    cells = cells_of(data)
    rows = [r for r in ROWS if any(k[0] == r for k in cells)]
    plt = pyplot()
    # one panel above the other, a row's slot wide enough for its label at 60 degrees
    fig, axes = plt.subplots(2, 1, figsize=(max(11, 0.32 * len(rows)), 10))
    for ax, key, label in ((axes[0], "ppl", "WikiText-2 perplexity"), (axes[1], "kl", "KL to the float model")):
        for i, bits in enumerate((3, 4)):
            got = [(n, cells[(n, bits)]) for n in rows if (n, bits) in cells]
            x = [rows.index(n) + 0.4 * i for n, _ in got]  # a row without this width leaves its slot empty
            ax.bar(
                x,
                [c[key] for _, c in got],
                width=0.4,
                label=f"{bits}-bit",
                yerr=[c[key + "_spread"] / 2 for _, c in got],
                capsize=3,
            )
        names = [PEER_LABELS.get(n, n).replace(" (its defaults)", "") for n in rows]
        ax.set_xticks([j + 0.2 for j in range(len(rows))], names, rotation=60, ha="right", fontsize=8)
        ax.set_ylabel(label + " (lower is better)")
        ax.legend(fontsize=8)
    fig.suptitle(
        "SmolLM2-135M-Instruct, g128: GPTQ options, MatGPTQ parent slices and the peers' defaults (bars: seed "
        "mean, whiskers: spread)",
        fontsize=10,
    )
    save_figure(fig, path)


def ratio(r: dict, rows: list[dict], key: str) -> str:
    """`key` (ppl or kl) of row r over the best peer's at the same group size and width."""
    peers = [
        p
        for p in rows
        if p["row"] in PEER_LABELS and (p["group_size"], p["bits"]) == (r["group_size"], r["bits"]) and key in p
    ]
    if not peers or key not in r:
        return "-"
    return f"{r[key] / min(p[key] for p in peers):.3f}"
