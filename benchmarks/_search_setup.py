"""The set-up the SmolLM2 search benchmarks share (search_minutes.py, search_long.py): one MatGPTQ parent of
SmolLM2-135M-Instruct, each seed's calibration range of WikiText-2 test, one measured `matgptq search` child per run,
and the scoring of named mixes on held-out text (the first 4 × 1024 tokens of the first half, never calibrated on).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

import matgptq
from benchmarks._harness import RESULTS, ROOT, header, load_json, measured_child, write_page, write_results
from matgptq.allocation import BudgetKind, CostModel
from matgptq.evaluation.perplexity import score
from matgptq.evaluation.teacher import Teacher
from matgptq.formats import read_checkpoint
from matgptq.models import eval_windows, load_tokenizer, read_text, tokenize

MODEL = Path.home() / ".cache" / "matgptq" / "SmolLM2-135M-Instruct"  # `make real-model`
TEXT = ROOT.parent / "shared" / "data" / "wikitext-2-raw" / "wiki.test.joined.txt"
BUDGETS = ("2.5", "2.75", "3.0", "3.25", "3.5", "4.0", "5.0", "6.0")
HELD_OUT = (4, 1024)  # windows × tokens from the start of the first half
LEVELS = tuple(range(2, 9))


def start(work: Path, out: Path, recipe: tuple[str, ...], protocol: str,
          same: tuple[tuple[str, ...], ...] = ()) -> tuple[Path, dict]:  # fmt: skip
    """The parent (made once in `work`) and the results at `out` of `recipe`: a fresh record where they were made
    with another (seeds of another recipe are not averaged with these); the protocol is the script's docstring now
    (the recipe is the same; the docstring may describe parts added since). `same`: older spellings of the same
    command (a default since spelled out), recorded as `recipe` from now on."""
    if not MODEL.is_dir():
        raise SystemExit(f"{MODEL} is missing: run `make real-model` first")
    parent = make_parent(work)
    data = load_json(out) if out.is_file() else {}
    if data.get("recipe") in [list(r) for r in same]:
        data["recipe"] = list(recipe)
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
    ap.add_argument("--seeds", type=comma_list(int), default="0,1,2",
                    help="search seeds (each also moves the calibration text)")
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


def record_seeds(name: str, a, recipe: tuple[str, ...], protocol: str,
                 measure: Callable[[Path, Path, int], dict], page: Callable[[dict], str]) -> None:  # fmt: skip
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
    parent = work / "parent"
    if not (parent / "matgptq.json").is_file():
        matgptq.quantize(MODEL, parent, calib=TEXT, calib_range=(0.5, 1.0), method="matgptq", bits=(3, 4, 8),
                         group_size=128, nsamples=64, seqlen=512, seed=0, overwrite=True, resume=True)  # fmt: skip
    return parent


def search_child(parent: Path, work: Path, seed: int, recipe: list[str], name: str,
                 minutes: float | None = None, budgets: tuple[str, ...] = BUDGETS) -> dict:  # fmt: skip
    """One measured `matgptq search` child of `budgets` of seed `seed` (under --time-limit `minutes`, when given)
    into work/name; its usage and mix files."""
    mixes = work / name
    limit = [] if minutes is None else ["--time-limit", f"{minutes:g}"]
    cmd = [sys.executable, "-m", "matgptq", "search", str(parent), "--budget", ",".join(budgets), "--calib", str(TEXT),
           "--calib-range", calib_range(seed), *limit, "--seed", str(seed), "--out", str(mixes), "--quiet",
           "--overwrite", *recipe]  # fmt: skip
    usage = measured_child(cmd, torch.get_num_threads(), work / f"{name}.log")
    if not usage["ok"]:
        raise SystemExit(f"the search {name} failed: {usage['error']}")
    return {"usage": usage, "bodies": {b: json.loads((mixes / f"mix-{b}.json").read_text()) for b in budgets}}


def calib_start(seed: int) -> float:
    """Where seed's calibration range of TEXT starts (it runs to the end): each seed calibrates on other text."""
    return 0.5 + 0.15 * seed


def calib_range(seed: int) -> str:
    return f"{calib_start(seed):g}:1"


def calib_windows(seed: int, count: int, seqlen: int = 256) -> torch.Tensor:
    """The first `count` windows of `seqlen` tokens of seed's calibration range: the search's pool is the first of
    them (runner._calib_pool cuts the same text the same way)."""
    text = read_text(TEXT, (calib_start(seed), 1.0))
    return eval_windows(tokenize(load_tokenizer(MODEL), text), seqlen, count * seqlen)


@torch.no_grad()
def score_named(parent: Path, named: dict[str, dict[str, dict[str, int]]]) -> dict[str, dict]:
    """{budget: {kind: widths by layer}} → {budget: {kind: held-out KL, perplexity, code bits}}."""
    tok = load_tokenizer(MODEL)
    n, seqlen = HELD_OUT
    windows = eval_windows(tokenize(tok, read_text(TEXT, (0.0, 0.5))), seqlen, n * seqlen)
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
                scores[kind] = {"kl": s.kl, "ppl": s.ppl, "bits": cost.average(tuple(widths[k] for k in cost.names),
                                                                              BudgetKind.CODE)}  # fmt: skip
            print(f"{budget}: " + ", ".join(f"{k} {v['kl']:.4f}" for k, v in scores.items()), flush=True)
    finally:
        teacher.close()
    return result


def page_top(name: str, title: str, data: dict) -> list[str]:
    """The lines a seeded search benchmark's page starts with: which script renders it from which JSON (both named
    `name`), the title, and the protocol (the script's docstring, as recorded)."""
    return [header(f"benchmarks/{name}.py", f"{name}.json"), f"# {title}", "", "```", data["protocol"].strip(), "```",
            ""]  # fmt: skip


def seeds_named(seeds: list[str]) -> str:
    """'Seed 0' or 'Seeds 0, 1, 2'."""
    return f"Seed{'s' * (len(seeds) > 1)} {', '.join(seeds)}"


def stats(xs: list[float], digits: int = 4) -> str:
    """mean ± sample standard deviation; one seed: its value alone (no spread to show)."""
    if len(xs) == 1:
        return f"{xs[0]:.{digits}f}"
    return f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs):.{digits}f}"
