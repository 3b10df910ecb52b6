"""The README's overview: quality against bits on SmolLM2-135M-Instruct, rendered from four measured JSONs.

Sources (each written by its own script; nothing here is measured):
  docs/results/gptq_defaults.json            benchmarks/quality/gptq_defaults.py: the parent's slices, the default
                                             GPTQ per width and the peers with their own defaults, g128, calibration
                                             seeds 0-2, WikiText-2 perplexity and KL on 8 x 2048 held-out tokens (the
                                             README's first table)
  docs/results/real_model_table.json         benchmarks/quality/real_model_table.py: GPTQModel 7.6.0 per width,
                                             g128 symmetric, WikiText-2 perplexity on 32 x 2048
                                             held-out tokens
  docs/results/search_real_model/run-2.json  benchmarks/search/real_model.py: one MatGPTQ parent's uniform slices and
                                             its searched mixes, scored by the same function on the same tokens
  docs/results/gguf_vs_llamacpp_real.json    benchmarks/gguf/presets.py: GGUF files, ours and llama.cpp's presets,
                                             scored by llama.cpp's own llama-perplexity (KL to F32), seeds 0-2

The figure's two panels use two protocols and never mix them: left, our evaluator (one calibration seed); right,
llama.cpp's. The first table is the defaults' protocol alone.

    python -m benchmarks.quality.overview     # rewrite docs/results/overview.png and the README block
    python -m benchmarks.render_docs --check  # what CI runs: the README block equals this rendering of the JSONs
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from benchmarks._harness import RESULTS, ROOT

SEEDS = (0, 1, 2)
# GGUF rows: the preset, llama.cpp's file names (without / with importance matrix) and our file of <= its bytes
GGUF_ROWS = (
    ("Q4_0", "GPTQ-4, Hessian-weighted grid and scale refit", "gptq4-hw"),
    ("Q3_K_M", "searched mix, each layer re-solved by GPTQ, token_embd Q5_1", "matgptq458-hw-q3km-e51-dp-gptq"),
    ("Q4_K_M", "searched mix, each layer re-solved by GPTQ", "matgptq458-hw-q4km-dp-gptq"),
)
PPL_CAP = 150.0  # points above this perplexity (below 2.75 bits) are left off the left panel, so 3-4 bits stay legible


def load_sources(results: Path = RESULTS) -> dict:
    """The three sources as one dict (only the fields the overview reads)."""
    table = json.loads((results / "real_model_table.json").read_text())["eval"]
    run = json.loads((results / "search_real_model" / "run-2.json").read_text())
    seeds = json.loads((results / "gguf_vs_llamacpp_real.json").read_text())["seeds"]
    gguf = [seeds[str(seed)] for seed in SEEDS]
    defaults = json.loads((results / "gptq_defaults.json").read_text())["models"]["SmolLM2-135M-Instruct"]["runs"]
    return {"table": table, "run": run, "gguf": gguf, "defaults": defaults}


def _ppl(entry: dict, bits: int) -> float:
    return entry[str(bits)]["ppl"]


def series(src: dict) -> dict[str, list[tuple[float, float]]]:
    """Left panel: (code bits per weight, WikiText-2 perplexity) per series, one calibration seed."""
    t, ev, mixes = src["table"], src["run"]["eval"], src["run"]["mixes"]
    return {
        "fp32": [(16.0, _ppl(t["fp32"], 32))],
        "GPTQModel 7.6.0, one model per width": [(b, _ppl(t[f"gptqmodel{b}"], b)) for b in (3, 4)],
        "MatGPTQ parent: uniform slices": [(b, ev[f"uniform-{b}"]["ppl"]) for b in (2, 3, 4, 6, 8)],
        "MatGPTQ parent: searched mixes": sorted(
            (mixes[k]["summary"]["code_bits"], ev[f"mix-{k}"]["ppl"]) for k in mixes
        ),
    }


def gguf_points(src: dict) -> list[dict]:
    """Right panel: per preset, llama.cpp's best file (with or without imatrix) and ours: BPW and KL, mean ± sd."""
    rows = []
    for preset, what, ours in GGUF_ROWS:
        best, mine, ratio = [], [], []
        for run in src["gguf"]:
            kl = {k: run["scores"][k]["wiki"]["kl"] for k in (f"llama:{preset}", f"llama:{preset}+im", ours)}
            b = min(kl[f"llama:{preset}"], kl[f"llama:{preset}+im"])
            best.append(b), mine.append(kl[ours]), ratio.append(kl[ours] / b)
        files = src["gguf"][0]["files"]
        rows.append(
            {
                "preset": preset,
                "what": what,
                "bpw_llama": files[f"llama:{preset}+im"]["bpw"],
                "bpw_ours": files[ours]["bpw"],
                "kl_llama": best,
                "kl_ours": mine,
                "ratio": ratio,
            }
        )
    return rows


def _ms(xs: list[float], digits: int) -> str:
    return f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs):.{digits}f}"


