"""What the SmolLM2 search benchmarks share (ten_minutes.py; random_search and search_fitness also real_model.py):
one MatGPTQ parent of SmolLM2-135M-Instruct, each seed's calibration range of WikiText-2 test, one measured `matgptq
search` child per run, random search at the search's number of scorings, the scoring of named mixes on held-out text
(the first 4 × 1024 tokens of the first half, never calibrated on), and the verdict of a written mix against the best
one-shot allocation. The package is imported inside the measuring functions only, so that rendering a page
(render_docs) needs none of it.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

from benchmarks._harness import RESULTS, ROOT, load_json, measured_child, write_page, write_results
from benchmarks._harness.smollm2 import DEFAULT_MODEL as MODEL
from benchmarks._harness.smollm2 import WIKI as TEXT

BUDGETS = ("2.5", "2.75", "3.0", "3.25", "3.5", "4.0", "5.0", "6.0")
HELD_OUT = (4, 1024)  # windows × tokens from the start of the first half
LEVELS = tuple(range(2, 9))
RANDOM_STAGES = "255:2,510:1"  # the 10-minute recipe's --stages, through which random search's candidates go


def start(work: Path, out: Path, recipe: tuple[str, ...], protocol: str) -> tuple[Path, dict]:
    """The parent (made once in `work`) and the results at `out` of `recipe`: a fresh record where they were made
    with another (seeds of another recipe are not averaged with these); the protocol is the script's docstring now
    (the recipe is the same; the docstring may describe parts added since)."""
    if not MODEL.is_dir():
        raise SystemExit(f"{MODEL} is missing: run `make real-model` first")
    parent = make_parent(work)
    data = load_json(out) if out.is_file() else {}
    if data.get("recipe") != list(recipe):
        data = {"recipe": list(recipe), "seeds": {}}
    data["protocol"] = protocol
    return parent, data


def comma_list(kind):
    """An argparse type: comma-separated values of `kind` (argparse names the option and exits 2 otherwise)."""

    def parse(text: str) -> list:
        return [kind(x) for x in text.split(",") if x]

    parse.__name__ = f"comma-separated {kind.__name__} list"
    return parse


def seed_parser(doc: str, out: str) -> argparse.ArgumentParser:
    """The options every seeded search benchmark takes (record_seeds reads them); `out`: its JSON's name."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--seeds", type=comma_list(int), default="0,1,2", help="search seeds (each also moves the calibration text)"
    )
    ap.add_argument("--work", default=str(ROOT / "runs" / "search-minutes"), help="the parent and the mix files")
    ap.add_argument("--out", default=str(RESULTS / out), help="the JSON; its page beside it")
    ap.add_argument("--from-json", action="store_true", help="only re-render the page from --out")
    return ap


def split_options(ap: argparse.ArgumentParser, text: str, option: str = "--search-options") -> tuple[str, ...]:
    """`text` split as a shell splits it; an unclosed quote is argparse's one-line error naming `option`."""
    try:
        return tuple(shlex.split(text))
    except ValueError as e:
        ap.error(f"{option}: {e}")


def folder_suffix(parts) -> str:
    """A variant's mix-folder suffix: "-" and its options joined, each run of other characters than word characters and
    dots one "-" ("" for none)."""
    return re.sub(r"[^\w.]+", "-", "-" + "-".join(map(str, parts))) if parts else ""


def record_seeds(
    name: str,
    a,
    recipe: tuple[str, ...],
    protocol: str,
    measure: Callable[[Path, Path, int], dict],
    page: Callable[[dict], str],
) -> None:
    """The main of a seeded search benchmark `name` (its options `a`: --seeds, --work, --out, --from-json): unless
    --from-json, each seed measured (`measure(parent, work, seed)`) into the JSON at --out, written with its page after
    every seed (a stopped run keeps the rest); then the page rendered from that JSON, and printed."""
    out, work = Path(a.out), Path(a.work)
    if not a.from_json:
        parent, data = start(work, out, recipe, protocol)
        for seed in a.seeds:
            data["seeds"][str(seed)] = measure(parent, work, seed)
            write_results(out.with_suffix(".md"), data, page(data))
    if not out.is_file():
        raise SystemExit(f"{name}: error: no {out}; run it without --from-json first")
    text = page(load_json(out))
    write_page(out.with_suffix(".md"), text)
    print(text)


