"""Mix'n'Match on stories260K: uniform slices vs the knapsack (DP) start vs the EvoPress-searched mix, per budget,
over several calibration seeds. Writes docs/results/search.{json,md,png} (page and figure rendered from the JSON
alone: `python -m benchmarks.render_docs` re-renders them).

Protocol (the reference protocol of ../shared/data/README.md): for each seed s, a MatGPTQ parent (c = 8,
R = {2,3,4,6,8}, symmetric, per-channel) is calibrated on 128 × 256 tokens drawn with seed s from the last 40% of
tinystories_val_head.txt; `matgptq search` (default settings, --seed s) searches 2.5, 3.0 and 3.5 code bits per weight
on the first 16,384 tokens of that same 40%; everything is scored on the first 40,000 tokens of the first 60% (held
out): perplexity and KL to the fp32 model. Per-width GPTQ 3/4/8 come from docs/results/stories260k_methods.json
(benchmarks/results.py, seed 0).
Also measures the fitness evaluations per second with and without the prefix cache (fitness.py).

    python -m benchmarks.search_results [--seeds 0,1] [--budgets 2.5,3.0,3.5]      # ~15 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

import matgptq
from matgptq.evaluation.perplexity import Teacher, score
from matgptq.execution import format_table
from matgptq.formats import read_checkpoint
from matgptq.models import eval_windows, load_tokenizer, read_text, tokenize
from matgptq.allocation import BudgetKind, CostModel, EvoConfig, SearchRequest, run_search
from matgptq.allocation.evopress import MAX_DRAWS_PER_CHILD, draw_windows, evolve
from matgptq.allocation.fitness import Fitness
from matgptq.allocation.mutation import random_mix
from matgptq.allocation import ScoreDtype
from matgptq.allocation.spread import score_all
from matgptq.allocation.sensitivity import knapsack_mix, measure
from benchmarks._harness import RESULTS, header, load_json, pyplot, save_figure, write_page

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MODEL = SHARED / "models" / "stories260K"
TEXT = SHARED / "data" / "tinystories" / "tinystories_val_head.txt"
UNIFORM = (2, 3, 4, 6, 8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--budgets", default="2.25,2.5,2.75,3.0,3.25,3.5,4.0")
    ap.add_argument("--out", default=str(RESULTS), help="output directory for search.{json,md,png}")
    ap.add_argument("--from-json", action="store_true", help="only re-render search.md/png from search.json")
    a = ap.parse_args()
    out = Path(a.out)
    if a.from_json:
        publish(load_json(out / "search.json"), out)
        return
    torch.set_num_threads(1)
    seeds = [int(s) for s in a.seeds.split(",")]
    budgets = tuple(a.budgets.split(","))
    tok = load_tokenizer(MODEL)
    held_out = eval_windows(tokenize(tok, read_text(TEXT, (0.0, 0.6))), 256, 40_000)
    teacher = Teacher(matgptq.load(MODEL), held_out, 32)
    rows, speed = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            parent = Path(tmp) / f"parent-{seed}"
            matgptq.quantize(MODEL, parent, calib=TEXT, calib_range=(0.6, 1.0), method="matgptq", bits=UNIFORM,
                             nsamples=128, seqlen=256, seed=seed, progress=False)  # fmt: skip
            model = matgptq.load(parent, bits=8)
            for r in UNIFORM:
                matgptq.set_bits(model, r)
                s = score(model, held_out, teacher, 32)
                rows.append({"seed": seed, "kind": "uniform", "bits": r, "ppl": s.ppl, "kl": s.kl})
            t0 = time.perf_counter()
            req = SearchRequest(parent=parent, budgets=budgets, calib=TEXT, out=Path(tmp) / f"mix-{seed}",
                                calib_range=(0.6, 1.0), evo=EvoConfig(seed=seed), text=TEXT, text_range=(0.0, 0.6),
                                text_tokens=40_000, progress=False)  # fmt: skip
            results = run_search(req)
            fit, cost = search_fitness(parent, MODEL, TEXT, (0.6, 1.0), tok)
            for r in results:
                rows.append({"seed": seed, "kind": "dp", "budget": r["budget"], "bits": float(r["budget"]),
                             "ppl": r["dp_text_ppl"], "kl": r["dp_text_kl"], "calib_kl": r["dp_kl"]})  # fmt: skip
                rows.append({"seed": seed, "kind": "searched", "budget": r["budget"], "bits": r["search_code_bits"],
                             "storage_bits": r["search_storage_bits"], "ppl": r["search_text_ppl"],
                             "kl": r["search_text_kl"], "calib_kl": r["search_kl"], "evaluations": r["evaluations"],
                             "seconds": r["seconds"],
                             "history": json.loads((req.out / f"mix-{r['budget']}.json").read_text())["history"]})  # fmt: skip
                rows.append({"seed": seed, "kind": "written", "budget": r["budget"], "bits": r["code_bits"],
                             "storage_bits": r["storage_bits"], "ppl": r["text_ppl"], "kl": r["text_kl"],
                             "calib_kl": r["kl"], "chosen": r["chosen"]})  # fmt: skip
                budget = Fraction(r["budget"])
                mix = random_search(fit, cost.levels, cost.table(BudgetKind.CODE), cost.limit(budget, BudgetKind.CODE),
                                    r["evaluations"], req.evo, seed)  # fmt: skip
                rows.append({"seed": seed, "kind": "random", "budget": r["budget"], "bits": cost.average(mix, BudgetKind.CODE),
                             "evaluations": r["evaluations"], **held_out_and_calib(fit, mix, held_out, teacher)})  # fmt: skip
            fit.teacher.close()
            print(f"seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
            if speed is None:
                speed = cache_speed(parent, tok, Path(tmp))
    gptq = {r["bits"]: r for r in load_json(RESULTS / "stories260k_methods.json")["rows"]
            if r["method"] == "GPTQ" and r["options"] == "" and r["bits"] in (3, 4, 8)}  # fmt: skip
    data = {"rows": rows, "gptq": gptq, "cache_speed": speed, "seeds": seeds,
            "threads": torch.get_num_threads()}  # fmt: skip
    (out / "search.json").write_text(json.dumps(data, indent=1))
    publish(data, out)


def search_fitness(parent: Path, model: Path, calib: Path, calib_range: tuple[float, float], tok) -> tuple[Fitness, CostModel]:
    """`matgptq search`'s default fitness for `parent`: its 16,384-token calibration pool (the first 65 windows of 256 of
    the calibration range, runner._windows), levels 2..8, candidates in the precision --score-dtype auto picks."""
    windows = tokenize(tok, read_text(calib, calib_range))[: 65 * 256].view(65, 256)
    cost = CostModel.from_checkpoint(read_checkpoint(parent), tuple(range(2, 9)))
    dtype = ScoreDtype.AUTO.resolve(torch.device("cpu"))
    return Fitness(matgptq.load(parent, bits=8, packed=False), Teacher(matgptq.load(model), windows, 8), windows,
                   cost.names, compute_dtype=dtype), cost  # fmt: skip


def held_out_and_calib(fit: Fitness, mix, held_out, teacher) -> dict:
    """A mix's held-out perplexity and KL, and its float32 KL on the whole calibration pool (the `calib KL` column)."""
    with fit.exact():
        calib_kl = fit.kl(mix, tuple(range(fit.windows.shape[0])))
    fit.apply(mix)
    s = score(fit.model, held_out, teacher, 32)
    return {"ppl": s.ppl, "kl": s.kl, "calib_kl": calib_kl}


