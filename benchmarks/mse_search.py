#!/usr/bin/env python
"""The MSE scale search, coarse to fine, against scoring the whole shrink grid (quantization/grid.py).

The default GPTQ picks each group's scale by the MSE search: E(p) = Σ_j d_j·|ŵ_j − w_j|^2.4 over shrinks p of the
group's range, d_j = the input's mean square (diag H). The search scores 30 of IST-DASLab's 80 grid points (every 4th,
then ±2 steps around the best two); this script measures what that costs in E and saves in time, on a real model's
weights and column weights, against the same code told to score all 80 (grid.FULL_GRID:
the first minimiser over the whole grid, as the search was before).

Protocol
  model     SmolLM2-135M-Instruct (`make real-model`), every --every-th decoder layer, its seven linear layers
  d_j       mean square of each linear's input over 8 x 256 WikiText-2 tokens (the second half of wiki.test)
  weights   the float weights as loaded (GPTQ searches on weights its updates have moved; these are the start)
  per row   E of the fast pick / E of the full grid's pick (≥ 1: the full grid's is the minimiser)
  reported  Σ E fast / Σ E full, the rows whose pick differs, the worst row's ratio, and the seconds of each search
            (2 threads, the same tensors, one after the other)

Writes docs/results/mse_search.{json,md}; `python -m benchmarks.render_docs` re-renders the page from the JSON.

    python -m benchmarks.mse_search [MODEL] [--every 3]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks._harness import RESULTS, header, load_json, machine, write_results
from benchmarks._search_setup import MODEL, TEXT
from matgptq.execution.tables import format_table
from matgptq.quantization import grid

STEM = "mse_search"
# (bits, group size, symmetric): the default grid at 3 and 4 bits, g128 and per channel, and the asymmetric one
CASES = ((3, 128, True), (4, 128, True), (3, -1, True), (4, -1, True), (4, 128, False))


def column_weights(model_dir: Path, layers: list[int]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Each linear of `layers`: its weight and its input's mean square per column, over 8 x 256 calibration tokens."""
    from matgptq.models.hf import load_fp_model, load_tokenizer
    from matgptq.models.text import calibration_windows, read_text, tokenize

    model = load_fp_model(model_dir)
    ids = calibration_windows(tokenize(load_tokenizer(model_dir), read_text(TEXT, (0.5, 1.0))), 8, 256, 0)
    sums: dict[str, torch.Tensor] = {}
    weights: dict[str, torch.Tensor] = {}

    def hook(name):
        def add(_, inputs, __):
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).float()
            sums[name] = sums.get(name, 0) + (x * x).mean(0) / len(ids)

        return add

    handles = []
    for name, module in model.named_modules():
        parts = name.split(".")
        if isinstance(module, torch.nn.Linear) and "layers" in parts and \
                int(parts[parts.index("layers") + 1]) in layers:  # fmt: skip
            handles.append(module.register_forward_hook(hook(name)))
            weights[name] = module.weight.detach().float()
    with torch.no_grad():
        for window in ids:
            model(window[None])
    for h in handles:
        h.remove()
    return weights, sums


def search(w: torch.Tensor, d: torch.Tensor, bits: int, sym: bool, full: bool) -> tuple[torch.Tensor, float]:
    """(E per row of the pick, seconds) of find_params on w [rows, n], the whole grid scored if `full`."""
    rounding = grid.NearestRounding(bits)
    t = time.perf_counter()
    scale, zero = grid.find_params(w, rounding, sym, True, col_weights=d, search=grid.FULL_GRID if full else
                                   grid.MSE_SEARCH)  # fmt: skip
    seconds = time.perf_counter() - t
    z = float(1 << (bits - 1)) if sym else zero.unsqueeze(-1)
    return rounding.search_loss(w, scale.unsqueeze(-1), z, grid.MSE_NORM) @ d, seconds