def make_parent(work: Path) -> Path:
    import matgptq

    parent = work / "parent"
    if not (parent / "matgptq.json").is_file():
        matgptq.quantize(
            MODEL,
            parent,
            calib=TEXT,
            calib_range=(0.5, 1.0),
            method="matgptq",
            bits=(3, 4, 8),
            group_size=128,
            nsamples=64,
            seqlen=512,
            seed=0,
            overwrite=True,
            resume=True,
        )
    return parent


def search_child(
    parent: Path, work: Path, seed: int, recipe: list[str], name: str, minutes: float | None = None
) -> dict:
    """One measured `matgptq search` child of BUDGETS of seed `seed` (under --time-limit `minutes`, when given) into
    work/name; its usage and mix files."""
    import torch

    mixes = work / name
    limit = [] if minutes is None else ["--time-limit", f"{minutes:g}"]
    cmd = [
        sys.executable,
        "-m",
        "matgptq",
        "search",
        str(parent),
        "--budget",
        ",".join(BUDGETS),
        "--calib",
        str(TEXT),
        "--calib-range",
        calib_range(seed),
        *limit,
        "--seed",
        str(seed),
        "--out",
        str(mixes),
        "--quiet",
        "--overwrite",
        *recipe,
    ]
    usage = measured_child(cmd, torch.get_num_threads(), work / f"{name}.log")
    if not usage["ok"]:
        raise SystemExit(f"the search {name} failed: {usage['error']}")
    return {"usage": usage, "bodies": {b: json.loads((mixes / f"mix-{b}.json").read_text()) for b in BUDGETS}}


def calib_start(seed: int) -> float:
    """Where seed's calibration range of TEXT starts (it runs to the end): each seed calibrates on other text."""
    return 0.5 + 0.15 * seed


def calib_range(seed: int) -> str:
    return f"{calib_start(seed):g}:1"


def calib_windows(seed: int, count: int, seqlen: int = 256):
    """The first `count` windows of `seqlen` tokens of seed's calibration range: the search's pool is the first of
    them (allocation/inputs.py cuts the same text the same way)."""
    from matgptq.models import eval_windows, load_tokenizer, read_text, tokenize

    text = read_text(TEXT, (calib_start(seed), 1.0))
    return eval_windows(tokenize(load_tokenizer(MODEL), text), seqlen, count * seqlen)


def score_named(parent: Path, named: dict[str, dict[str, dict[str, int]]]) -> dict[str, dict]:
    """{budget: {kind: widths by layer}} → {budget: {kind: held-out KL, perplexity, code bits}}."""
    import torch

    import matgptq
    from matgptq.allocation import BudgetKind, CostModel
    from matgptq.evaluation.perplexity import score
    from matgptq.evaluation.teacher import Teacher
    from matgptq.formats import read_checkpoint
    from matgptq.models import eval_windows, load_tokenizer, read_text, tokenize

    with torch.no_grad():
        n, seqlen = HELD_OUT
        windows = eval_windows(tokenize(load_tokenizer(MODEL), read_text(TEXT, (0.0, 0.5))), seqlen, n * seqlen)
        teacher = Teacher(matgptq.load(MODEL), windows)
        cost = CostModel.from_checkpoint(read_checkpoint(parent), LEVELS)
        model = matgptq.load(parent, bits=8, packed=False)
        result = {}
        try:
            for budget, kinds in named.items():
                scores = result[budget] = {}
                for kind, widths in kinds.items():
                    matgptq.set_bits(model, widths)
                    s = score(model, windows, teacher)
                    bits = cost.average(tuple(widths[k] for k in cost.names), BudgetKind.CODE)
                    scores[kind] = {"kl": s.kl, "ppl": s.ppl, "bits": bits}
                print(f"{budget}: " + ", ".join(f"{k} {v['kl']:.4f}" for k, v in scores.items()), flush=True)
        finally:
            teacher.close()
    return result