def cache_speed(parent: Path, tok, tmp: Path, generations: int = 4) -> dict:
    """Fitness evaluations per second of the default search at 3.0 bits, with and without the prefix cache."""
    calib = eval_windows(tokenize(tok, read_text(TEXT, (0.6, 1.0))), 256)[:65]
    levels = tuple(range(2, 9))
    teacher = Teacher(matgptq.load(MODEL), calib, 8)
    cost = CostModel.from_checkpoint(read_checkpoint(parent), levels)
    result = {}
    for cached in (False, True):
        f = Fitness(matgptq.load(parent, bits=8), teacher, calib, cost.names)
        start = knapsack_mix(cost, measure(f, levels, tuple(range(17))), Fraction(3), BudgetKind.CODE)
        f.evaluations = f.tokens = 0
        t0 = time.perf_counter()
        st = evolve(f, levels, cost.table(BudgetKind.CODE), cost.limit(Fraction(3), BudgetKind.CODE), start,
                    EvoConfig(generations=generations, prefix_cache=cached), tmp / f"speed-{cached}.json", {})  # fmt: skip
        seconds = time.perf_counter() - t0
        result["cached" if cached else "full"] = {"evaluations": st.evaluations, "seconds": seconds,
                                                  "per_second": st.evaluations / seconds}  # fmt: skip
    teacher.close()
    return result


