"""Every generated page, re-rendered from its JSON by the benchmark that owns it; --check says where a page drifted.

    python -m benchmarks.render_docs            # rewrite every page (and draw any registered figure that is missing)
    python -m benchmarks.render_docs --plots    # the same, and redraw every figure
    python -m benchmarks.render_docs --check    # write nothing; exit 1 naming each page that differs from its rendering
                                                # and its first differing line (`make docs-check`, run by CI)

Every number in docs/results/ comes from a JSON there that a benchmark wrote while measuring; the page is a pure
function of it. PAGES lists them, one claim each: the benchmark that measures it (`benchmarks.<script>`, e.g.
`search.ten_minutes`), the module whose functions render it (`renderer`, default: the benchmark itself), its inputs
(JSONs under docs/results/, in the order the functions take them; a glob gives one argument, a {file name: JSON}
dict), what it renders, and the command that measures it:
  md     a page under docs/results/, the text of RENDERER.<render>(*inputs) (default function: `page`)
  png    a figure under docs/results/, drawn by RENDERER.<plot>(*inputs, path) (default: `plot_page`); --check only
         asserts it exists (figure bytes depend on the matplotlib build); --plots redraws it
  block  "FILE#NAME": the block between `<!-- NAME:start -->` and `<!-- NAME:end -->` of a hand-written page (a path
         from the repository root), the text of RENDERER.<render>(*inputs), written by _harness.write_block
  load   optional: a function of RENDERER that reads the inputs itself and returns the one argument passed on (the
         inputs are then only checked to exist)
--check also fails on a file under docs/results/ that no entry renders (a page with no JSON behind it) and on a JSON
an entry names that does not exist. The table of claims in docs/results/README.md (its block `pages`) is rendered
from PAGES and checked like the pages; the rest of that page (the inventory's decisions, the studies that left) is
written by hand.

A benchmark that writes a new page: give it a pure `page(*jsons) -> str` (and `plot_page(*jsons, path)`), write the
JSON first and the page from it (_harness.write_page), and add its entry here.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from benchmarks._harness import RESULTS, ROOT, load_json, read_block, write_block, write_page


@dataclass(frozen=True)
class Page:
    script: str  # the benchmark that measures the claim: benchmarks.<script> (a topic and a name)
    inputs: tuple[str, ...]  # JSONs under docs/results/ (a glob: one {file name: JSON} argument)
    about: str  # the claim, one line for the index, docs/results/README.md
    command: str  # what measures it
    md: str | None = None  # docs/results/<md> = <renderer>.<render>(*inputs)
    png: str | None = None  # docs/results/<png> drawn by <renderer>.<plot>(*inputs, path)
    block: str | None = None  # "FILE#NAME": the marked block NAME in FILE (from the repository root)
    renderer: str | None = None  # the module whose functions render it (default: the benchmark)
    render: str = "page"
    plot: str = "plot_page"
    load: str | None = None  # <renderer>.<load>() reads the inputs itself and returns the one argument

    @property
    def module(self) -> str:
        return f"benchmarks.{self.renderer or self.script}"

    @property
    def path(self) -> str:
        return f"benchmarks/{self.script.replace('.', '/')}.py"


SMOL = "SmolLM2-135M-Instruct"
PAGES = (
    Page(
        "quality.overview",
        ("real_model_table.json", "search_real_model/run-2.json", "gguf_vs_llamacpp_real.json"),
        f"the README's overview: quality against bits on {SMOL}, drawn from three claims' JSON",
        "python -m benchmarks.quality.overview",
        png="overview.png",
        block="README.md#overview",
        load="load_sources",
        render="render",
        plot="plot",
    ),
    Page(
        "quality.gptq_defaults",
        ("gptq_defaults.json",),
        f"{SMOL}: the default GPTQ and the default MatGPTQ parent against GPTQModel's and llm-compressor's defaults, "
        "and which GPTQ options are the defaults (the ablation over seeds)",
        "python -m benchmarks.quality.gptq_defaults",
        md="gptq_defaults.md",
        png="gptq_defaults.png",
        renderer="quality._gptq_defaults_page",
    ),
    Page(
        "quality.gptq_defaults",
        ("gptq_defaults.json",),
        "the README's default GPTQ against the peers' defaults",
        "python -m benchmarks.quality.gptq_defaults",
        block="README.md#gptq-defaults",
        renderer="quality._gptq_defaults_blocks",
        render="readme_block",
    ),
    Page(
        "quality.gptq_defaults",
        ("gptq_defaults.json",),
        "the guide's table of defaults, each with what the ablation measured for it",
        "python -m benchmarks.quality.gptq_defaults",
        block="docs/guide/quantize.md#defaults",
        renderer="quality._gptq_defaults_blocks",
        render="defaults_block",
    ),
    Page(
        "quality.gptq_defaults",
        ("gptq_defaults.json",),
        "the default parent's slices against the default GPTQ per width, the master weight's trade-off, cost",
        "python -m benchmarks.quality.gptq_defaults",
        block="docs/decisions/matgptq-defaults.md#parent-defaults",
        renderer="quality._gptq_defaults_blocks",
        render="parent_block",
    ),
    Page(
        "quality.real_model_table",
        ("real_model_table.json",),
        f"{SMOL}: the paper's Table 1: RTN, GPTQ, MatGPTQ slices, GPTQModel and llm-compressor",
        "make real-model-table",
        md="real_model_table.md",
        png="real_model_table.png",
    ),
    Page(
        "search.real_model",
        ("search_real_model/run-*.json", "real_model_table.json"),
        f"{SMOL}: the searched mix at every budget against the parent's uniform slices, the knapsack start, random "
        "search and per-width GPTQ",
        "make search-real-model",
        md="search_real_model.md",
        png="search_real_model.png",
        renderer="search._real_model_page",
    ),
    Page(
        "search.ten_minutes",
        ("search_ten_minutes.json",),
        f"{SMOL}: all eight budgets in one `search --time-limit 10`, against every one-shot allocation and random "
        "search on the same parent and calibration, 3 seeds",
        "python -m benchmarks.search.ten_minutes",
        md="search_ten_minutes.md",
    ),
    Page(
        "gguf.default",
        ("gguf_default.json",),
        f"{SMOL}: the GGUF path a new user types (GPTQ g32, `export --type q4_0`) against llama.cpp's Q4_0 with and "
        "without imatrix, 3 calibration seeds",
        "python -m benchmarks.gguf.default",
        md="gguf_default.md",
    ),
    Page(
        "gguf.default",
        ("gguf_default.json",),
        "the README's GGUF quickstart result",
        "python -m benchmarks.gguf.default",
        block="README.md#gguf-default",
        render="readme_block",
    ),
    Page(
        "gguf.presets",
        ("gguf_vs_llamacpp_real.json",),
        f"{SMOL}: our GGUF files against llama.cpp's presets (Q4_0, Q4_K_M, Q3_K_M) at no more tensor bytes, scored "
        "by llama.cpp, 3 calibration seeds",
        "python -m benchmarks.gguf.presets [--seed S]",
        md="gguf_vs_llamacpp_real.md",
        renderer="gguf._presets_page",
    ),
    Page(
        "speed.pipeline",
        ("bench_pipeline.json",),
        f"{SMOL}: end-to-end quantization time and memory against GPTQModel and llm-compressor on the same windows",
        "make bench-pipeline",
        md="bench_pipeline.md",
    ),
    Page(
        "gpu.check",
        ("gpu.json",),
        "one GPU: nested kernels and decode against fp16 and torch's int4, GPU quantize, the search's scoring and "
        "one run of it (on a GPU machine)",
        "make gpu-check",
        md="gpu.md",
        renderer="gpu._report",
    ),
    Page(
        "interop.compressed_tensors",
        ("ct_vs_llmcompressor.json",),
        "stories260K: compressed-tensors exports against llm-compressor 0.14's checkpoints of the same scheme",
        "PYTHONPATH=src .venv-bench/bin/python -m benchmarks.interop.compressed_tensors",
        md="ct_vs_llmcompressor.md",
    ),
    Page(
        "interop.gptq_compat",
        ("gptq_compat.json",),
        "GPTQ exports loaded by GPTQModel and transformers + optimum (tests/exporters/test_gptq_interop.py, in "
        "`make interop`'s venv)",
        "python -m benchmarks.interop.gptq_compat",
        md="gptq_compat.md",
    ),
    Page(
        "robustness.faults",
        (
            "faults_checksums.json",
            "faults_kill.json",
            "faults_fuzz.json",
            "faults_kill_steps.json",
            "faults_full_disk.json",
        ),
        "kills resumed exactly, every writer on a full disk, damaged inputs at volume, and the price of the checksums",
        "python -m benchmarks.robustness.faults [--fuzz | --full-disk]; "
        "python -m benchmarks.robustness.faults_kill --kills 100 [--at steps]",
        md="faults.md",
    ),
    Page(
        "robustness.bad_input",
        ("bad_input.json",),
        "damaged and bad input: what `matgptq` says (tests/test_damaged_inputs.py's named cases)",
        "python -m benchmarks.robustness.bad_input",
        md="bad_input.md",
    ),
)
INDEX = RESULTS / "README.md"  # the claims and their pages (its block `pages`, rendered from PAGES); the rest by hand


def _glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def missing_inputs(page: Page) -> list[str]:
    return [
        f"docs/results/{i}"
        for i in page.inputs
        if not (sorted(RESULTS.glob(i)) if _glob(i) else (RESULTS / i).is_file())
    ]


def arguments(page: Page, module) -> tuple:
    if page.load:
        return (getattr(module, page.load)(),)
    return tuple(
        {f.name: load_json(f) for f in sorted(RESULTS.glob(i))} if _glob(i) else load_json(RESULTS / i)
        for i in page.inputs
    )


def text_target(page: Page) -> tuple[str, Path, str | None] | None:
    """(label, file, block name or None) of the entry's text output, or None for a figure-only entry."""
    if page.md:
        return f"docs/results/{page.md}", RESULTS / page.md, None
    if page.block:
        file, name = page.block.split("#", 1)
        return f"{file} (block {name})", ROOT / file, name
    return None