# The first table: (column, its row in gptq_defaults.json), every tool with no option but bits and group size 128
DEFAULT_COLUMNS = (
    ("MatGPTQ parent {3,4,8}: its slice", "matgptq-default"),
    ("GPTQ (matgptq), one model per width", "default"),
    ("GPTQModel 7.6.0", "gptqmodel"),
    ("llm-compressor 0.14 (g64)", "llmcompressor-g64"),
)


def defaults_cell(runs: dict, row: str, bits: int) -> str:
    """Perplexity and KL, mean ± spread (max − min) over seeds 0-2, or empty where the row has no such run."""
    got = [runs[k]["eval"] for k in (f"{row}/g128/{bits}/seed{s}" for s in SEEDS) if k in runs]
    if len(got) < len(SEEDS):
        return ""
    ppl, kl = [e["ppl"] for e in got], [e["kl"] for e in got]
    return f"{statistics.fmean(ppl):.1f} ± {max(ppl) - min(ppl):.1f} / {statistics.fmean(kl):.3f}"


def render(src: dict) -> str:
    """The README block: the defaults' table, and the figure's right panel as ratios, as markdown."""
    runs = src["defaults"]
    lines = [
        "| bits | " + " | ".join(name for name, _ in DEFAULT_COLUMNS) + " |",
        "|---" * (len(DEFAULT_COLUMNS) + 1) + "|",
    ]
    for b in (3, 4, 8):
        lines.append(f"| {b} | " + " | ".join(defaults_cell(runs, row, b) for _, row in DEFAULT_COLUMNS) + " |")
    lines += [
        "",
        f"WikiText-2 perplexity ± its spread over calibration seeds 0-2 / KL to fp32 (fp32: "
        f"{runs['fp32']['eval']['ppl']:.1f}), each tool with its own defaults at group size 128 "
        "([gptq_defaults](docs/results/gptq_defaults.md)). As GGUF files scored by llama.cpp (KL to F32 on "
        "WikiText-2, calibration seeds 0-2), at no more than each preset's tensor bytes:",
        "",
        "| llama.cpp preset | ours | KL ours / llama.cpp's best (with or without imatrix) |",
        "|---|---|---|",
    ]
    for r in gguf_points(src):
        lines.append(f"| {r['preset']} | {r['what']} | {_ms(r['ratio'], 3)} |")
    return "\n".join(lines)


def plot(src: dict, path: Path) -> None:
    import matplotlib.ticker

    from benchmarks._harness import pyplot, save_figure

    plt = pyplot()

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = {
        "GPTQModel 7.6.0, one model per width": ("^", "tab:orange"),
        "MatGPTQ parent: uniform slices": ("o", "tab:blue"),
        "MatGPTQ parent: searched mixes": ("D", "tab:green"),
    }
    s = series(src)
    ax.axhline(s["fp32"][0][1], color="black", ls=":", lw=1, label="fp32")
    for name, (marker, color) in styles.items():
        pts = [(x, y) for x, y in s[name] if y <= PPL_CAP]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, label=name)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_yticks([20, 30, 40, 60, 80, 100, 150])
    ax.set_xlabel("bits per weight of the quantized layers (codes)")
    ax.set_ylabel("WikiText-2 perplexity (lower is better)")
    ax.set_title("one parent, every width and mix (our evaluator)", fontsize=10)
    ax.legend(fontsize=7)
    for r in gguf_points(src):
        for who, color, marker in (("llama", "tab:orange", "^"), ("ours", "tab:green", "D")):
            kl = r[f"kl_{who}"]
            ax2.errorbar(
                r[f"bpw_{who}"],
                statistics.mean(kl),
                yerr=statistics.stdev(kl),
                color=color,
                marker=marker,
                capsize=3,
                label=("llama.cpp preset, best of ± imatrix" if who == "llama" else "matgptq"),
            )
        ax2.annotate(
            r["preset"],
            (r["bpw_llama"], statistics.mean(r["kl_llama"])),
            textcoords="offset points",
            xytext=(6, 4),
            fontsize=8,
        )
    handles, labels = ax2.get_legend_handles_labels()
    ax2.legend(handles[:2], labels[:2], fontsize=7)
    ax2.set_yscale("log")
    ax2.set_xlabel("GGUF bits per weight (tensor bytes · 8 / parameters)")
    ax2.set_ylabel("KL(F32 ‖ file), WikiText-2 (lower is better)")
    ax2.set_title("as GGUF in llama.cpp (llama-perplexity, seeds 0-2)", fontsize=10)
    fig.suptitle("SmolLM2-135M-Instruct", fontsize=11)
    save_figure(fig, path)


def main() -> int:
    from benchmarks._harness import write_block

    src = load_sources()
    plot(src, RESULTS / "overview.png")
    write_block(ROOT / "README.md", "overview", render(src))
    print(render(src))
    return 0


if __name__ == "__main__":
    sys.exit(main())
