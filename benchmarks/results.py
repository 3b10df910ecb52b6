"""Regenerate the quality tables (and plot) on stories260K with the reference protocol of ../shared/data/README.md.

Calibration: 128 windows × 256 tokens, seed 0, from the last 40% (by characters) of tinystories_val_head.txt.
Perplexity: first 60%, first 40,000 tokens, non-overlapping 256-token windows (matgptq.evaluation.perplexity).
Runs fp32, RTN, GPTQ (plain / act-order / MSE / both) at 2, 3, 4, 6, 8 bits and a MatGPTQ parent (c = 8, R = {3,4,8},
the default variant and λ, symmetric, per-channel, with and without act-order) evaluated at slices 2, 3, 4, 6, 8; also
KL to fp32.
Writes docs/results/stories260k_methods.{json,md,png} (the page and figure are rendered from the JSON alone:
`python -m benchmarks.render_docs` re-renders them).

    python -m benchmarks.results [--quick]     # --quick: 4-bit and 3-bit only (a minute or two)
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

from benchmarks._harness import RESULTS, header, load_json, pyplot, save_figure, write_page

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MODEL = SHARED / "models" / "stories260K"
TEXT = SHARED / "data" / "tinystories" / "tinystories_val_head.txt"
STEM = "stories260k_methods"  # docs/results/STEM.{json,md,png}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="only 3- and 4-bit runs")
    ap.add_argument("--out", default=str(RESULTS), help=f"output directory for {STEM}.{{json,md,png}}")
    ap.add_argument("--from-json", action="store_true", help=f"only re-render {STEM}.md/png from {STEM}.json")
    args = ap.parse_args()
    out = Path(args.out)
    if args.from_json:
        publish(load_json(out / f"{STEM}.json"), out)
        return
    data = {"protocol": __doc__, "rows": measure_rows((3, 4) if args.quick else (2, 3, 4, 6, 8))}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{STEM}.json").write_text(json.dumps(data, indent=2))
    publish(data, out)


def measure_rows(widths: tuple[int, ...]) -> list[dict]:
    """fp32, then RTN and the GPTQ variants at each width, then the MatGPTQ {3,4,8} parents' slices at each width."""
    import torch

    from matgptq.evaluation.perplexity import Teacher, score
    from matgptq.models.hf import load_fp_model, load_tokenizer
    from matgptq.models.text import calibration_windows, eval_windows, read_text, tokenize

    torch.set_num_threads(1)  # stories260K is tiny: one thread is fastest (models/README.md)

    tok = load_tokenizer(MODEL)
    calib = calibration_windows(tokenize(tok, read_text(TEXT, (0.6, 1.0))), 128, 256, 0)
    windows = eval_windows(tokenize(tok, read_text(TEXT, (0.0, 0.6))), 256, 40_000)
    fp = load_fp_model(MODEL)
    ref = Teacher(fp, windows, 32)
    rows: list[dict] = [{"method": "fp32", "options": "", "bits": 32, "ppl": score(fp, windows, None, 32).ppl, "kl": 0.0}]

    def measure(model) -> tuple[float, float]:
        s = score(model, windows, ref, 32)
        return s.ppl, s.kl

    return rows + gptq_rows(fp, calib, widths, measure) + slice_rows(fp, calib, widths, measure)


def gptq_rows(fp, calib, widths: tuple[int, ...], measure) -> list[dict]:
    """RTN and GPTQ (plain, act-order, MSE, both) at each width, each quantized from a copy of `fp`."""
    from matgptq.api import make_config
    from matgptq.quantization.pipeline import quantize_model

    rows = []
    variants = {"": {}, "act-order": {"act_order": True}, "mse": {"mse": True}, "act-order+mse": {"act_order": True, "mse": True}}
    for bits in widths:
        for method, opts in [("rtn", {"": {}}), ("gptq", variants)]:
            for label, kw in opts.items():
                model = copy.deepcopy(fp)
                t0 = time.perf_counter()
                quantize_model(model, calib, make_config(method, bits, **kw), progress=False)
                ppl, kl = measure(model)
                rows.append({"method": method.upper(), "options": label, "bits": bits, "ppl": ppl, "kl": kl,
                             "seconds": time.perf_counter() - t0})  # fmt: skip
                print(f"{method} {bits}b {label}: ppl {ppl:.4f}", flush=True)
    return rows


