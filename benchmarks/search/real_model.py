"""Mix'n'Match on SmolLM2-135M-Instruct: searched mixes against uniform slices and per-width GPTQ, scored as
`make real-model-table` scores every row (`make search-real-model`, after `make real-model-table`).

Protocol:
  parent      a MatGPTQ parent made as benchmarks/quality/real_model_table.py makes its Table-1 row (c = 8, R = {3,4,8}, g128
              symmetric, 64 × 512 tokens of the second half of WikiText-2 test, seed 0) with the current default
              variant (`matgptq quantize --method matgptq --bits 3,4,8`), in --work/parent; the search slices it at
              2..8 bits. `--parent matgptq2348` adds 2 to R (`--bits 2,3,4,8`): below 3 bits a mix holds 2-bit layers,
              which a {3,4,8} parent never optimised for
  search      `matgptq search` with its default settings (--seed 0), every budget in one process (the teacher and the
              sensitivities are shared), calibration text = the second half of WikiText-2 test (what the parent was
              calibrated on); a measured child process: wall, CPU and peak RSS
  scoring     real_model_table.evaluate: WikiText-2 perplexity and KL to fp32 on the first 32 × 2048 tokens of the
              first half, ARC-Easy and PIQA (first 300 questions) through lm-eval, float32, one load per model
  rows        the searched mix and the knapsack (DP) mix per budget; the parent's uniform 2/3/4/6/8-bit slices; fp32
              and per-width GPTQ 3/4/6/8 read from docs/results/real_model_table.json (`make real-model-table`: the same
              calibration and the same scoring); at --random-budgets (3.0), random search given the search's number of
              fitness evaluations (search/_setup.py's random_search: random budget-filling mixes through the same stages)
  curve       the searched parent after every 5th generation re-scored on 16 fixed windows from the end of the
              calibration text, not among the search's (fitness vs evaluations; the search's own record is on fresh
              windows each generation)

Runs: a parent's float rounding depends on the CPU (the same command gives another 3-bit slice, with another
perplexity, on an AMD EPYC than on an Intel Xeon), so every number of a run comes from one parent on one machine, and a
run that a session cannot finish is continued only where the parent re-quantizes to the same tensors. Each run keeps
its state in docs/results/search_real_model/run-NAME.json: every measurement, each budget's mix (widths and summary,
not the search history), the machine and the parent's tensor hash. A clean checkout re-quantizes the parent, checks
the hash (another hash: a one-line error saying to start a new --run) and searches and scores only what is missing;
work files live in runs/search-real-model/NAME (the search resumes there with --resume).
docs/results/search_real_model.{md,png} show every run, each against its own parent's uniform slices.

    python -m benchmarks.search.real_model [MODEL_DIR] [--run NAME] [--budgets 2.5,3.0,3.5]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks._harness import ROOT, child_env, cpu_name, measured_child, run_measured, write_atomic
from benchmarks._harness.smollm2 import DEFAULT_MODEL, WIKI, ZERO_SHOT, evaluate
from benchmarks.search._real_model_page import PARENTS, RUNS, TABLE_JSON, publish
from benchmarks.search._setup import random_search, search_fitness

# the one-shot allocations the record's searches ran (the search's default before baselines became opt-in)
BASELINES = ("--baselines", "uniform,error,gradient")


def parent_digest(parent: Path) -> str:
    """sha256 over the parent's tensors (names, dtypes, shapes, bytes): equal digests, equal slices."""
    import hashlib

    import torch
    from safetensors import safe_open

    h = hashlib.sha256()
    for file in sorted(parent.glob("*.safetensors")):
        with safe_open(file, "pt") as f:
            for name in sorted(f.keys()):
                t = f.get_tensor(name).contiguous()
                h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=str(DEFAULT_MODEL), help="the fp32 model directory (make real-model)")
    p.add_argument(
        "--budgets",
        default="3.0,2.5,3.5,4.0,2.25,2.75,3.25",
        help="code bits per weight, searched in this order (a killed run resumes where it stopped)",
    )
    p.add_argument("--threads", type=int, default=2, help="threads of every process")
    p.add_argument("--limit", type=int, default=300, help="questions per zero-shot task")
    p.add_argument(
        "--parent",
        default="matgptq348",
        choices=PARENTS,
        help="the parent's target widths R: {3,4,8} as the Table-1 row, or {2,3,4,8}",
    )
    p.add_argument(
        "--random-budgets",
        default="3.0",
        help="budgets that also get the random-search baseline (as many evaluations as the search made)",
    )
    p.add_argument(
        "--run", default="2", help="the run to continue or start (docs/results/search_real_model/run-RUN.json)"
    )
    p.add_argument("--work", help="mix files and measurements (default: runs/search-real-model/RUN)")
    p.add_argument("--render-only", action="store_true", help="only re-render the page and figure from the JSONs")
    p.add_argument("--no-render", action="store_true", help="measure only; leave the page and figure as they are")
    return p


