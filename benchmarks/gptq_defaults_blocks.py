"""The blocks benchmarks/gptq_defaults.py's measurements give hand-written pages, rendered from
docs/results/gptq_defaults.json alone: the guide's table of defaults (docs/guide/quantize.md#defaults) and the
README's comparison with the peers (README.md#gptq-defaults); `python -m benchmarks.render_docs` re-renders them.
The page and its figure: gptq_defaults_report.py."""

from __future__ import annotations

from benchmarks.gptq_defaults_report import TASKS, cells_of
from benchmarks.gptq_defaults_rows import ALL, AS_TYPED, PARENT_WIDTHS, PEER_LABELS, ROWS, is_parent


def _step(cells: dict, before: str, after: str, after_cells: dict | None = None) -> str:
    """What going from row `before` to row `after` (of `after_cells`, default the same cells) did, per width:
    perplexity and KL ratios (seed means)."""
    parts = []
    for bits in (3, 4):
        a, b = cells.get((before, bits)), (cells if after_cells is None else after_cells).get((after, bits))
        if a and b:
            n = min(a["seeds"], b["seeds"])
            tie = n > 1 and all(abs(b[k] - a[k]) <= max(a[k + "_spread"], b[k + "_spread"]) for k in ("ppl", "kl"))
            parts.append(f"{bits}-bit ppl ×{b['ppl'] / a['ppl']:.2f}, KL ×{b['kl'] / a['kl']:.2f} ({n} seed"
                         f"{'s' if n > 1 else ''}{', a tie: both inside the seed spread' if tie else ''})")  # fmt: skip
    return "; ".join(parts) or "not measured"


def _cpu(cells: dict, before: str, after: str) -> str:
    """CPU time and peak memory of row `after` over row `before`, per width (seed means), or nothing where the two
    were not measured on the same machine (`_machine`: CPU times of two hosts or days do not compare)."""
    parts = {bits: f"CPU ×{b['cpu_quiet'] / a['cpu_quiet']:.2f}, peak RSS ×{b['rss_quiet'] / a['rss_quiet']:.2f} "
                   f"(runs on a quiet machine)" for bits in (3, 4)
             if (a := cells.get((before, bits))) and (b := cells.get((after, bits))) and "cpu_quiet" in a
             and "cpu_quiet" in b and a["machine"] and a["machine"] == b["machine"]}  # fmt: skip
    if len(set(parts.values())) == 1:  # one run for every width (a parent), or the same ratios
        return "; " + next(iter(parts.values()))
    return "".join(f"; {bits}-bit {text}" for bits, text in parts.items())


