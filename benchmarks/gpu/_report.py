"""docs/results/gpu.md from docs/results/gpu.json (benchmarks/gpu/check.py writes both): `page(results)`.

The goals are issue #46's (from ../shared/reference/gpu-anchors.md §5): at batch 1 on 8192×8192 the nested kernel
≥ 3.3× fp16 torch.matmul at 4 bits, ≥ 4× at 3 bits, ≥ 5× at 2 bits; at batch 16 ≥ 1.5× at 4 bits; GPU quantize
≤ 0.5× llm-compressor 0.14's 2.19 s (128×512) / 7.87 s (128×2048) per Llama-3.1-8B block.
"""

from __future__ import annotations

import math

KERNEL_GOALS = [
    ((8192, 8192), 1, 4, 3.3),
    ((8192, 8192), 1, 3, 4.0),
    ((8192, 8192), 1, 2, 5.0),
    ((8192, 8192), 16, 4, 1.5),
]
QUANTIZE_GOAL = 0.5


def _f(x, digits: int = 1) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _best(rows: list[dict], shape, batch: int, bits: int) -> dict | None:
    hits = [r for r in rows if tuple(r["shape"]) == tuple(shape) and r["batch"] == batch and r["bits"] == bits]
    return min(hits, key=lambda r: r["us"]) if hits else None


def _goals(res: dict) -> list[str]:
    rows = res.get("kernels", {}).get("gemv", [])
    out = ["| goal | measured | torch int4 (tinygemm) | |", "|---|---|---|---|"]
    for shape, batch, bits, goal in KERNEL_GOALS:
        r = _best(rows, shape, batch, bits)
        got = r["speedup_vs_fp16"] if r else None
        int4 = f"{r['fp16_us'] / r['int4_us']:.2f}× (4-bit)" if r and r.get("int4_us") else "–"
        met = "not measured" if got is None else "met" if got >= goal else "missed"
        out.append(
            f"| {shape[0]}×{shape[1]}, batch {batch}, {bits}-bit ≥ {goal}× fp16 | "
            f"{_f(got, 2)}× ({r['layout'] if r else '–'} layout) | {int4} | {met} |"
        )
    for q in res.get("quantize", {}).get("runs", []):
        ratio = q.get("ratio_per_block")
        goal = (
            f"quantize {q.get('method')} {q.get('nsamples')}×{q.get('seqlen')} ≤ {QUANTIZE_GOAL}× "
            f"llm-compressor's {q.get('anchor_s')} s per block"
        )
        if ratio is None:
            why = "skipped (time budget)" if q.get("skipped") else "timed out" if q.get("timed_out") else "failed"
            out.append(f"| {goal} | not measured: {why} | | not measured |")
            continue
        met = "met" if ratio <= QUANTIZE_GOAL else "missed"
        second = q.get("ratio_second_block")
        out.append(
            f"| {goal} | {ratio:.2f}× ({_f(q.get('s_per_block'), 2)} s per block over {q.get('n_blocks')} "
            f"blocks, opening and writing included; the second block alone {_f(q.get('second_block_s'), 2)} s: "
            f"{_f(second, 2)}×) | | {met} |"
        )
    return out