def first_difference(old: str, new: str) -> str:
    a, b = old.splitlines(), new.splitlines()
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else "(end of file)"
        y = b[i] if i < len(b) else "(end of file)"
        if x != y:
            return f"line {i + 1}:\n    on disk:  {x[:200]}\n    rendered: {y[:200]}"
    return "only in trailing whitespace"


def index() -> str:
    """docs/results/README.md's block `pages`: per entry, the claim, its page (or block), figure and data, the
    benchmark that measures it and the command."""
    import os

    def link(path: Path) -> str:
        return (
            f"[{path.relative_to(RESULTS) if path.is_relative_to(RESULTS) else path.name}]"
            f"({Path(os.path.relpath(path, RESULTS)).as_posix()})"
        )

    rows = []
    for e in PAGES:
        target = text_target(e)
        page = link(target[1]) + (f" (block `{target[2]}`)" if target and target[2] else "") if target else ""
        data = [link(f) for i in e.inputs for f in (sorted(RESULTS.glob(i)) if _glob(i) else [RESULTS / i])]
        rows.append(
            f"| {e.about} | {page} | {link(RESULTS / e.png) if e.png else ''} | {', '.join(data)} | "
            f"[{e.path}](../../{e.path}): `{e.command}` |"
        )
    return "\n".join(["| claim | page | figure | data | measured by |", "|---|---|---|---|---|", *rows])