def random_search(fitness: Fitness, levels: tuple[int, ...], costs: list[list[int]], limit: int, evaluations: int,
                  config: EvoConfig, seed: int) -> tuple[int, ...]:  # fmt: skip
    """The baseline the search must beat at equal fitness evaluations: one generation of distinct random
    budget-filling mixes (mutation.random_mix: all layers at the lowest level, then random one-level raises while one
    fits) through the search's own multi-stage selection (config.stages, windows drawn as evolve draws them), so the
    random candidates are scored on the same token counts as EvoPress' children; `evaluations` scorings in all."""
    rng = np.random.Generator(np.random.PCG64(seed))
    n = evaluations - sum(s.survivors for s in config.stages[:-1])  # the later stages score the earlier survivors
    if n < config.stages[0].survivors:
        raise ValueError(f"random_search: {evaluations} scorings cannot fill the stages {config.stages}")
    pool: dict[tuple[int, ...], None] = {}
    for _ in range(n * MAX_DRAWS_PER_CHILD):
        if len(pool) == n:
            break
        pool[tuple(levels[i] for i in random_mix(costs, limit, rng))] = None
    survivors = list(pool)
    n_windows, seqlen = fitness.windows.shape
    for stage in config.stages:
        scores = score_all(fitness, survivors, draw_windows(rng, n_windows, seqlen, stage.tokens))
        survivors = [survivors[i] for i in sorted(range(len(survivors)), key=lambda i: (scores[i], i))[: stage.survivors]]
    return survivors[0]


def _mean_sd(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.4f} ± {statistics.stdev(xs):.4f}" if len(xs) > 1 else f"{xs[0]:.4f}"


def uniform_line(uniform: dict[int, float], bits: float) -> float:
    """The straight line between the neighbouring uniform slices at `bits`."""
    lo = max(r for r in uniform if r <= bits)
    hi = min(r for r in uniform if r >= bits)
    return uniform[lo] if lo == hi else uniform[lo] + (bits - lo) / (hi - lo) * (uniform[hi] - uniform[lo])


def publish(data: dict, out: Path) -> None:
    """The page and the figure of `data` (the JSON) into `out`."""
    text = page(data)
    write_page(out / "search.md", text)
    print(text)
    plot_page(data, out / "search.png")