def defaults_block(data: dict) -> str:
    """docs/guide/quantize.md's table of defaults: each method's value (METHOD_DEFAULTS, the code) and, for GPTQ, what
    the ablation measured for it on SmolLM2-135M-Instruct at g128 (docs/results/gptq_defaults.json)."""
    from matgptq.quantization.calibration import CalibConfig
    from matgptq.quantization.config import CONFIGS, METHOD_DEFAULTS, Method

    cells = cells_of(data)
    gar = "gar-mse-w-refit"  # the defaults until 2026-12-01: GAR with the scale search, its weighting and the refit
    show = lambda v: ("on" if v else "off") if isinstance(v, bool) else str(v)  # noqa: E731
    # an option a method does not have (RTN's damping) shows as "-"
    value = lambda k: " / ".join(show(METHOD_DEFAULTS[m][k]) if k in METHOD_DEFAULTS[m] else "-"  # noqa: E731
                                 for m in (Method.GPTQ, Method.MATGPTQ, Method.RTN))
    # an option METHOD_DEFAULTS does not show, from the configs themselves ("-" where the method lacks it: RTN)
    field = lambda k: " / ".join(show(getattr(CONFIGS[m](), k)) if hasattr(CONFIGS[m](), k) else "-"  # noqa: E731
                                 for m in (Method.GPTQ, Method.MATGPTQ, Method.RTN))
    parent = lambda after: _step(cells, "matgptq-parent", after) + _cpu(cells, "matgptq-parent", after)  # noqa: E731
    rows = [
        ("`--group-size`", value("group_size"), "the field's default (GPTQModel, llm-compressor, vLLM's kernels); -1 "
         f"(one scale per row) stores 0.125 fewer bits per weight; -1 → 128 for `{gar}` (per channel the default's "
         "act order with static groups is the same computation as GAR, bit for bit: one group, one order, its scale "
         "from the weights before any update; tests/quantization/test_solver.py): "
         + _step(cells_of(data, group=-1), gar, gar, cells)),
        ("`--act-order`, `--static-groups`", value("act_order") + "; " + value("static_groups"),
         "act order (every column by decreasing H_kk) with static groups (each group's scale from its original "
         "columns, so the layout stays the plain one: no g_idx, every export takes it); in place of GAR with the "
         "defaults' other options (scale search, weighting, refit), `" + gar + "` → `default`: "
         + _step(cells, gar, "default") + _cpu(cells, gar, "default") + "; with those options off, `gar` → "
         "`ao-static`: " + _step(cells, "gar", "ao-static") + " (act order needs the scale search at 3 bits)"),
        ("`--group-act-order`", value("group_act_order"), "GAR (whole groups, and the columns inside each, by "
         "decreasing H_kk; GPTQModel's default): a parent's default, and GPTQ's until act order with static groups "
         "replaced it; GPTQ, plain → `gar`: " + _step(cells, "plain", "gar")),
        ("`--refit-scales`", value("refit_scales"), "the codes' scales refit by least squares; a parent, "
         "`matgptq-parent` → `matgptq-parent-gar-refit` (with group act-order): " + parent("matgptq-parent-gar-refit")),
        ("`--mse`, `--mse-weighted`", " / ".join(show(METHOD_DEFAULTS[m]["mse"] and METHOD_DEFAULTS[m]["mse_weighted"])
                                               for m in (Method.GPTQ, Method.MATGPTQ, Method.RTN)),
         "the scale searched (since 2026-11-29 on 30 of the 80 grid points, coarse to fine; its error and time "
         "against all 80: [mse_search](../results/mse_search.md); the ablation's rows measured before then scored "
         "all 80, the page gives each row's commit), its error weighted by H_kk; GPTQ with act order, `ao-static` "
         "→ `default` (with the refit): " + _step(cells, "ao-static", "default") + "; with GAR, `gar` → `" + gar
         + "`: " + _step(cells, "gar", gar) + "; the search (and its weighting) without and with the refit, GAR, "
         "`gar-refit` → `" + gar + "`: " + _step(cells, "gar-refit", gar) + "; a parent, `matgptq-parent` → "
         "`matgptq-parent-gar-mse-w-refit` (off for a parent, for its CPU time): " + parent("matgptq-parent-gar-mse-w-refit")),
        ("`--damp`", value("damp"), "GPTQ's and llm-compressor's; GPTQModel's 0.05 instead, with GAR and the "
         f"defaults' other options (`{gar}` → `{gar}-damp0.05`): " + _step(cells, gar, f"{gar}-damp0.05")),
        ("true-sequential (`--no-true-sequential`)", field("true_sequential"), "each group of a block's Linears "
         "calibrated on the outputs of the groups before it, already quantized (GPTQModel's default); all of a "
         f"block's Linears from the block's inputs instead, with GAR (`{gar}` → `{gar}-not-seq`): "
         + _step(cells, gar, f"{gar}-not-seq") + _cpu(cells, gar, f"{gar}-not-seq")),
        ("`--dtype`", "auto / auto / auto", "the model's own dtype, except that a bfloat16 (float16) model "
         "calibrates in float32 (and is written in its own dtype) on a CPU without AVX512-BF16 or AMX (AMX-FP16), "
         "which emulates half products several times slower than float32's, and that GPTQ of a float32 model runs "
         "its calibration passes in bfloat16 on a CPU with AVX512-BF16 or AMX, from the float32 weights, written in "
         "float32 (GPTQModel's CPU dtype, without rounding the weights): the defaults' options in float32 "
         "(`ao-static-mse-w-refit`) → `default` on such a CPU: " + _step(cells, "ao-static-mse-w-refit", "default")
         + _cpu(cells, "ao-static-mse-w-refit", "default") + "; `--dtype bfloat16` (the weights rounded too) "
         f"with GAR (`{gar}` → `{gar}-bf16`): " + _step(cells, gar, f"{gar}-bf16") + _cpu(cells, gar, f"{gar}-bf16")
         + "; the defaults' options so (`ao-static-mse-w-refit` → `ao-static-mse-w-refit-bf16`; what a model stored "
         "in bfloat16, as SmolLM2 is published, gets on such a CPU): "
         + _step(cells, "ao-static-mse-w-refit", "ao-static-mse-w-refit-bf16")
         + _cpu(cells, "ao-static-mse-w-refit", "ao-static-mse-w-refit-bf16") + "; end to end CPU time: "
         "[bench_pipeline](../results/bench_pipeline.md)"),
        ("`--nsamples` × `--seqlen`", f"{CalibConfig.nsamples} × {CalibConfig.seqlen}", "the calibration size; the "
         "ablation's other rows calibrate on 64 × 512, the same 32,768 tokens in half as many windows; with GAR, "
         f"`{gar}` → 128 × 256 (`{gar}-128x256`): " + _step(cells, gar, f"{gar}-128x256")
         + _cpu(cells, gar, f"{gar}-128x256") + f"; twice the tokens in longer windows, `{gar}` → "
         "128 × 512: " + _step(cells, gar, f"{gar}-128x512")
         + _cpu(cells, gar, f"{gar}-128x512") + "; twice the windows, 128 × 256 → 256 × 256: "
         + _step(cells, "gar-mse-w-refit-128x256", "gar-mse-w-refit-256x256")
         + _cpu(cells, "gar-mse-w-refit-128x256", "gar-mse-w-refit-256x256")),
    ]  # fmt: skip
    lines = ["| option | gptq / matgptq / rtn | why (SmolLM2-135M-Instruct, g128; [gptq_defaults](../results/gptq_defaults.md)) |",
             "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]  # fmt: skip
    return "\n".join(lines)


def _default_row(parent: bool) -> str | None:
    """The row (a parent row, or a GPTQ row without a calibration size of its own) whose spelled-out options are
    `--method matgptq`'s or `--method gptq`'s defaults today (METHOD_DEFAULTS), if any."""
    from matgptq.quantization.config import METHOD_DEFAULTS, Method

    want = {**ALL, **{k: v for k, v in METHOD_DEFAULTS[Method.MATGPTQ if parent else Method.GPTQ].items() if k in ALL}}
    spelled = lambda r: {**ALL, **{k: v for k, v in ROWS[r].items() if k != "method"}}  # noqa: E731
    return next((r for r in ROWS if isinstance(ROWS[r], dict) and is_parent(r) == parent and spelled(r) == want),
                None)  # fmt: skip


def readme_block(data: dict, pipeline: dict) -> str:
    """The README's comparison: `quantize --method gptq` with no options against the peers' defaults, seed means;
    its cost from `pipeline` (bench_pipeline.json)."""
    cells = cells_of(data)
    peers = [p for p in ("gptqmodel", "llmcompressor", "llmcompressor-g64") if any(k[0] == p for k in cells)]
    default_parent = _default_row(parent=True)
    parent = any(k[0] == default_parent for k in cells)  # its slices, the parent made with no options either
    head = ("| bits | matgptq, no options | " + f"MatGPTQ parent ({PARENT_WIDTHS}), its slice, no options | " * parent
            + " | ".join(PEER_LABELS[p] for p in peers) + " | ours / best peer |")  # fmt: skip
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
        versus = (f"ppl ×{ours['ppl'] / min(g['ppl'] for g in found):.2f}, KL ×{ours['kl'] / min(g['kl'] for g in found):.2f}"
                  if found else "-")  # fmt: skip
        mat = f"{fmt(cells.get((default_parent, bits)))} | " * parent
        lines.append(f"| {bits} | {fmt(ours)} | {mat}" + " | ".join(fmt(g) for g in got) + f" | {versus} |")
    n = min((c["seeds"] for k, c in cells.items() if k[0] == "default"), default=0)
    return "\n".join(lines) + (f"\n\nWikiText-2 perplexity ± its spread over {n} calibration seeds (and KL to the "
                               "float model) of SmolLM2-135M-Instruct at group size 128, every tool on the same "
                               "windows; llm-compressor cannot quantize its 576-column layers at 128, so it runs at 64 "
                               "([gptq_defaults](docs/results/gptq_defaults.md): the ablation, CPU time, memory)."
                               + (" The parent is one quantization serving every width; what GPTQ's scale options do "
                                  "for it: [defaults](docs/guide/quantize.md#defaults)." if parent else "")
                               + _tasks_sentence(data, cells, peers) + _own_size_sentence(cells)
                               + _cost_sentence(pipeline))  # fmt: skip


def _own_size_sentence(cells: dict) -> str:
    """What `quantize` gives with its own calibration size (the table gives every tool 64 × 512), where measured."""
    from matgptq.quantization.calibration import CalibConfig

    row = next((r for r, v in ROWS.items() if v == AS_TYPED), None)  # the command exactly as typed
    got = [(b, c) for b in (3, 4) if (c := cells.get((row, b)))]
    if not got:
        return ""
    at = lambda b, c, k: (f", ×{c[k] / cells[('default', b)][k]:.2f} the table's" if ("default", b) in cells else "")  # noqa: E731
    return (f" As typed, with its own calibration size ({CalibConfig.nsamples} windows of {CalibConfig.seqlen} tokens, "
            "the same number of tokens), `quantize` gives: "
            + "; ".join(f"{b} bits {c['ppl']:.1f} ± {c['ppl_spread']:.1f}{at(b, c, 'ppl')} (KL {c['kl']:.3f}"
                        f"{at(b, c, 'kl')})" for b, c in got) + _cpu(cells, "default", row) + ".")  # fmt: skip


def _tasks_sentence(data: dict, cells: dict, peers: list[str]) -> str:
    """Zero-shot accuracy of `default` and the peers, per width, where every seed of both was scored, or nothing."""
    runs = data["models"].get("SmolLM2-135M-Instruct", {}).get("runs", {})
    fp = runs.get("fp32", {}).get("eval", {}).get("tasks", {})
    acc = lambda c: " / ".join(f"{c[t]:.3f}" for t in TASKS)  # noqa: E731
    full = lambda c: c and all(c.get(t + "_n") == c["seeds"] for t in TASKS)  # noqa: E731
    parts = []
    for bits in (3, 4):
        shown = [("matgptq" if r == "default" else PEER_LABELS[r].replace(" (its defaults)", ""), cells.get((r, bits)))
                 for r in ("default", *peers)]  # fmt: skip
        shown = [(name, c) for name, c in shown if full(c)]
        if len(shown) > 1:
            parts.append(f"{bits} bits " + ", ".join(f"{name} {acc(c)}" for name, c in shown))
    if not parts or not all(t in fp for t in TASKS):
        return ""
    limit = runs["fp32"]["eval"]["limit"]
    return (f" Zero-shot accuracy, ARC-Easy / PIQA (the first {limit} questions of each; a task's standard error is "
            f"up to {100 * (0.25 / limit) ** 0.5:.1f} points), seed means: " + "; ".join(parts)
            + "; the float model " + " / ".join(f"{fp[t]['acc']:.3f}" for t in TASKS) + ".")  # fmt: skip


PEER_NAMES = {"gptqmodel": "GPTQModel (its bfloat16 CPU default)", "gptqmodel-fp32": "GPTQModel in float32",
              "llmcompressor": "llm-compressor"}  # bench_pipeline.py's peer rows


def _cost_sentence(pipeline: dict) -> str:
    """End to end CPU time and peak memory of the command a user types (in the model's float32, and calibrating in
    bfloat16) over the fastest peer's and the leanest peer's, measured side by side in one run of
    benchmarks/bench_pipeline.py (its `matgptq-cli` rows; over several rounds, the median ratio and its range), or
    nothing where that run has none: the ablation's own CPU times come from runs spread over days and machine loads,
    so they are not set side by side here."""
    from benchmarks.bench_pipeline import ratio_cell, summary

    runs = summary(pipeline) if pipeline.get("results") else {}
    a = pipeline.get("args", {})
    auto = next((r["calibrated_in"] for r in pipeline.get("results", []) if r["tool"] == "matgptq-cli"
                 and "calibrated_in" in r), None)  # fmt: skip
    how = "" if auto is None else f", which calibrated in {auto} there" + (
        ": bfloat16 passes from the model's float32 weights" if auto == "bfloat16" else "")  # fmt: skip
    rows = [("matgptq-cli", f"as typed (`--dtype auto`{how})"),
            ("matgptq-cli-fp32", "calibrating in float32"), ("matgptq-cli-bf16", "with `--dtype bfloat16` (the "
            "weights rounded to bfloat16 too: what a model stored in bfloat16 gets on a CPU with AVX512-BF16 or AMX, "
            "and what GPTQModel does)")]  # fmt: skip
    got = [(runs[t], what) for t, what in rows if t in runs and runs[t]["cpu_ratio"]]
    if not got:
        return ""
    fast, lean = got[0][0]["peer_cpu"], got[0][0]["peer_rss"]
    m = pipeline.get("machine")
    where = f" on {m['cpu']}, {m['cores']} cores, at commit {m['commit']}" if m else ""
    n = got[0][0]["runs"]
    against = (f"the CPU time and peak memory of {PEER_NAMES[fast]}" if fast == lean else
               f"the CPU time of {PEER_NAMES[fast]} (the fastest peer) and the peak memory of {PEER_NAMES[lean]} "
               "(the leanest)")  # fmt: skip
    return (f" At {a['bits']} bits g{a['group_size']}, end to end in one run{where}"
            + (f", the median of {n} rounds" if n > 1 else "") + f" ([bench_pipeline](docs/results/bench_pipeline.md)), "
            f"against {against}: " + "; ".join(f"{what} {ratio_cell(c['cpu_ratio'], '×')} and "
                                               f"{ratio_cell(c['rss_ratio'], '×')}" for c, what in got) + ".")  # fmt: skip