def unregistered() -> list[str]:
    """Files under docs/results/ that are neither a JSON nor the output of an entry."""
    outputs = {RESULTS / p for e in PAGES for p in (e.md, e.png) if p} | {INDEX}
    return [
        str(f.relative_to(ROOT))
        for f in sorted(RESULTS.rglob("*"))
        if f.is_file() and f.suffix != ".json" and f not in outputs
    ]


def run(check: bool, plots: bool) -> list[str]:
    """Render every entry; returns the problems (--check: every drift; write mode: what could not be rendered)."""
    problems = []
    for page in PAGES:
        target = text_target(page)
        label = target[0] if target else f"docs/results/{page.png}"
        missing = missing_inputs(page)
        if missing:
            problems.append(f"{label}: its input {', '.join(missing)} does not exist")
            continue
        try:
            module = importlib.import_module(page.module)
            args = arguments(page, module)
            if target:
                _, file, block = target
                text = getattr(module, page.render)(*args)
                if block is None:
                    text = text.rstrip("\n") + "\n"  # as _docs.write_page writes it
                    old = file.read_text(encoding="utf-8") if file.is_file() else None
                else:
                    text = text.strip("\n")
                    old = read_block(file, block)
                    if old is None:
                        problems.append(f"{label}: {file.name} has no <!-- {block}:start --> / <!-- {block}:end -->")
                        continue
                if old != text:
                    if check:
                        how = (
                            "does not exist"
                            if old is None
                            else "differs from its rendering, first at " + first_difference(old, text)
                        )
                        problems.append(f"{label} ({page.path} from {', '.join(page.inputs)}) {how}")
                    elif block is None:
                        write_page(file, text)
                        print(f"wrote {label}")
                    else:
                        write_block(file, block, text)
                        print(f"wrote {label}")
            if page.png:
                png = RESULTS / page.png
                if check and not png.is_file():
                    problems.append(
                        f"docs/results/{page.png} does not exist (python -m benchmarks.render_docs --plots)"
                    )
                elif not check and (plots or not png.is_file()):
                    getattr(module, page.plot)(*args, png)
                    print(f"drew docs/results/{page.png}")
        except Exception:  # noqa: BLE001 (one broken renderer must not hide the others)
            problems.append(f"{label}: rendering failed:\n" + traceback.format_exc(limit=-3))
    text, old = index(), read_block(INDEX, "pages")
    if old is None:
        problems.append("docs/results/README.md has no <!-- pages:start --> / <!-- pages:end --> (its table of claims)")
    elif old != text:
        if check:
            problems.append(
                "docs/results/README.md (block pages, the table of claims) differs from PAGES, first at "
                + first_difference(old, text)
            )
        else:
            write_block(INDEX, "pages", text)
            print("wrote docs/results/README.md (block pages)")
    if check:
        problems += [
            f"{f}: no entry of benchmarks/render_docs.py renders it (a page needs a JSON and an entry)"
            for f in unregistered()
        ]
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="write nothing; exit 1 where a page differs")
    mode.add_argument("--plots", action="store_true", help="also redraw every registered figure")
    a = p.parse_args(argv)
    problems = run(a.check, a.plots)
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        if a.check:
            print(
                f"\n{len(problems)} generated page(s) out of date: `python -m benchmarks.render_docs` re-renders them "
                f"from their JSON",
                file=sys.stderr,
            )
        return 1
    if a.check:
        print(f"{len(PAGES)} entries: every page equals its rendering")
    return 0


if __name__ == "__main__":
    sys.exit(main())