def slice_rows(fp, calib, slices: tuple[int, ...], measure) -> list[dict]:
    """The slices of a MatGPTQ {3,4,8} parent (plain and act-order) at each width in `slices`."""
    from matgptq.api import make_config
    from matgptq.quantization.pipeline import quantize_model

    rows = []
    for label, kw in [("", {}), ("act-order", {"act_order": True})]:
        model = copy.deepcopy(fp)
        t0 = time.perf_counter()
        layers, _, _ = quantize_model(model, calib, make_config("matgptq", (3, 4, 8), **kw), progress=False)
        seconds = time.perf_counter() - t0
        for r in slices:
            for name, q in layers.items():
                model.get_submodule(name).weight.data = q.slice(r).dequantize()
            ppl, kl = measure(model)
            rows.append({"method": "MatGPTQ slice", "options": label, "bits": r, "ppl": ppl, "kl": kl, "seconds": seconds})
            print(f"matgptq slice {r} {label}: ppl {ppl:.4f}", flush=True)
    return rows


def publish(data: dict, out: Path) -> None:
    """The page and the figure of `data` (the JSON) into `out`."""
    text = page(data)
    write_page(out / f"{STEM}.md", text)
    print(text)
    plot_page(data, out / f"{STEM}.png")


def page(data: dict) -> str:
    """docs/results/stories260k_methods.md from its JSON: every row, then the MatGPTQ quality claims checked."""
    from matgptq.execution import format_table

    rows = data["rows"]
    table = format_table(["method", "options", "bits", "perplexity", "KL to fp32"],
                         [[r["method"], r["options"], r["bits"], r["ppl"], r["kl"]] for r in rows])  # fmt: skip
    return "\n".join([header("benchmarks/results.py", f"{STEM}.json"), table, "", "MatGPTQ quality claims on this run:", "",
                      matgptq_claims(rows), ""])  # fmt: skip


def matgptq_claims(rows: list[dict]) -> str:
    """MatGPTQ's quality claims, checked against this run (same options for GPTQ and MatGPTQ)."""
    get = lambda m, o, b: next((r["ppl"] for r in rows if r["method"] == m and r["options"] == o and r["bits"] == b), None)  # noqa: E731
    lines = ["| options | claim | MatGPTQ | bound | holds |", "|---|---|---|---|---|"]
    for opt in ("", "act-order"):
        checks = [
            ("slice-3 ≤ GPTQ 3-bit", get("MatGPTQ slice", opt, 3), get("GPTQ", opt, 3), 1.0),
            ("slice-4 ≤ 1.01 × GPTQ 4-bit", get("MatGPTQ slice", opt, 4), get("GPTQ", opt, 4), 1.01),
            ("slice-8 ≤ 1.005 × GPTQ 8-bit", get("MatGPTQ slice", opt, 8), get("GPTQ", opt, 8), 1.005),
            ("slice-6 ≤ 1.01 × slice-8", get("MatGPTQ slice", opt, 6), get("MatGPTQ slice", opt, 8), 1.01),
        ]
        for name, value, base, factor in checks:
            if value is not None and base is not None:
                bound = base * factor
                lines.append(f"| {opt or 'plain'} | {name} | {value:.4f} | {bound:.4f} | {'yes' if value <= bound else 'NO'} |")
    return "\n".join(lines)


def plot_page(data: dict, path: Path) -> None:
    """docs/results/stories260k_methods.png from its JSON: perplexity (3-8 bits) and KL (all widths) per method."""
    rows = data["rows"]
    plt = pyplot()
    fig, (ax, ax_kl) = plt.subplots(1, 2, figsize=(10, 4))
    fp = next(r["ppl"] for r in rows if r["method"] == "fp32")
    ax.axhline(fp, color="gray", ls=":", label=f"fp32 ({fp:.3f})")
    series = [("RTN", ""), ("GPTQ", ""), ("GPTQ", "act-order"), ("MatGPTQ slice", ""), ("MatGPTQ slice", "act-order")]
    for method, opt in series:
        pts = sorted((r["bits"], r["ppl"], r["kl"]) for r in rows if r["method"] == method and r["options"] == opt)
        if pts:
            label = f"{method} {opt}".strip()
            ax.plot([p[0] for p in pts if p[0] >= 3], [p[1] for p in pts if p[0] >= 3], marker="o", label=label)
            ax_kl.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=label)
    ax.set_xlabel("bits per weight (codes)")
    ax.set_ylabel("perplexity (TinyStories, 40k tokens)")
    ax.set_title("perplexity, 3-8 bits")
    ax_kl.set_yscale("log")
    ax_kl.set_xlabel("bits per weight (codes)")
    ax_kl.set_ylabel("KL(fp32 || quantized) per token")
    ax_kl.set_title("KL to fp32, all widths")
    ax.legend(fontsize=8)
    fig.suptitle("stories260K: one MatGPTQ parent (R={3,4,8}) vs per-width GPTQ")
    save_figure(fig, path, dpi=120)


if __name__ == "__main__":
    main()