def measure(model_dir: Path, every: int) -> dict:
    import json

    torch.set_num_threads(2)
    n_layers = json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]
    weights, sums = column_weights(model_dir, list(range(0, n_layers, every)))
    rows = []
    for bits, group, sym in CASES:
        fast_e, full_e, secs = [], [], {True: 0.0, False: 0.0}
        for name, weight in weights.items():
            g = weight.shape[1] if group == -1 else group
            for a in range(0, weight.shape[1], g):
                w, d = weight[:, a : a + g], sums[name][a : a + g]
                for full, out in ((True, full_e), (False, fast_e)):
                    e, s = search(w, d, bits, sym, full)
                    out.append(e)
                    secs[full] += s
        fast, full = torch.cat(fast_e).double(), torch.cat(full_e).double()
        rows.append({"bits": bits, "group_size": group, "sym": sym, "rows": len(fast),
                     "sum_ratio": float(fast.sum() / full.sum()), "rows_differing": int((fast > full).sum()),
                     "worst_row_ratio": float((fast / full.clamp_min(1e-30)).max()),
                     "seconds_full": secs[True], "seconds_fast": secs[False]})  # fmt: skip
        print(f"{bits}-bit g{group} {'sym' if sym else 'asym'}: E x{rows[-1]['sum_ratio']:.6f}, "
              f"{rows[-1]['rows_differing']}/{len(fast)} rows differ, time x{secs[False] / secs[True]:.2f}")
    return {"protocol": __doc__, "model": str(model_dir), "layers_every": every, "layers": len(weights) // 7,
            "machine": machine(), "rows": rows}  # fmt: skip


def page(data: dict) -> str:
    table = [[r["bits"], r["group_size"], "yes" if r["sym"] else "no", r["rows"], f"{r['sum_ratio']:.6f}",
              f"{r['rows_differing']} ({r['rows_differing'] / r['rows']:.2%})", f"{r['worst_row_ratio']:.3f}",
              f"{r['seconds_full']:.1f}", f"{r['seconds_fast']:.1f}", f"{r['seconds_fast'] / r['seconds_full']:.2f}"]
             for r in data["rows"]]  # fmt: skip
    m = data["machine"]
    return "\n".join([
        header("benchmarks/mse_search.py", f"{STEM}.json"), "",
        "# The MSE scale search: 30 grid points, coarse to fine, against all 80", "",
        f"{Path(data['model']).name}: decoder layers 0, {data['layers_every']}, {2 * data['layers_every']}, … "
        f"({data['layers']} layers, seven linear layers each), the float weights, column weights d_j = the input's "
        f"mean square over 8 x 256 WikiText-2 tokens. Measured on {m['cpu']} ({m['cores']} cores, 2 threads) at commit {m['commit']}.", "",
        format_table(["bits", "group", "sym", "rows", "Σ E fast / Σ E full", "rows differing",
                      "worst row E ratio", "full s", "fast s", "fast / full time"], table), "",
        "E = Σ_j d_j·|ŵ_j − w_j|^2.4 of each row's (group's) pick; the full grid's pick is its minimiser, so the "
        "ratios are ≥ 1. The search is `grid.find_params`; the full grid is the same code with search=grid.FULL_GRID "
        "(every point scored, the first minimiser kept).",
    ])  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=str(MODEL), help="the fp32 model directory (make real-model)")
    ap.add_argument("--every", type=int, default=3, help="measure every EVERY-th decoder layer (default 3)")
    ap.add_argument("--from-json", action="store_true", help=f"only re-render {STEM}.md from {STEM}.json")
    args = ap.parse_args()
    md = RESULTS / f"{STEM}.md"
    if not args.from_json and not (Path(args.model) / "config.json").is_file():
        raise SystemExit(f"{args.model} is not a model directory: run `make real-model` first, or pass one")
    data = load_json(md.with_suffix(".json")) if args.from_json else measure(Path(args.model), args.every)
    write_results(md, data, page(data))


if __name__ == "__main__":
    main()
