"""The blocks benchmarks/quality/gptq_defaults.py's measurements give hand-written pages, rendered from
docs/results/gptq_defaults.json alone: the guide's table of defaults (docs/guide/quantize.md#defaults) and the
README's comparison with the peers (README.md#gptq-defaults); `python -m benchmarks.render_docs` re-renders them.
The page and its figure: gptq_defaults_report.py."""

from __future__ import annotations

from benchmarks.quality._gptq_defaults_page import cells_of
from benchmarks.quality._gptq_defaults_rows import ALL, PARENT_PARTS, PARENT_WIDTHS, PEER_LABELS, ROWS, is_parent


def _step(cells: dict, before: str, after: str, after_cells: dict | None = None) -> str:
    """What going from row `before` to row `after` (of `after_cells`, default the same cells) did, per width:
    perplexity and KL ratios (seed means)."""
    parts = []
    for bits in (3, 4):
        a, b = cells.get((before, bits)), (cells if after_cells is None else after_cells).get((after, bits))
        if a and b:
            n = min(a["seeds"], b["seeds"])
            tie = n > 1 and all(abs(b[k] - a[k]) <= max(a[k + "_spread"], b[k + "_spread"]) for k in ("ppl", "kl"))
            parts.append(
                f"{bits}-bit ppl ×{b['ppl'] / a['ppl']:.2f}, KL ×{b['kl'] / a['kl']:.2f} ({n} seed"
                f"{'s' if n > 1 else ''}{', a tie: both inside the seed spread' if tie else ''})"
            )
    return "; ".join(parts) or "not measured"


def _cpu(cells: dict, before: str, after: str) -> str:
    """CPU time and peak memory of row `after` over row `before`, per width (seed means), or nothing where the two
    were not measured on the same machine (`_machine`: CPU times of two hosts or days do not compare)."""
    parts = {
        bits: f"CPU ×{b['cpu_quiet'] / a['cpu_quiet']:.2f}, peak RSS ×{b['rss_quiet'] / a['rss_quiet']:.2f} "
        f"(runs on a quiet machine)"
        for bits in (3, 4)
        if (a := cells.get((before, bits)))
        and (b := cells.get((after, bits)))
        and "cpu_quiet" in a
        and "cpu_quiet" in b
        and a["machine"]
        and a["machine"] == b["machine"]
    }
    if len(set(parts.values())) == 1:  # one run for every width (a parent), or the same ratios
        return "; " + next(iter(parts.values()))
    return "".join(f"; {bits}-bit {text}" for bits, text in parts.items())


