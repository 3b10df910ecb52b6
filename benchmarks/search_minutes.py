"""The search in minutes (issue #44 item 3): all eight budgets of SmolLM2-135M-Instruct under `--time-limit`, timed,
and every mix it writes or could have written scored on held-out text.

Protocol:
  parent    `matgptq quantize --method matgptq --bits 3,4,8 --group-size 128` (c = 8), 64 × 512 tokens of the second
            half of WikiText-2 test, seed 0, as search_real_model.py makes it; made once in --work and reused
  search    per seed s, one measured child process (wall, CPU, peak RSS):
              matgptq search PARENT --budget 2.5,2.75,3.0,3.25,3.5,4.0,5.0,6.0 --time-limit MINUTES --seed s
                --calib wiki.test --calib-range (0.5 + 0.15·s):1 {RECIPE}
            i.e. the calibration pool and the sensitivity windows start at another place of the text for each seed,
            and the search's own draws (windows, mutations) follow --seed s
  scoring   each budget's mixes on the first 4 × 1024 tokens of the first half of WikiText-2 test (never calibrated
            on): KL to the float32 model and perplexity, float32:
              uniform    the widest uniform slice within the budget
              knapsack   the probe table's knapsack mix (one probe per layer, the search's default start)
              error      llama.cpp's --target-bpw idea: imatrix-weighted weight error, knapsack (a default baseline)
              gradient   first order at the uniform slice under the budget, the knapsack above it (one backward
                         pass per floor width, block by block; allocation/gradient.py; a default baseline)
              evolved    where the generations the time allowed ended
              written    what the mix file says to use: the lowest calibration KL among the above
            The other one-shot allocators (additive KL, noise injection, random search) are compared on stories260K in
            search_baselines.md; they are not in this run's 10 minutes.

    python -m benchmarks.search_minutes [--seeds 0,1,2] [--minutes 10] [--work runs/search-minutes]
        [--out docs/results/search_minutes.json] [--from-json]      # ~15 minutes a seed on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from fractions import Fraction
from pathlib import Path

import torch

import matgptq
from benchmarks._harness import RESULTS, ROOT, header, load_json, measured_child, write_page, write_results
from benchmarks.search_baselines import verdict
from matgptq.allocation import BudgetKind, CostModel
from matgptq.allocation.allocators import uniform_mix
from matgptq.evaluation.perplexity import score
from matgptq.evaluation.teacher import Teacher
from matgptq.execution import format_table
from matgptq.formats import read_checkpoint
from matgptq.models import eval_windows, load_tokenizer, read_text, tokenize

MODEL = Path.home() / ".cache" / "matgptq" / "SmolLM2-135M-Instruct"  # `make real-model`
TEXT = ROOT.parent / "shared" / "data" / "wikitext-2-raw" / "wiki.test.joined.txt"
BUDGETS = ("2.5", "2.75", "3.0", "3.25", "3.5", "4.0", "5.0", "6.0")
RECIPE = ("--sensitivity-tokens", "510", "--calib-tokens", "2040", "--stages", "255:2,510:1", "--offspring", "8",
          "--generations", "100")  # fmt: skip
KINDS = ("uniform", "knapsack", "error", "gradient", "evolved", "written")
ONE_SHOT = ("uniform", "knapsack", "error", "gradient")  # the allocations the written mix is held against
HELD_OUT = (4, 1024)  # windows × tokens from the start of the first half


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2", help="search seeds (each also moves the calibration text)")
    ap.add_argument("--minutes", type=float, default=10.0, help="--time-limit of each search")
    ap.add_argument("--work", default=str(ROOT / "runs" / "search-minutes"), help="the parent and the mix files")
    ap.add_argument("--out", default=str(RESULTS / "search_minutes.json"), help="the JSON; its page goes beside it")
    ap.add_argument("--from-json", action="store_true", help="only re-render the page from --out")
    return ap


def main() -> None:
    a = build_parser().parse_args()
    out = Path(a.out)
    if not a.from_json:
        if not MODEL.is_dir():
            raise SystemExit(f"{MODEL} is missing: run `make real-model` first")
        work = Path(a.work)
        parent = make_parent(work)
        data = load_json(out) if out.is_file() else {}
        if data.get("recipe") != list(RECIPE):  # seeds of another recipe are not averaged with these
            data = {"protocol": __doc__, "recipe": list(RECIPE), "seeds": {}}
        for seed in (int(s) for s in a.seeds.split(",")):
            data["seeds"][str(seed)] = measure_seed(parent, work, seed, a.minutes)
            write_results(out.with_suffix(".md"), data, page(data))  # after every seed: a stopped run keeps the rest
    text = page(load_json(out))
    write_page(out.with_suffix(".md"), text)
    print(text)


def make_parent(work: Path) -> Path:
    parent = work / "parent"
    if not (parent / "matgptq.json").is_file():
        matgptq.quantize(MODEL, parent, calib=TEXT, calib_range=(0.5, 1.0), method="matgptq", bits=(3, 4, 8),
                         group_size=128, nsamples=64, seqlen=512, seed=0, overwrite=True)  # fmt: skip
    return parent


def measure_seed(parent: Path, work: Path, seed: int, minutes: float) -> dict:
    """One timed search of all budgets, then every budget's mixes scored on the held-out text."""
    mixes = work / f"seed-{seed}"
    cmd = [sys.executable, "-m", "matgptq", "search", str(parent), "--budget", ",".join(BUDGETS), "--calib", str(TEXT),
           "--calib-range", f"{0.5 + 0.15 * seed:g}:1", "--time-limit", f"{minutes:g}", "--seed", str(seed),
           "--out", str(mixes), "--quiet", "--overwrite", *RECIPE]  # fmt: skip
    usage = measured_child(cmd, torch.get_num_threads(), work / f"seed-{seed}.log")
    if not usage["ok"]:
        raise SystemExit(f"the search of seed {seed} failed: {usage['error']}")
    return {"usage": usage, "budgets": score_mixes(parent, mixes)}