def search_fitness(parent: Path, model: Path, calib: Path, calib_range: tuple[float, float], tok):
    """(Fitness, CostModel): `matgptq search`'s default fitness for `parent`: its 16,384-token calibration pool (the
    first 65 windows of 256 of the calibration range, allocation/inputs.py), levels 2..8, candidates in the precision
    --score-dtype auto picks."""
    import torch

    import matgptq
    from matgptq.allocation import CostModel, ScoreDtype
    from matgptq.allocation.fitness import Fitness
    from matgptq.evaluation.teacher import Teacher
    from matgptq.formats import read_checkpoint
    from matgptq.models import read_text, tokenize

    windows = tokenize(tok, read_text(calib, calib_range))[: 65 * 256].view(65, 256)
    cost = CostModel.from_checkpoint(read_checkpoint(parent), LEVELS)
    dtype = ScoreDtype.AUTO.resolve(torch.device("cpu"))
    return Fitness(
        matgptq.load(parent, bits=8, packed=False),
        Teacher(matgptq.load(model), windows, 8),
        windows,
        cost.names,
        compute_dtype=dtype,
    ), cost


def random_search(
    fitness, levels: tuple[int, ...], costs: list[list[int]], limit: int, evaluations: int, config, seed: int
) -> tuple[int, ...]:
    """The baseline the search must beat at equal fitness evaluations: one generation of distinct random
    budget-filling mixes (mutation.random_mix: all layers at the lowest level, then random one-level raises while one
    fits) through the search's own multi-stage selection (config.stages, windows drawn as evolve draws them), so the
    random candidates are scored on the same token counts as EvoPress' children; `evaluations` scorings in all."""
    import numpy as np

    from matgptq.allocation.evopress import MAX_DRAWS_PER_CHILD, draw_windows
    from matgptq.allocation.mutation import random_mix
    from matgptq.allocation.spread import score_all

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
        survivors = [
            survivors[i] for i in sorted(range(len(survivors)), key=lambda i: (scores[i], i))[: stage.survivors]
        ]
    return survivors[0]


def random_mixes(parent: Path, seed: int, evaluations: dict[str, int], seconds: dict) -> dict[str, dict[str, int]]:
    """Per budget, random search with as many scorings as the search's evolution made there, at least one
    generation's (a budget whose share went to refinement may run none; the refinement's layer-by-layer scorings are
    not counted), on the search's own calibration pool and stages (--calib-tokens 2040 as 8 windows of 256,
    RANDOM_STAGES); its seconds into `seconds`."""
    import torch

    import matgptq
    from matgptq.allocation import BudgetKind, CostModel, EvoConfig, ScoreDtype
    from matgptq.allocation.evopress import parse_stages, stage_pools
    from matgptq.allocation.fitness import Fitness
    from matgptq.evaluation.teacher import Teacher
    from matgptq.formats import read_checkpoint

    pool = calib_windows(seed, 8)
    cost = CostModel.from_checkpoint(read_checkpoint(parent), LEVELS)
    teacher = Teacher(matgptq.load(MODEL), pool)
    fit = Fitness(
        matgptq.load(parent, bits=8, packed=False),
        teacher,
        pool,
        cost.names,
        compute_dtype=ScoreDtype.AUTO.resolve(torch.device("cpu")),
    )
    config = EvoConfig(offspring=8, stages=parse_stages(RANDOM_STAGES), seed=seed)
    generation = sum(stage_pools(config))  # one generation's evaluations
    out = {}
    try:
        for b in BUDGETS:
            t0 = time.perf_counter()
            mix = random_search(
                fit,
                LEVELS,
                cost.table(BudgetKind.CODE),
                cost.limit(Fraction(b), BudgetKind.CODE),
                max(evaluations[b], generation),
                config,
                seed,
            )
            seconds[b] = round(time.perf_counter() - t0, 1)
            out[b] = dict(zip(cost.names, mix))
    finally:
        teacher.close()
    return out


def _stats(xs: list[float]) -> tuple[float, float]:
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def verdict(written: list[float], best: list[float]) -> str:
    """below / tie / above: the written mix's mean held-out KL against the best baseline's, a tie within the larger
    of the two seed spreads (sample standard deviations)."""
    (w, sw), (b, sb) = _stats(written), _stats(best)
    spread = max(sw, sb)
    return "tie" if abs(w - b) <= spread else ("below" if w < b else "above")


def stats(xs: list[float], digits: int = 4) -> str:
    """mean ± sample standard deviation; one seed: its value alone (no spread to show)."""
    if len(xs) == 1:
        return f"{xs[0]:.{digits}f}"
    return f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs):.{digits}f}"
