"""Every generated page, re-rendered from its JSON by the script that owns it; --check says where a page drifted.

    python -m benchmarks.render_docs            # rewrite every page (and draw any registered figure that is missing)
    python -m benchmarks.render_docs --plots    # the same, and redraw every figure
    python -m benchmarks.render_docs --check    # write nothing; exit 1 naming each page that differs from its rendering
                                             # and its first differing line (tests/test_docs.py runs this)

Every number in docs/results/ comes from a JSON there that a script wrote while measuring; the page is a pure function
of it. PAGES lists them: each entry names the owning script (a module: `benchmarks.NAME` for a bare NAME, else the
dotted name given, e.g. `research.scale_choice`), its inputs (JSONs under docs/results/, in the order the functions take them; a glob gives one argument, a
{file name: JSON} dict), and what it renders:
  md     a page under docs/results/, the text of SCRIPT.<render>(*inputs) (default function: `page`)
  png    a figure under docs/results/, drawn by SCRIPT.<plot>(*inputs, path) (default: `plot_page`); --check only
         asserts it exists (figure bytes depend on the matplotlib build); --plots redraws it
  block  "FILE#NAME": the block between `<!-- NAME:start -->` and `<!-- NAME:end -->` of a hand-written page (a path
         from the repository root), the text of SCRIPT.<render>(*inputs), written by _docs.write_block
  load   optional: a function of SCRIPT that reads the inputs itself and returns the one argument passed on (the
         inputs are then only checked to exist)
--check also fails on a file under docs/results/ that no entry renders (a page with no JSON behind it) and on a JSON
an entry names that does not exist.

Adding an entry is three lines in PAGES. The README's overview (benchmarks/overview.py: `load_sources()` reads the three
JSONs, `render(src)` gives the README block, `plot(src, path)` draws the figure):

    Page("overview", ("real_model_table.json", "search_real_model/run-2.json", "gguf_vs_llamacpp_real*.json"),
         png="overview.png", block="README.md#overview", load="load_sources", render="render", plot="plot",
         about="the README's overview: quality against bits on SmolLM2-135M-Instruct"),

then `python -m benchmarks.render_docs` draws the missing figure, writes the block and lists the entry in
docs/results/README.md (the index of every entry, rendered from PAGES and checked like the pages).

A script that writes a new page: give it a pure `page(*jsons) -> str` (and `plot_page(*jsons, path)`), write the JSON
first and the page from it (`_docs.write_page`), and add its entry here.
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
    script: str  # the module that owns the page (benchmarks.<script>, or a dotted name): its functions render it
    inputs: tuple[str, ...]  # JSONs under docs/results/ (a glob: one {file name: JSON} argument)
    md: str | None = None  # docs/results/<md> = <script>.<render>(*inputs)
    png: str | None = None  # docs/results/<png> drawn by <script>.<plot>(*inputs, path)
    block: str | None = None  # "FILE#NAME": the marked block NAME in FILE (from the repository root)
    render: str = "page"
    plot: str = "plot_page"
    load: str | None = None  # <script>.<load>() reads the inputs itself and returns the one argument
    about: str = ""  # one line for the index, docs/results/README.md

    @property
    def module(self) -> str:
        return self.script if "." in self.script else f"benchmarks.{self.script}"

    @property
    def path(self) -> str:
        return self.module.replace(".", "/") + ".py"


PAGES = (
    Page("overview", ("real_model_table.json", "search_real_model/run-2.json", "gguf_vs_llamacpp_real*.json"),
         png="overview.png", block="README.md#overview", load="load_sources", render="render", plot="plot",
         about="the README's overview: quality against bits on SmolLM2-135M-Instruct"),
    Page("results", ("stories260k_methods.json",), md="stories260k_methods.md", png="stories260k_methods.png",
         about="stories260K: fp32, RTN, GPTQ variants and MatGPTQ slices at every width; the MatGPTQ claims"),
    Page("search_results", ("search.json",), md="search.md", png="search.png",
         about="stories260K: searched mixes against uniform slices, the knapsack start and random search"),
    Page("search_baselines", ("search_baselines.json",), md="search_baselines.md",
         about="stories260K: the written mix against the one-shot allocators (uniform, probe, additive KL, noise "
               "injection, imatrix-weighted error) and random search, 8 budgets, 3 seeds"),
    Page("search_minutes", ("search_minutes.json",), md="search_minutes.md",
         about="SmolLM2-135M-Instruct: all eight budgets under `search --time-limit 10`, timed, the written mix against "
               "the uniform slices and the knapsack start on held-out text, 3 seeds"),
    Page("search_ten_minutes", ("search_ten_minutes.json",), md="search_ten_minutes.md",
         about="SmolLM2-135M-Instruct: all eight budgets in one `search --time-limit 10` with guided mutations, "
               "against every one-shot allocation and random search on the same parent and calibration"),
    Page("search_tie", ("search_tie.json",), md="search_tie.md",
         about="SmolLM2-135M-Instruct: what giving q/k/v and gate/up one width each (`search --tie`) costs, per seed"),
    Page("search_ten_minutes_variants", ("search_ten_minutes.json", "search_ten_minutes_variants/*.json"),
         md="search_ten_minutes_variants.md",
         about="SmolLM2-135M-Instruct: the 10-minute search with other loss tables (`--sensitivity-top`, "
               "`--sensitivity-tokens`, `--sensitivity-wide`) against the record's recipe, per seed"),
    Page("search_table_top", ("search_table_top.json",), md="search_table_top.md",
         about="SmolLM2-135M-Instruct: the 10-minute runs' loss tables scored up to a level and extrapolated above it "
               "(`search --sensitivity-top`) against every level scored, on one and two windows, 3 seeds"),
    Page("search_noise", ("search_noise.json",), md="search_noise.md",
         about="SmolLM2-135M-Instruct: what the 10-minute evolution gained on its pool, on fresh and on held-out text, "
               "against the standard error of its evaluations, 3 seeds"),
    Page("search_long", ("search_long.json",), md="search_long.md",
         about="SmolLM2-135M-Instruct: the search given its default 25 generations from the measured additive start, "
               "against every one-shot allocation of the same run, at the fractional budgets"),
    Page("search_long", ("search_long_wide.json",), md="search_long_wide.md", render="page_wide",
         about="SmolLM2-135M-Instruct: the same at the budgets the first record lacks, with the defaults of its day "
               "(float32 tables, mutations drawn from the table)"),
    Page("search_refined", ("search_refined.json",), md="search_refined.md",
         about="SmolLM2-135M-Instruct: the search's start refined by measured local steps, against every one-shot "
               "allocation of the same run, at the fractional budgets"),
    Page("search_generations", ("search_generations.json",), md="search_generations.md",
         about="SmolLM2-135M-Instruct: the 10-minute recipe's evolution run to 12 generations at 3.25 and 3.5 bits, "
               "its parent on held-out text every 3 generations, 3 seeds"),
    Page("search_generations", ("search_generations_big_pool.json",), md="search_generations_big_pool.md",
         render="page_big_pool",
         about="SmolLM2-135M-Instruct: the same with twice the pool, a four-window last stage and the record's table, "
               "to 18 generations"),
    Page("search_table_dtype", ("search_table_dtype.json",), md="search_table_dtype.md",
         about="SmolLM2-135M-Instruct: the additive table scored in float32 against bfloat16, its knapsack mixes "
               "on held-out text at eight budgets, 3 seeds"),
    Page("search_table_models", ("search_table_models.json",), md="search_table_models.md",
         about="SmolLM2-135M-Instruct: the 10-minute search's table corrected by an error model or by factors "
               "measured per block or kind of layer, their knapsack mixes at 3.25 and 3.5 bits on held-out text, "
               "3 seeds"),
    Page("search_long_best", ("search_long_best.json",), md="search_long_best.md",
         about="SmolLM2-135M-Instruct: the default evolution (25 generations, about 11 minutes a budget) started "
               "from the best measured table's allocation at 3.25 and 3.5 bits, on held-out text, 3 seeds"),
    Page("research.matgptq_ablation", ("ablation.json",), md="ablation.md", render="stories_page",
         about="stories260K: the MatGPTQ variants against per-width GPTQ, over calibration seeds"),
    Page("research.matgptq_ablation", ("ablation_real_model.json",), md="ablation_real_model.md", render="real_model_page",
         about="SmolLM2-135M-Instruct: the same ablation (`--real-model`)"),
    Page("research.scale_choice", ("scale_choice.json",), md="scale_choice.md",
         about="how GPTQ's group scales are chosen: MSE search, Hessian-weighted, least-squares refit"),
    Page("mse_search", ("mse_search.json",), md="mse_search.md",
         about="the MSE scale search: its 30 grid points, coarse to fine, against scoring all 80 (error and time)"),
    Page("gguf_default", ("gguf_default.json",), md="gguf_default.md",
         about="the GGUF path a new user types (GPTQ g32, `--target gguf`, `export --type q4_0`) against llama.cpp's "
               "Q4_0 with and without imatrix, over calibration seeds"),
    Page("gguf_default", ("gguf_default.json",), block="README.md#gguf-default", render="readme_block",
         about="the README's GGUF quickstart result"),
    Page("gpu_check_report", ("gpu.json",), md="gpu.md",
         about="make gpu-check on an H100: nested kernels and decode against fp16 and torch's int4, GPU quantize, "
               "the search against depth"),
    Page("gptq_defaults_report", ("gptq_defaults.json",), md="gptq_defaults.md", png="gptq_defaults.png",
         about="which GPTQ options are the defaults: the ablation over seeds, GPTQModel and llm-compressor beside it"),
    Page("gptq_defaults_blocks", ("gptq_defaults.json",), block="docs/guide/quantize.md#defaults", render="defaults_block",
         about="the guide's table of defaults, each with what the ablation measured for it"),
    Page("gptq_defaults_blocks", ("gptq_defaults.json",), block="README.md#gptq-defaults",
         render="readme_block",
         about="the README's default GPTQ against the peers' defaults"),
    Page("gptq_defaults_blocks", ("gptq_defaults.json",), block="docs/decisions/matgptq-defaults.md#parent-defaults",
         render="parent_block",
         about="the default parent's slices against the default GPTQ per width, the master weight's trade-off, cost"),
    Page("real_model_table", ("real_model_table.json",), md="real_model_table.md", png="real_model_table.png",
         about="SmolLM2-135M-Instruct: RTN, GPTQ, MatGPTQ slices, GPTQModel and llm-compressor (`make real-model-table`)"),
    Page("search_real_model_report", ("search_real_model/run-*.json", "real_model_table.json"),
         md="search_real_model.md", png="search_real_model.png",
         about="SmolLM2-135M-Instruct: searched mixes (`make search-real-model`, benchmarks/search_real_model.py)"),
    Page("gguf_vs_llamacpp", ("gguf_vs_llamacpp.json",), md="gguf_vs_llamacpp.md",
         about="stories260K: our GGUF Q4_0 exports against llama.cpp's quantizer, scored by llama.cpp"),
    Page("gguf_real_report", ("gguf_vs_llamacpp_real.json", "gguf_vs_llamacpp_real.seed*.json"),
         md="gguf_vs_llamacpp_real.md",
         about="SmolLM2-135M-Instruct: our GGUF files against llama.cpp's presets (benchmarks/gguf_vs_llamacpp_real.py)"),
    Page("bench_eval", ("bench_eval.json",), md="bench_eval.md",
         about="`matgptq eval --kl-to`: the streamed teacher against the all-at-once baseline"),
    Page("bench_moe_block", ("bench_moe_block.json",), md="bench_moe_block.md",
         about="the time to quantize a mixture-of-experts block against a dense one of the same active parameters"),
    Page("bench_pipeline", ("bench_pipeline.json",), md="bench_pipeline.md",
         about="end-to-end quantization time and memory against GPTQModel and llm-compressor (`make bench-pipeline`)"),
    Page("faults", ("faults_checksums.json", "faults_kill.json", "faults_fuzz.json"), md="faults.md",
         about="kills resumed exactly, damaged inputs at volume, and the price of the checksums"),
    Page("bad_input_table", ("bad_input.json",), md="bad_input.md",
         about="damaged and bad input: what `matgptq` says (tests/test_damaged_inputs.py)"),
    Page("ct_vs_llmcompressor", ("ct_vs_llmcompressor.json",), md="ct_vs_llmcompressor.md",
         about="compressed-tensors exports against llm-compressor 0.14's checkpoints of the same scheme"),
    Page("gptq_compat_table", ("gptq_compat.json",), md="gptq_compat.md",
         about="GPTQ exports loaded by GPTQModel and transformers + optimum (tests/exporters/test_gptq_interop.py)"),
)
INDEX = RESULTS / "README.md"  # the list of the pages, rendered from PAGES


def _glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def missing_inputs(page: Page) -> list[str]:
    return [f"docs/results/{i}" for i in page.inputs if not (sorted(RESULTS.glob(i)) if _glob(i) else (RESULTS / i).is_file())]


def arguments(page: Page, module) -> tuple:
    if page.load:
        return (getattr(module, page.load)(),)
    return tuple({f.name: load_json(f) for f in sorted(RESULTS.glob(i))} if _glob(i) else load_json(RESULTS / i)
                 for i in page.inputs)  # fmt: skip


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
    """docs/results/README.md: every entry's page, figure, data and script."""
    import os

    def link(path: Path) -> str:
        return f"[{path.relative_to(RESULTS) if path.is_relative_to(RESULTS) else path.name}]" \
               f"({Path(os.path.relpath(path, RESULTS)).as_posix()})"  # fmt: skip

    rows = []
    for e in PAGES:
        target = text_target(e)
        page = link(target[1]) + (f" (block `{target[2]}`)" if target and target[2] else "") if target else ""
        data = [link(f) for i in e.inputs for f in (sorted(RESULTS.glob(i)) if _glob(i) else [RESULTS / i])]
        rows.append(f"| {page} | {e.about} | {link(RESULTS / e.png) if e.png else ''} | {', '.join(data)} | "
                    f"[{e.path}](../../{e.path}) |")  # fmt: skip
    return "\n".join([
        "<!-- generated by benchmarks/render_docs.py from its list of pages; `python -m benchmarks.render_docs` re-renders it; "
        "do not edit -->",
        "# Results",
        "",
        "Every page here is rendered, by the script named at its top, from the JSON beside it that a script wrote while "
        "measuring; each page states its protocol. `python -m benchmarks.render_docs --check` (tests/test_docs.py) fails "
        "when a page no longer equals its rendering; `python -m benchmarks.render_docs` re-renders them (`--plots` the "
        "figures too).",
        "",
        "| page | what | figure | data | rendered by |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ])  # fmt: skip


def unregistered() -> list[str]:
    """Files under docs/results/ that are neither a JSON nor the output of an entry."""
    outputs = {RESULTS / p for e in PAGES for p in (e.md, e.png) if p} | {INDEX}
    return [str(f.relative_to(ROOT)) for f in sorted(RESULTS.rglob("*"))
            if f.is_file() and f.suffix != ".json" and f not in outputs]  # fmt: skip


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
                        how = "does not exist" if old is None else "differs from its rendering, first at " + \
                            first_difference(old, text)  # fmt: skip
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
                    problems.append(f"docs/results/{page.png} does not exist (python -m benchmarks.render_docs --plots)")
                elif not check and (plots or not png.is_file()):
                    getattr(module, page.plot)(*args, png)
                    print(f"drew docs/results/{page.png}")
        except Exception:  # noqa: BLE001 (one broken renderer must not hide the others)
            problems.append(f"{label}: rendering failed:\n" + traceback.format_exc(limit=-3))
    text = index()
    old = INDEX.read_text(encoding="utf-8") if INDEX.is_file() else None
    if old != text:
        if check:
            how = "does not exist" if old is None else "differs from PAGES, first at " + first_difference(old, text)
            problems.append(f"docs/results/README.md (the index) {how}")
        else:
            write_page(INDEX, text)
            print("wrote docs/results/README.md")
    if check:
        problems += [f"{f}: no entry of benchmarks/render_docs.py renders it (a page needs a JSON and an entry)"
                     for f in unregistered()]  # fmt: skip
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
            print(f"\n{len(problems)} generated page(s) out of date: `python -m benchmarks.render_docs` re-renders them "
                  f"from their JSON", file=sys.stderr)  # fmt: skip
        return 1
    if a.check:
        print(f"{len(PAGES)} entries: every page equals its rendering")
    return 0


if __name__ == "__main__":
    sys.exit(main())