def defaults_block(data: dict) -> str:
    """docs/guide/quantize.md's table of defaults: each method's value (METHOD_DEFAULTS, the code) and, for GPTQ, what
    the ablation measured for it on SmolLM2-135M-Instruct at g128 (docs/results/gptq_defaults.json)."""
    from matgptq.quantization.calibration import CalibConfig
    from matgptq.quantization.config import MASTER_BIT_WEIGHT, Method
    from matgptq.quantization.method_configs import CONFIGS, METHOD_DEFAULTS

    cells = cells_of(data)
    gar = "gar-mse-w-refit"  # the defaults before act order: GAR with the scale search, its weighting and the refit
    show = lambda v: ("on" if v else "off") if isinstance(v, bool) else str(v)  # noqa: E731
    # an option a method does not have (RTN's damping) shows as "-"
    value = lambda k: " / ".join(  # noqa: E731
        show(METHOD_DEFAULTS[m][k]) if k in METHOD_DEFAULTS[m] else "-"
        for m in (Method.GPTQ, Method.MATGPTQ, Method.RTN)
    )
    # an option METHOD_DEFAULTS does not show, from the configs themselves ("-" where the method lacks it: RTN)
    field = lambda k: " / ".join(  # noqa: E731
        show(getattr(CONFIGS[m](), k)) if hasattr(CONFIGS[m](), k) else "-"
        for m in (Method.GPTQ, Method.MATGPTQ, Method.RTN)
    )
    parent = lambda after: _step(cells, "matgptq-parent", after) + _cpu(cells, "matgptq-parent", after)  # noqa: E731
    rows = [
        (
            "`--group-size`",
            value("group_size"),
            "the field's default (GPTQModel, llm-compressor, vLLM's kernels); -1 "
            f"(one scale per row) stores 0.125 fewer bits per weight; -1 → 128 for `{gar}` (per channel the default's "
            "act order with static groups is the same computation as GAR, bit for bit: one group, one order, its scale "
            "from the weights before any update; tests/quantization/algorithm/test_solver.py): "
            + _step(cells_of(data, group=-1), gar, gar, cells),
        ),
        (
            "`--act-order`, `--static-groups`",
            value("act_order") + "; " + value("static_groups"),
            "act order (every column by decreasing H_kk) with static groups (each group's scale from its original "
            "columns, so the layout stays the plain one: no g_idx, every export takes it); in place of GAR with the "
            "defaults' other options (scale search, weighting, refit), `"
            + gar
            + "` → `default`: "
            + _step(cells, gar, "default")
            + _cpu(cells, gar, "default")
            + "; with those options off, `gar` → "
            "`ao-static`: " + _step(cells, "gar", "ao-static") + " (act order needs the scale search at 3 bits); a "
            "parent, `matgptq-parent-gar-refit` → `matgptq-parent-ao-static-refit-bf16` (calibrated in bfloat16): "
            + _step(cells, "matgptq-parent-gar-refit", "matgptq-parent-ao-static-refit-bf16"),
        ),
        (
            "`--group-act-order`",
            value("group_act_order"),
            "GAR (whole groups, and the columns inside each, by "
            "decreasing H_kk; GPTQModel's default): GPTQ's and a parent's until act order with static groups replaced "
            "it; GPTQ, plain → `gar`: " + _step(cells, "plain", "gar"),
        ),
        (
            "`--refit-scales`",
            value("refit_scales"),
            "the codes' scales refit by least squares; a parent, "
            "`matgptq-parent` → `matgptq-parent-gar-refit` (with group act-order): "
            + parent("matgptq-parent-gar-refit"),
        ),
        (
            "`--mse`, `--mse-weighted`",
            " / ".join(
                show(METHOD_DEFAULTS[m]["mse"] and METHOD_DEFAULTS[m]["mse_weighted"])
                for m in (Method.GPTQ, Method.MATGPTQ, Method.RTN)
            ),
            "the scale searched (since 2026-11-29 on 30 of the 80 grid points, coarse to fine; its error and time "
            "against all 80: [mse_search](../results/README.md#studies-that-left-this-branch); the ablation's rows "
            "measured before then scored all 80, the page gives each row's commit), its error weighted by H_kk; GPTQ "
            "with act order, `ao-static` → `default` (with the refit): "
            + _step(cells, "ao-static", "default")
            + "; with GAR, `gar` → `"
            + gar
            + "`: "
            + _step(cells, "gar", gar)
            + "; the search (and its weighting) without and with the refit, GAR, "
            "`gar-refit` → `" + gar + "`: " + _step(cells, "gar-refit", gar) + "; a parent, `matgptq-parent` → "
            "`matgptq-parent-gar-mse-w-refit`: " + parent("matgptq-parent-gar-mse-w-refit") + "; with act order, "
            "`matgptq-parent-ao-static-refit-bf16` → `matgptq-parent-ao-static-mse-w-refit-bf16`: "
            + _step(cells, "matgptq-parent-ao-static-refit-bf16", "matgptq-parent-ao-static-mse-w-refit-bf16")
            + " (the parent's slices against the default GPTQ: [matgptq defaults](../decisions/matgptq-defaults.md))",
        ),
        (
            "`--bit-weights`",
            f"- / 1 each, {MASTER_BIT_WEIGHT:g} for the master / -",
            "a parent's weight λ_r of each "
            "target width's error: a larger master weight favours the widest slice over the narrow ones; the trade-off "
            "measured: [matgptq defaults](../decisions/matgptq-defaults.md)",
        ),
        (
            "`--damp`",
            value("damp"),
            "GPTQ's and llm-compressor's; GPTQModel's 0.05 instead, with GAR and the "
            f"defaults' other options (`{gar}` → `{gar}-damp0.05`): " + _step(cells, gar, f"{gar}-damp0.05"),
        ),
        (
            "true-sequential (`--no-true-sequential`)",
            field("true_sequential"),
            "each group of a block's Linears "
            "calibrated on the outputs of the groups before it, already quantized (GPTQModel's default); all of a "
            f"block's Linears from the block's inputs instead, with GAR (`{gar}` → `{gar}-not-seq`): "
            + _step(cells, gar, f"{gar}-not-seq")
            + _cpu(cells, gar, f"{gar}-not-seq"),
        ),
        (
            "`--dtype`",
            "auto / auto / auto",
            "the model's own dtype, except that a bfloat16 (float16) model "
            "calibrates in float32 (and is written in its own dtype) on a CPU without AVX512-BF16 or AMX (AMX-FP16), "
            "which emulates half products several times slower than float32's, and that GPTQ or MatGPTQ of a float32 "
            "model runs its calibration passes in bfloat16 on a CPU with AVX512-BF16 or AMX, from the float32 weights, written in "
            "float32 (GPTQModel's CPU dtype, without rounding the weights): the defaults' options in float32 "
            "(`ao-static-mse-w-refit`) → `default` on such a CPU: "
            + _step(cells, "ao-static-mse-w-refit", "default")
            + _cpu(cells, "ao-static-mse-w-refit", "default")
            + "; `--dtype bfloat16` (the weights rounded too) "
            f"with GAR (`{gar}` → `{gar}-bf16`): "
            + _step(cells, gar, f"{gar}-bf16")
            + _cpu(cells, gar, f"{gar}-bf16")
            + "; the defaults' options so (`ao-static-mse-w-refit` → `ao-static-mse-w-refit-bf16`; what a model stored "
            "in bfloat16, as SmolLM2 is published, gets on such a CPU): "
            + _step(cells, "ao-static-mse-w-refit", "ao-static-mse-w-refit-bf16")
            + _cpu(cells, "ao-static-mse-w-refit", "ao-static-mse-w-refit-bf16")
            + "; a parent, float32 passes (`matgptq-default-fp32`) → `matgptq-default`: "
            + _step(cells, "matgptq-default-fp32", "matgptq-default")
            + _cpu(cells, "matgptq-default-fp32", "matgptq-default")
            + "; end to end CPU time: "
            "[bench_pipeline](../results/bench_pipeline.md)",
        ),
        (
            "`--nsamples` × `--seqlen`",
            f"{CalibConfig.nsamples} × {CalibConfig.seqlen}",
            "the calibration size; the "
            "ablation's other rows calibrate on 64 × 512, the same 32,768 tokens in half as many windows; with GAR, "
            f"`{gar}` → 128 × 256 (`{gar}-128x256`): "
            + _step(cells, gar, f"{gar}-128x256")
            + _cpu(cells, gar, f"{gar}-128x256")
            + f"; twice the tokens in longer windows, `{gar}` → "
            "128 × 512: "
            + _step(cells, gar, f"{gar}-128x512")
            + _cpu(cells, gar, f"{gar}-128x512")
            + "; twice the windows, 128 × 256 → 256 × 256: "
            + _step(cells, "gar-mse-w-refit-128x256", "gar-mse-w-refit-256x256")
            + _cpu(cells, "gar-mse-w-refit-128x256", "gar-mse-w-refit-256x256"),
        ),
    ]
    lines = [
        "| option | gptq / matgptq / rtn | why (SmolLM2-135M-Instruct, g128; [gptq_defaults](../results/gptq_defaults.md)) |",
        "|---|---|---|",
    ] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def _default_row(parent: bool) -> str | None:
    """The row (a parent row, or a GPTQ row without a calibration size of its own) whose spelled-out options are
    `--method matgptq`'s or `--method gptq`'s defaults today (METHOD_DEFAULTS), if any."""
    from matgptq.quantization.config import Method
    from matgptq.quantization.method_configs import METHOD_DEFAULTS

    want = {**ALL, **{k: v for k, v in METHOD_DEFAULTS[Method.MATGPTQ if parent else Method.GPTQ].items() if k in ALL}}
    spelled = lambda r: {**ALL, **{k: v for k, v in ROWS[r].items() if k != "method"}}  # noqa: E731
    return next((r for r in ROWS if isinstance(ROWS[r], dict) and is_parent(r) == parent and spelled(r) == want), None)