def main() -> None:
    a = build_parser().parse_args()
    work = Path(a.work or ROOT / "runs" / "search-real-model" / a.run)
    work.mkdir(parents=True, exist_ok=True)
    state_file = RUNS / f"run-{a.run}.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {"search": {}, "eval": {}, "curve": {}}
    state.setdefault("quant", None)
    state.setdefault("mixes", {})
    state.setdefault("random", {})
    if state.setdefault("parent", a.parent) != a.parent:
        sys.exit(
            f"search_real_model: error: run {a.run} searches the {state['parent']} parent, not {a.parent}; start "
            f"a new run beside it with --run NAME"
        )
    state.setdefault("machine", cpu_name())

    def save() -> None:
        write_atomic(state_file, json.dumps(state, indent=1) + "\n")

    if not a.render_only:
        parent = ensure_parent(a, work, state, save)
        budgets = [b for b in a.budgets.split(",") if b]
        search_budgets(a, work, parent, budgets, state, save)
        measure(a, work, parent, budgets, state, save)
    if not a.no_render:
        publish()


def ensure_parent(a, work: Path, state: dict, save) -> Path:
    """work/parent: the Table-1 row's parent, quantized once with its own command and settings; refused when a
    run's recorded parent hashes differently (another machine rounds differently)."""
    parent = work / "parent"
    if not TABLE_JSON.is_file():
        sys.exit(f"search_real_model: error: no {TABLE_JSON}; run `make real-model-table` first")
    if not (parent / "matgptq.json").is_file():
        usage = quantize_parent(a, work, parent)
        if not usage["ok"]:
            sys.exit(f"search_real_model: error: quantizing the parent failed; see {work}/matgptq348.log")
        state["quant"] = usage
        save()
    digest = parent_digest(parent)
    if state.setdefault("parent_sha256", digest) != digest:
        sys.exit(
            f"search_real_model: error: {parent} is not the parent run {a.run} was measured on (its tensors "
            f"hash differently: another machine rounds differently); start a new run beside it with "
            f"--run NAME (make search-real-model RUN=NAME)"
        )
    save()
    return parent


def quantize_parent(a, work: Path, parent: Path) -> dict:
    """The Table-1 row's parent (benchmarks/quality/real_model_table.py's `matgptq348` row: its command and the
    settings real_model_table.json records), with the target widths of --parent, into `parent`; its usage."""
    s = json.loads(TABLE_JSON.read_text())["settings"]
    cmd = [
        sys.executable,
        "-m",
        "matgptq",
        "quantize",
        a.model,
        "--out",
        str(parent),
        "--method",
        "matgptq",
        "--bits",
        ",".join(map(str, PARENTS[a.parent])),
        "--group-size",
        str(s["group_size"]),
        "--overwrite",
        "--quiet",
        "--calib",
        str(WIKI),
        "--calib-range",
        "0.5:1",
        "--nsamples",
        str(s["nsamples"]),
        "--seqlen",
        str(s["seqlen"]),
        "--seed",
        str(s["seed"]),
    ]
    return measured_child(cmd, a.threads, work / "matgptq348.log")


def search_budgets(a, work: Path, parent: Path, budgets: list[str], state: dict, save) -> None:
    """`matgptq search` of every budget without a mix yet, in one measured process (shared teacher and
    sensitivities); each budget's mix goes into the run's JSON as soon as the search writes it."""

    def collect() -> None:
        for b in budgets:
            if b not in state["mixes"] and (work / f"mix-{b}.json").is_file():
                mix = json.loads((work / f"mix-{b}.json").read_text())
                state["mixes"][b] = {k: mix[k] for k in ("summary", "bits", "dp_bits", "start_bits", "search_bits")}
                save()

    collect()
    todo = [b for b in budgets if b not in state["mixes"]]
    if not todo:
        return
    cmd = [
        sys.executable,
        "-m",
        "matgptq",
        "search",
        str(parent),
        "--budget",
        ",".join(todo),
        "--calib",
        str(WIKI),
        "--calib-range",
        "0.5:1",
        "--kl-to",
        a.model,
        "--out",
        str(work),
        "--resume",
        "--quiet",
        *BASELINES,
    ]
    with ThreadPoolExecutor(1) as pool:
        search = pool.submit(run_measured, cmd, child_env(a.threads), work / f"search-{'_'.join(todo)}.log")
        while not search.done():
            time.sleep(10)
            collect()
        usage = search.result()
    if not usage["ok"]:
        sys.exit(f"search_real_model: error: the search failed; see {work}/search-*.log")
    state["search"][",".join(todo)] = usage
    collect()