@torch.no_grad()
def score_mixes(parent: Path, mixes: Path) -> dict:
    tok = load_tokenizer(MODEL)
    n, seqlen = HELD_OUT
    windows = eval_windows(tokenize(tok, read_text(TEXT, (0.0, 0.5))), seqlen, n * seqlen)
    teacher = Teacher(matgptq.load(MODEL), windows)
    cost = CostModel.from_checkpoint(read_checkpoint(parent), tuple(range(2, 9)))
    model = matgptq.load(parent, bits=8, packed=False)
    result = {}
    try:
        for budget in BUDGETS:
            body = json.loads((mixes / f"mix-{budget}.json").read_text())
            named = {"uniform": dict(zip(cost.names, uniform_mix(cost, Fraction(budget), BudgetKind.CODE))),
                     "knapsack": body["dp_bits"], **{k: body["baseline_bits"][k] for k in ("error", "gradient")},
                     "evolved": body["search_bits"], "written": body["bits"]}  # fmt: skip
            scores = {}
            for kind, widths in named.items():
                matgptq.set_bits(model, widths)
                s = score(model, windows, teacher)
                scores[kind] = {"kl": s.kl, "ppl": s.ppl, "bits": cost.average(tuple(widths[k] for k in cost.names),
                                                                              BudgetKind.CODE)}  # fmt: skip
            summary = body["summary"]
            result[budget] = {"scores": scores, "chosen": summary["chosen"], "generations": summary["generations"],
                              **{k: summary[k] for k in ("seconds", "teacher_seconds", "tables_seconds",
                                                         "search_seconds")}}  # fmt: skip
            print(f"{mixes.name} {budget}: " + ", ".join(f"{k} {v['kl']:.4f}" for k, v in scores.items()), flush=True)
    finally:
        teacher.close()
    return result


def _stats(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.4f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.4f}"


def page(data: dict) -> str:
    """docs/results/search_minutes.md from its JSON."""
    seeds = sorted(data["seeds"], key=int)
    runs = [data["seeds"][s] for s in seeds]
    quality, timing = [], []
    kinds = [k for k in KINDS if all(k in r["budgets"][b]["scores"] for r in runs for b in BUDGETS)]
    for b in BUDGETS:
        kl = {k: [r["budgets"][b]["scores"][k]["kl"] for r in runs] for k in kinds}
        best = min((k for k in ONE_SHOT if k in kl), key=lambda k: statistics.mean(kl[k]))
        quality.append([b, *(_stats(kl[k]) for k in kinds), best, verdict(kl["written"], kl[best]),
                        ", ".join(r["budgets"][b]["chosen"] for r in runs)])  # fmt: skip
        timing.append([b, *(f"{statistics.mean(r['budgets'][b][k] for r in runs):.1f}"
                            for k in ("teacher_seconds", "tables_seconds", "search_seconds", "seconds")),
                       "/".join(str(r["budgets"][b]["generations"]) for r in runs)])  # fmt: skip
    usage = [[s, f"{r['usage']['wall']:.0f}", f"{r['usage']['cpu']:.0f}", f"{r['usage']['rss_gb']:.2f}",
              f"{r['usage']['load_average']:.1f}"] for s, r in zip(seeds, runs)]  # fmt: skip
    return "\n".join([
        header("benchmarks/search_minutes.py", "search_minutes.json"), "# All eight budgets in minutes",
        "", "```", data["protocol"].strip().replace("{RECIPE}", " ".join(data["recipe"])), "```", "",
        f"Seeds {', '.join(seeds)}; each cell: mean ± sample standard deviation over the seeds.", "",
        "The whole search, per seed (a measured child process; load: the 1-minute load average when it ended):", "",
        format_table(["seed", "wall s", "CPU s", "peak RSS GB", "load"], usage), "",
        "Held-out KL to the float32 model per budget; `written vs best`: against the best one-shot allocation "
        f"({', '.join(k for k in ONE_SHOT if k in kinds)}), a tie within the larger spread:", "",
        format_table(["budget", *kinds, "best baseline", "written vs best", "chosen per seed"], quality), "",
        "Where each budget's seconds went (means; the first budget carries the shared teacher and tables):", "",
        format_table(["budget", "teacher s", "tables s", "search s", "budget s", "generations per seed"], timing),
    ])  # fmt: skip


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