def readme_block(data: dict) -> str:
    """The README's comparison: `quantize --method gptq` and a parent, each with no options, against the peers'
    defaults, seed means (the page gives CPU time, memory and zero-shot accuracy)."""
    cells = cells_of(data)
    peers = [p for p in ("gptqmodel", "llmcompressor", "llmcompressor-g64") if any(k[0] == p for k in cells)]
    # its slices, the parent made with no options either: run so (`matgptq-default`), or a row spelling its defaults
    default_parent = "matgptq-default" if any(k[0] == "matgptq-default" for k in cells) else _default_row(parent=True)
    parent = any(k[0] == default_parent for k in cells)
    head = (
        "| bits | matgptq, no options | "
        + f"MatGPTQ parent ({PARENT_WIDTHS}), its slice, no options | " * parent
        + " | ".join(PEER_LABELS[p] for p in peers)
        + " | ours / best peer |"
    )
    lines = [head, "|---" * (3 + parent + len(peers)) + "|"]

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
        versus = (
            f"ppl ×{ours['ppl'] / min(g['ppl'] for g in found):.2f}, KL ×{ours['kl'] / min(g['kl'] for g in found):.2f}"
            if found
            else "-"
        )
        mat = f"{fmt(cells.get((default_parent, bits)))} | " * parent
        lines.append(f"| {bits} | {fmt(ours)} | {mat}" + " | ".join(fmt(g) for g in got) + f" | {versus} |")
    return "\n".join(lines) + (
        "\n\nWikiText-2 perplexity ± its spread over calibration seeds (and KL to the float "
        "model) of SmolLM2-135M-Instruct at group size 128, every tool on the same windows "
        "(llm-compressor cannot quantize its 576-column layers at 128, so it runs at 64). The "
        "parent is one quantization serving every width. Time, memory and zero-shot accuracy: "
        "[gptq_defaults](docs/results/gptq_defaults.md)."
    )