def measure(a, work: Path, parent: Path, budgets: list[str], state: dict, save) -> None:
    """Score what the run lacks, in the order of --budgets: the uniform 2/3/4-bit slices the budgets' lines need,
    then per budget its evolved mix, its knapsack mix and (at --random-budgets) random search given the search's
    number of fitness evaluations, then the 6/8-bit slices."""
    randoms = [b for b in a.random_budgets.split(",") if b in budgets]
    for b in randoms:
        if b not in state["random"]:
            state["random"][b] = random_baseline(a, parent, b, state["mixes"][b]["summary"]["evaluations"])
            save()
    jobs = [(f"uniform-{r}", r) for r in (2, 3, 4)]
    for b in budgets:
        mix = state["mixes"][b]
        # evolved-{b}, not mix-{b}: that is the search's own mix file, whose "bits" are the lower-KL of the evolved
        # and the knapsack mix (runner._report) and whose history the curve needs
        rows = {"mix": ("evolved", mix.get("search_bits", mix["bits"])), "dp": ("dp", mix["dp_bits"])}
        if b in randoms:
            rows["random"] = ("random", state["random"][b]["bits"])
        for key, (name, bits) in rows.items():
            file = work / f"{name}-{b}.json"
            file.write_text(json.dumps({"bits": bits}))
            jobs.append((f"{key}-{b}", str(file)))
    jobs += [(f"uniform-{r}", r) for r in (6, 8)]

    def done(key: str, scores: dict) -> None:
        state["eval"][key] = scores
        save()

    for b in budgets:  # first: it needs the search's history, which only the work directory that searched holds
        if b not in state["curve"] and (work / f"mix-{b}.json").is_file():
            state["curve"][b] = curve(a, parent, work / f"mix-{b}.json")
            save()
    score_slices(a, parent, [(k, bits) for k, bits in jobs if k not in state["eval"]], done)


def random_baseline(a, parent: Path, budget: str, evaluations: int) -> dict:
    """search/_setup.py's random_search on the search's own calibration pool (the second half of WikiText-2 test)."""
    from fractions import Fraction

    import torch

    from matgptq.allocation import BudgetKind, EvoConfig
    from matgptq.models import load_tokenizer

    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    fit, cost = search_fitness(parent, Path(a.model), WIKI, (0.5, 1.0), load_tokenizer(a.model))
    limit = cost.limit(Fraction(budget), BudgetKind.CODE)
    mix = random_search(fit, cost.levels, cost.table(BudgetKind.CODE), limit, evaluations, EvoConfig(), seed=0)
    fit.teacher.close()
    return {
        "bits": dict(zip(cost.names, mix)),
        "code_bits": cost.average(mix, BudgetKind.CODE),
        "evaluations": fit.evaluations,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def score_slices(a, parent: Path, jobs: list[tuple[str, object]], done) -> None:
    """Score each (key, width or mix file) of `jobs` as real_model_table scores a row, one load each, then
    done(key, scores)."""
    import torch

    from matgptq.evaluation.perplexity import Teacher
    from matgptq.evaluation.tasks import resolve_tasks
    from matgptq.models import eval_windows, load_tokenizer, read_text, tokenize
    from matgptq.runtime import load

    if not jobs:
        return
    torch.set_num_threads(a.threads)
    tokenizer = load_tokenizer(a.model)
    windows = eval_windows(tokenize(tokenizer, read_text(WIKI, (0.0, 0.5))), 2048, 2048 * 32)
    specs = resolve_tasks("arc_easy,piqa", ZERO_SHOT)
    teacher = Teacher(load(a.model), windows, batch_size=1, progress=True)
    for key, bits in jobs:
        done(key, evaluate(parent, [bits], windows, teacher, specs, a.limit, tokenizer, parent=True)[str(bits)])
    teacher.close()


def curve(a, parent: Path, mix_file: Path, every: int = 5) -> list[dict]:
    """KL of the search's parent at its start and after generation every, 2·every, … on 16 fixed windows."""
    from matgptq.allocation.fitness import Fitness
    from matgptq.evaluation.teacher import Teacher
    from matgptq.models import eval_windows, load_tokenizer, read_text, tokenize
    from matgptq.runtime import load

    mix = json.loads(mix_file.read_text())
    names = tuple(mix["bits"])
    windows = eval_windows(tokenize(load_tokenizer(a.model), read_text(WIKI, (0.5, 1.0))), 256)[
        -16:
    ]  # the text's last windows
    points = [(0, 0, tuple(mix.get("start_bits", mix["dp_bits"])[n] for n in names))]
    points += [
        (h["generation"], h["evaluations"], tuple(h["parent"]))
        for h in mix["history"]
        if h["generation"] % every == 0 or h is mix["history"][-1]
    ]
    with Teacher(load(a.model), windows) as teacher:
        fitness = Fitness(load(parent, bits=8, packed=False), teacher, windows, names)
        all_w = tuple(range(windows.shape[0]))
        return [{"generation": g, "evaluations": e, "kl": fitness.kl(m, all_w)} for g, e, m in points]


if __name__ == "__main__":
    main()