def _kernels(res: dict) -> list[str]:
    k = res.get("kernels", {})
    if k.get("error"):
        return [f"Kernels: failed: `{k['error'][:300]}`"]
    out = [
        "| N×K | batch | bits | layout | kernel | µs | fp16 µs | × fp16 | int4 (tinygemm) µs | rel. error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in k.get("gemv", []):
        out.append(
            f"| {r['shape'][0]}×{r['shape'][1]} | {r['batch']} | {r['bits']} | {r['layout']} | {r['kernel']} "
            f"| {_f(r['us'])} | {_f(r['fp16_us'])} | {_f(r['speedup_vs_fp16'], 2)} | {_f(r.get('int4_us'))} "
            f"| {r['rel_error']:.1e} |"
        )
    errs = {b.get("int4_error") for b in k.get("baselines", []) if b.get("int4_error")}
    out += [f"\ntorch int4 baseline: {e}" for e in errs]
    first = _best(res.get("kernels_first_version", {}).get("gemv", []), (8192, 8192), 1, 4)
    if first:
        out.append(
            f"\nThe first version of the kernels ({res['kernels_first_version']['note']}): "
            f"{first['us']:.0f} µs at 8192×8192, batch 1, 4 bits."
        )
    chosen = [f"batch {b}: {v['chosen']}" for b, v in k.get("sweep", {}).items()]
    return out + ["", "Launch parameters (fastest correct candidate at 8192×8192, 4 bits): " + "; ".join(chosen)]


def _decode(res: dict) -> list[str]:
    d = res.get("decode", {})
    if d.get("error"):
        return [f"Decode: failed: `{d['error'][:300]}`"]
    out = [
        "| layers | bits | batch | tokens/s | step ms | × fp16 | ms per block | block × fp16 | MB per block |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in d.get("rows", []):
        out.append(
            f"| {r['variant']} | {r['bits']} | {r['batch']} | {_f(r['tokens_per_s'])} | {_f(r['step_ms'], 2)} "
            f"| {_f(r['speedup_vs_fp16'], 2)} | {_f(r['block_ms'], 3)} | {_f(r['block_speedup_vs_fp16'], 2)} "
            f"| {r['block_bytes'] / 1e6:.0f} |"
        )
    return out


def _quantize(res: dict) -> list[str]:
    q = res.get("quantize", {})
    if q.get("error"):
        return [f"Quantize: failed: `{q['error'][:300]}`"]
    out = [
        "| method | calibration | s per block | second block s | solver s per block | forward / Hessian / solver | "
        "peak GPU GiB | × llm-compressor | codes vs CPU | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in q.get("runs", []):
        sh = r.get("shares") or {}
        shares = " / ".join(
            _f(sh.get(k) * 100 if sh.get(k) is not None else None, 0) + "%" for k in ("forward", "hessian", "solver")
        )
        agree = r.get("codes_vs_cpu") or {}
        agree = (
            f"{'ok' if agree.get('ok') else 'OFF'}: {agree.get('differ_frac', 0) * 100:.2f}% differ, max step "
            f"{agree.get('max_step')}"
            if agree.get("codes")
            else agree.get("error") or "–"
        )
        note = r.get("error") or ("skipped" if r.get("skipped") else "timed out" if r.get("timed_out") else "")
        out.append(
            f"| {r.get('method')} {r.get('bits')} | {r.get('nsamples')}×{r.get('seqlen')} | "
            f"{_f(r.get('s_per_block'), 2)} | {_f(r.get('second_block_s'), 2)} | "
            f"{_f(r.get('solver_s_per_block'), 2)} | {shares} | {_f(r.get('peak_gpu_gib'), 2)} | "
            f"{_f(r.get('ratio_per_block'), 2)} | {agree} "
            f"| {str(note)[:120]} |"
        )
    s = res.get("search", {})
    out.append("")
    out.append(
        f"Search scoring ({s.get('score_dtype')}): {_f(s.get('tokens_per_s'), 0)} tokens/s "
        f"({_f(s.get('tokens_per_s_with_apply'), 0)} with set_bits)"
        if s.get("tokens_per_s")
        else f"Search scoring: {s.get('error', 'not measured')}"
    )
    return out


def _search_run(s: dict | None) -> list[str]:
    """`matgptq search` on the device (benchmarks/gpu/_search.py measure_search_run): a row per budget."""
    if not s:
        return ["not measured"]
    out = [
        f"`{s.get('command', 'matgptq search')}`: {_f(s.get('wall_s'), 1)} s wall for the "
        f"{len(s.get('budgets', '').split(','))} budgets ({s.get('time_limit_min')} min asked)"
        + (f"; {s['error'][:300]}" if s.get("error") else "")
        + ".",
        "",
        "| budget | chosen | calib. KL | generations | evaluations | s | teacher s | tables s | search s | report s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in s.get("rows", []):
        out.append(
            f"| {r['budget']} | {r.get('chosen')} | {_f(r.get('kl'), 4)} | {r.get('generations')} | "
            f"{r.get('evaluations')} | {_f(r.get('seconds'))} | {_f(r.get('teacher_seconds'))} | "
            f"{_f(r.get('tables_seconds'))} | {_f(r.get('search_seconds'))} | "
            f"{_f(r.get('report_seconds'))} |"
        )
    return out


def _more(res: dict) -> list[str]:
    """A longer search of the same parent, when gpu.json holds one (search_run_more: `--parts search_run` alone)."""
    s = res.get("search_run_more")
    return ["", f"Again alone ({s.get('run')}):", "", *_search_run(s)] if s else []


def _tests(res: dict) -> list[str]:
    t = res.get("tests", {})
    out = [f"Tests compiled on the GPU: {t.get('summary') or t.get('error') or t.get('skipped', 'not run')}"]
    out += [f"- {f}" for f in t.get("failures", [])]
    return out + [f"- re-run {r['date']} at {r['commit']}: {r['tests']}: {r['summary']}" for r in t.get("reruns", [])]


def _runs(res: dict) -> list[str]:
    """Which run measured which part, where the JSON joins several (gpu.json's optional "runs")."""
    return [f"- {r['date']}: {', '.join(r['parts'])}: {r['note']}" for r in res.get("runs", [])]


def page(res: dict) -> str:
    runs = _runs(res)
    lines = [
        f"# GPU check ({res.get('device')}, torch {res.get('torch')}, triton {res.get('triton')}, "
        f"transformers {res.get('transformers')}, {res.get('date')})",
        "",
        "Written by `make gpu-check` (benchmarks/gpu/check.py); every figure below is from docs/results/gpu.json.",
        *(["", "Runs:", *runs] if runs else []),
        "",
        "## Goals (issue #46)",
        "",
        *_goals(res),
        "",
        *_tests(res),
        "",
        "## Nested kernels against fp16 torch.matmul (CUDA graphs, weights read from HBM)",
        "",
        *_kernels(res),
        "",
        "## Decode, Llama-3.1-8B-shaped blocks (CUDA graph per step)",
        "",
        *_decode(res),
        "",
        "## Quantize on the GPU, per Llama-3.1-8B-shaped block",
        "",
        *_quantize(res),
        "",
        "## The search on the GPU (the MatGPTQ parent above, issue #44's budgets)",
        "",
        *_search_run(res.get("search_run")),
        *_more(res),
        "",
    ]
    return "\n".join(lines)