# The parent's targets against the default GPTQ at each width (issue #102): (bits, what, limit of parent / GPTQ)
PARENT_TARGETS = ((3, "ppl", 1.05), (3, "kl", 1.10), (4, "ppl", 1.05), (4, "kl", 1.10), (8, "kl", 2.0))
LAMBDA_ROWS = {
    1: "matgptq-parent-ao-static-mse-w-refit-bf16-l1",
    4: "matgptq-parent-ao-static-mse-w-refit-bf16-l4",
    16: "matgptq-parent-ao-static-mse-w-refit-bf16",
}


def parent_block(data: dict) -> str:
    """docs/decisions/matgptq-defaults.md's tables: the default parent's slices against the default GPTQ at each
    width (`matgptq-default` against `default`, both run with no option), the master weight's trade-off between the
    widths, and the parent's cost against one GPTQ run and against the per-width runs it replaces."""
    cells = cells_of(data)
    lines = [
        "| width | measure | GPTQ, no options | parent's slice, no options | parent / GPTQ | target | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for bits, key, limit in PARENT_TARGETS:
        g, p = cells.get(("default", bits)), cells.get(("matgptq-default", bits))
        if not (g and p):
            lines.append(f"| {bits} | {key} | not run | not run | | ≤ {limit:.2f}× | |")
            continue
        fmt = (
            (lambda c: f"{c[key]:.2f} ± {c[key + '_spread']:.2f}")
            if key == "ppl"
            else (lambda c: f"{c[key]:.4f} ± {c[key + '_spread']:.4f}")
        )
        ratio = p[key] / g[key]
        lines.append(
            f"| {bits} | {key.upper() if key == 'kl' else key} | {fmt(g)} | {fmt(p)} | {ratio:.3f}× | "
            f"≤ {limit:.2f}× | {'met' if ratio <= limit else 'missed'} |"
        )
    n = min(
        (cells[(r, b)]["seeds"] for r in ("default", "matgptq-default") for b in (3, 4, 8) if (r, b) in cells),
        default=0,
    )
    out = "\n".join(lines) + (
        f"\n\nSmolLM2-135M-Instruct, g128, `--bits 3,4,8` for the parent; seed means ± spread "
        f"(max − min) over {n} calibration seeds; KL to the float model.\n\n"
    )
    lam = [
        "| λ for 3, 4, 8 | 3-bit ppl | 3-bit KL | 4-bit ppl | 4-bit KL | 8-bit ppl | 8-bit KL | seeds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w, row in LAMBDA_ROWS.items():
        got = [cells.get((row, b)) for b in (3, 4, 8)]
        if all(got):
            cols = " | ".join(f"{c['ppl']:.2f} | {c['kl']:.4f}" for c in got)
            lam.append(f"| 1, 1, {w} | {cols} | {min(c['seeds'] for c in got)} |")
    out += "\n".join(lam) + (
        "\n\nThe master weight λ_8 with the new defaults' other options (`"
        + LAMBDA_ROWS[16]
        + "` and its `-l4`, `-l1` rows), calibrated in bfloat16."
    )
    return out + _parent_cost(cells) + _parent_parts(data["models"].get("SmolLM2-135M-Instruct", {}).get("runs", {}))


def _parent_parts(runs: dict) -> str:
    """Each part of the parent's defaults turned alone (PARENT_PARTS) against the default parent, per width: the
    ratio of seed means over the seeds both were run with, the range of the per-seed ratios beside it (a part wins
    or loses on every seed when its range stays on one side of 1×), and those seeds' count."""

    def seeds(row: str) -> dict[int, dict]:
        return {int(k.rsplit("seed", 1)[1]): r["eval"] for k, r in runs.items() if k.startswith(row) and "eval" in r}

    lines = []
    for part, flags in PARENT_PARTS.items():
        row, cols, n = f"matgptq-default-{part}", [], set()
        for bits, key in ((3, "ppl"), (3, "kl"), (4, "ppl"), (4, "kl"), (8, "kl")):
            a, b = seeds(f"matgptq-default/g128/{bits}/"), seeds(f"{row}/g128/{bits}/")
            common = sorted(set(a) & set(b))
            mean = lambda ev: sum(ev[s][key] for s in common) / len(common)  # noqa: E731
            ratios = [b[s][key] / a[s][key] for s in common]
            spread = f" ({min(ratios):.2f}–{max(ratios):.2f})" if len(common) > 1 else ""
            cols.append(f"{mean(b) / mean(a):.3f}×{spread}" if common else "-")
            n |= {len(common)}
        if any(c != "-" for c in cols):
            lines.append(f"| `{' '.join(flags)}` | " + " | ".join(cols) + f" | {min(n - {0}, default=0)} |")
    head = "| `--method matgptq --bits 3,4,8` with | 3-bit ppl | 3-bit KL | 4-bit ppl | 4-bit KL | 8-bit KL | seeds |"
    note = (
        "Each part turned alone, over the default parent's: above 1× the default's slice is the better one; in "
        "brackets the lowest and highest ratio of one seed's pair."
    )
    return "\n\n" + "\n".join([head, "|---" * 7 + "|", *lines]) + "\n\n" + note if lines else ""


def _parent_cost(cells: dict) -> str:
    """The default parent's CPU time and peak memory against one default GPTQ run and the sum of the three it
    replaces (3, 4 and 8 bits), seed means of the runs on a quiet machine."""
    p = cells.get(("matgptq-default", 3))
    g = [cells.get(("default", b)) for b in (3, 4, 8)]
    if not (p and all(g)) or "cpu_quiet" not in p or not all("cpu_quiet" in c for c in g):
        return ""
    one, total = g[0], sum(c["cpu_quiet"] for c in g)
    return (
        f"\n\nCost, each run with the machine's cores to itself: the parent took {p['cpu_quiet']:.0f} CPU s and {p['rss_quiet']:.2f} GB peak "
        f"RSS; one default GPTQ-3 run {one['cpu_quiet']:.0f} CPU s and {one['rss_quiet']:.2f} GB "
        f"(×{p['cpu_quiet'] / one['cpu_quiet']:.2f} and ×{p['rss_quiet'] / one['rss_quiet']:.2f}); the three "
        f"per-width runs it replaces (3, 4 and 8 bits) {total:.0f} CPU s together (×{p['cpu_quiet'] / total:.2f}),"
        f" each at most {max(c['rss_quiet'] for c in g):.2f} GB."
    )