def page(data: dict) -> str:
    """docs/results/search.md from its JSON."""
    rows, seeds = data["rows"], data["seeds"]
    table = []
    for r in UNIFORM:
        sel = [x for x in rows if x["kind"] == "uniform" and x["bits"] == r]
        table.append([f"uniform {r}-bit slice", r, "", _mean_sd([x["ppl"] for x in sel]), _mean_sd([x["kl"] for x in sel]), ""])
    budgets = sorted({x["budget"] for x in rows if "budget" in x}, key=float)
    wins = []
    for b in budgets:
        for kind, label in (("dp", "knapsack (DP) start"), ("random", "random search (same evaluations)"),
                            ("searched", "EvoPress mix"), ("written", "written (lower calib KL)")):  # fmt: skip
            sel = [x for x in rows if x["kind"] == kind and x["budget"] == b]
            if not sel:  # search.json from before the command chose its output
                continue
            bits = _mean_sd([x["bits"] for x in sel]) if kind != "dp" else b
            storage = _mean_sd([x["storage_bits"] for x in sel]) if kind not in ("dp", "random") else ""
            table.append([f"{label} @ {b}", bits, storage, _mean_sd([x["ppl"] for x in sel]),
                          _mean_sd([x["kl"] for x in sel]), _mean_sd([x["calib_kl"] for x in sel])])  # fmt: skip
        for seed in seeds:
            uni = {x["bits"]: x["ppl"] for x in rows if x["kind"] == "uniform" and x["seed"] == seed}
            mix = next(x for x in rows if x["kind"] == "searched" and x["budget"] == b and x["seed"] == seed)
            dp = next(x for x in rows if x["kind"] == "dp" and x["budget"] == b and x["seed"] == seed)
            out_ = next((x for x in rows if x["kind"] == "written" and x["budget"] == b and x["seed"] == seed), {})
            rnd = next((x for x in rows if x["kind"] == "random" and x["budget"] == b and x["seed"] == seed), None)
            yes = lambda better: "yes" if better else "NO"  # noqa: E731
            wins.append([b, seed, round(mix["bits"], 4), mix["ppl"], dp["ppl"], rnd["ppl"] if rnd else "",
                         uniform_line(uni, mix["bits"]), yes(mix["ppl"] < uniform_line(uni, mix["bits"])),
                         yes(mix["ppl"] < dp["ppl"]), yes(mix["ppl"] < rnd["ppl"]) if rnd else "",
                         out_.get("chosen", ""), mix["evaluations"], mix["seconds"]])  # fmt: skip
    md = [header("benchmarks/search_results.py", "search.json"), "# Mix'n'Match search on stories260K", "", "Mean ± sample "
          f"standard deviation over calibration seeds {seeds} (parent calibration and search seed). Held-out: first "
          "40,000 tokens of the first 60% of TinyStories; perplexity and KL to fp32 there; `calib KL` is the search's "
          "own fitness on its whole 16,384-token calibration pool, float32. `matgptq search` writes the lower-`calib KL` "
          "of the knapsack start and the EvoPress mix (`written`; which one per seed: `written` below).", ""]
    md += [format_table(["model", "code bits", "storage bits", "ppl (held-out)", "KL (held-out)", "calib KL"], table), ""]
    for bits, g in sorted(data.get("gptq", {}).items(), key=lambda kv: int(kv[0])):
        md += [f"Per-width GPTQ {bits}-bit ([stories260k_methods.json](stories260k_methods.json), seed 0): ppl "
               f"{g['ppl']:.4f}, KL {g['kl']:.4f}.", ""]  # fmt: skip
    md += ["Per seed: the searched mix against the straight line between its neighbouring uniform slices and against "
           "its knapsack start and random search (perplexity, held-out):", "",
           format_table(["budget", "seed", "code bits", "mix ppl", "DP ppl", "random ppl", "uniform line",
                         "beats line", "beats DP", "beats random", "written", "evaluations", "seconds"], wins), "",
           "Random search: as many fitness evaluations as the search made, spent on one generation of distinct random "
           "budget-filling mixes (all layers at 2 bits, then random one-level raises while one fits) put through the "
           "search's own stages (512:4, 2048:2, 4096:1 tokens: the candidates are scored on the token counts EvoPress' "
           "children get); its winner is scored like the others.", ""]  # fmt: skip
    sp = data.get("cache_speed")
    if sp:
        md += ["Prefix cache (fitness.py), default search at 3.0 bits, 4 generations, same evaluations either way:", "",
               format_table(["forward", "evaluations", "seconds", "evaluations / s"],
                            [[k, v["evaluations"], round(v["seconds"], 2), round(v["per_second"], 2)]
                             for k, v in sp.items()]), ""]  # fmt: skip
    return "\n".join(md)


def plot_page(data: dict, path: Path) -> None:
    """docs/results/search.png from its JSON: perplexity and KL against code bits per seed, and each search's curve."""
    plt = pyplot()
    rows = data["rows"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key in zip(axes[:2], ("ppl", "kl")):
        for seed in data["seeds"]:
            uni = sorted((x["bits"], x[key]) for x in rows if x["kind"] == "uniform" and x["seed"] == seed)
            ax.plot(*zip(*uni), "o-", color="gray", alpha=0.6, label="uniform slices" if seed == data["seeds"][0] else None)
            for kind, marker, color in (("random", "x", "tab:purple"), ("dp", "s", "tab:blue"), ("searched", "*", "tab:red")):
                pts = sorted((x["bits"], x[key]) for x in rows if x["kind"] == kind and x["seed"] == seed)
                if not pts:  # search.json from before the random-search rows
                    continue
                ax.plot(*zip(*pts), marker, color=color, ms=9 if kind == "searched" else 6,
                        label={"dp": "knapsack start", "searched": "EvoPress mix", "random": "random search"}[kind]
                        if seed == data["seeds"][0] else None)  # fmt: skip
        gptq = sorted((int(b), g[key]) for b, g in data.get("gptq", {}).items())
        if gptq:
            ax.plot(*zip(*gptq), "D", color="tab:green", label="per-width GPTQ (seed 0)")
        ax.set_xlabel("code bits per weight")
        ax.set_ylabel({"ppl": "perplexity (held-out)", "kl": "KL to fp32 (held-out)"}[key])
        ax.set_yscale("log")
        ax.set_xlim(1.9, 8.2)
        ax.legend()
    ax = axes[2]
    for x in rows:
        if x["kind"] == "searched":
            h = x["history"]
            ax.plot([e["evaluations"] for e in h], [e["kl"] for e in h], label=f"{x['budget']} bits, seed {x['seed']}")
    ax.set_xlabel("fitness evaluations")
    ax.set_ylabel("winner's last-stage KL (calibration)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    save_figure(fig, path)


if __name__ == "__main__":
    main()
