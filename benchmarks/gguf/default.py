#!/usr/bin/env python
"""Does the GGUF path a new user types beat llama.cpp's own Q4_0 (issue 45, item 4)?

    matgptq quantize MODEL --out CKPT --method gptq --bits 4 --group-size 32 --calib TEXT [--target gguf]
    matgptq export CKPT --format gguf --type q4_0 --out FILE.gguf

against `llama-quantize F32 OUT Q4_0`, without and with `--imatrix` (llama-imatrix on the same calibration windows).
Every other quantize option stays at its default, the calibration size included: --nsamples and --seqlen are not
passed, and llama-imatrix gets those same windows (CalibConfig's NSAMPLES × SEQLEN).

Protocol (benchmarks/_harness/llamacpp.py: the F32 file from llama.cpp's converter, llama.cpp's scoring)
  model        SmolLM2-135M-Instruct (`make real-model`; a dequantized Q4_1 model, so every g32 4-bit grid, ours
               and llama.cpp's alike, starts with a head start; the ratios between them are what is reported)
  calibration  the second half (by characters) of WikiText-2 test, windows drawn with each of --seeds; GPTQ gets
               the token ids, llama-imatrix the same windows decoded to text (one window per -c SEQLEN chunk)
  scoring      `llama-perplexity -c 512` on --wiki-chunks chunks of WikiText-2 test's first half and --ts-chunks of
               TinyStories: perplexity and KL(F32 ‖ file), over chunks · 256 positions
  goal         ours ≤ 0.7 × plain Q4_0's KL, and below Q4_0 + imatrix's, per seed; the mean and spread over seeds
               decide (a spread that crosses the line is a tie)

Resumable: files in --work, results in docs/results/gguf_default.json after every step; the page
docs/results/gguf_default.md is rendered from it (`python -m benchmarks.render_docs`).

    python -m benchmarks.gguf.default [--seeds 0,1,2] [--rows default,target-gguf] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchmarks._harness import RESULTS, child_env, header, load_json, write_atomic, write_page
from benchmarks._harness.llamacpp import DEFAULT_MODEL, TOOLS, WIKI, calib_text, f32_gguf, file_info, log, run, score

OUT = RESULTS / "gguf_default.json"
DATASETS = {"wiki": "WikiText-2", "ts": "TinyStories"}
GOAL = 0.7
# ours: row -> options beyond `--method gptq --bits 4 --group-size 32`; llama.cpp's rows: "llama:" + what follows
OURS = {"default": [], "target-gguf": ["--target", "gguf"]}
LLAMA = {"llama:Q4_0": [], "llama:Q4_0+im": ["--imatrix"]}
LABEL = {
    "default": "ours: `quantize --method gptq --bits 4 --group-size 32`",
    "target-gguf": "ours: the same `--target gguf`",
    "llama:Q4_0": "llama.cpp Q4_0",
    "llama:Q4_0+im": "llama.cpp Q4_0 + imatrix",
}


def settings(a, nsamples: int, seqlen: int) -> dict:
    return {
        "model": str(Path(a.model).resolve()),
        "nsamples": nsamples,
        "seqlen": seqlen,
        "wiki_chunks": a.wiki_chunks,
        "ts_chunks": a.ts_chunks,
        "ctx": 512,
        "ours": OURS,
    }


def ours(row: str, seed: int, a, seed_dir: Path, out: Path) -> None:
    """Quantize and export one of our rows."""
    ckpt = seed_dir / f"{row}-ckpt"
    if not (ckpt / "config.json").is_file():
        run(
            [
                sys.executable,
                "-m",
                "matgptq",
                "quantize",
                a.model,
                "--out",
                ckpt,
                "--method",
                "gptq",
                "--bits",
                "4",
                "--group-size",
                "32",
                *OURS[row],
                "--calib",
                WIKI,
                "--calib-range",
                "0.5:1",
                "--seed",
                str(seed),
                "--overwrite",
                "--resume",
                "--quiet",
            ],
            seed_dir / f"{row}.quantize.log",
            child_env(a.threads),
        )
    tmp = out.with_suffix(".tmp.gguf")
    run(
        [
            sys.executable,
            "-m",
            "matgptq",
            "export",
            ckpt,
            "--format",
            "gguf",
            "--type",
            "q4_0",
            "--out",
            tmp,
            "--overwrite",
        ],
        seed_dir / f"{row}.export.log",
        child_env(a.threads),
    )
    tmp.replace(out)


def llama(row: str, a, f32: Path, seed_dir: Path, imatrix: Path, out: Path) -> None:
    tmp = out.with_suffix(".tmp.gguf")
    im = ["--imatrix", imatrix] if LLAMA[row] else []
    run([TOOLS / "llama-quantize", *im, f32, tmp, "Q4_0", str(a.threads)], out.with_suffix(".log"))
    tmp.replace(out)


def build_parser() -> argparse.ArgumentParser:
    """The command line: model, work dir, seeds, rows, threads and scored chunks."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="the fp32 HF model directory (make real-model)")
    p.add_argument(
        "--work",
        type=Path,
        default=Path.home() / ".cache" / "matgptq" / "gguf_default",
        help="where the files, logs and llama.cpp's saved logits are kept",
    )
    p.add_argument("--seeds", default="0,1,2", help="calibration seeds (GPTQ and imatrix redrawn for each)")
    p.add_argument("--rows", default=",".join([*OURS, *LLAMA]), help="rows to compute (default all)")
    p.add_argument("--threads", type=int, default=2, help="threads for llama.cpp's tools and the quantizer")
    p.add_argument("--wiki-chunks", type=int, default=24, help="512-token chunks of WikiText-2 scored")
    p.add_argument("--ts-chunks", type=int, default=16, help="512-token chunks of TinyStories scored")
    return p


def check_inputs(p: argparse.ArgumentParser, a: argparse.Namespace) -> list[str]:
    """The --rows asked for; an unknown row, a missing llama.cpp tool or a missing model ends the script."""
    rows = [r for r in a.rows.split(",") if r]
    if bad := [r for r in rows if r not in OURS and r not in LLAMA]:
        p.error(f"unknown row {bad[0]!r}; rows are {', '.join([*OURS, *LLAMA])}")
    for tool in ("llama-quantize", "llama-imatrix", "llama-perplexity"):
        if not (TOOLS / tool).is_file():
            sys.exit(f"gguf_default: error: no {TOOLS / tool}; run `make llama-cpp-tools` first")
    if not (a.model / "config.json").is_file():
        sys.exit(f"gguf_default: error: no model at {a.model}; run `make real-model` first")
    return rows


def load_state(a: argparse.Namespace) -> dict:
    """The results so far (or a new state); a run with other settings in OUT ends the script."""
    state = load_json(OUT) if OUT.is_file() else {"settings": settings(a, a.nsamples, a.seqlen), "runs": {}}
    if state["settings"] != settings(a, a.nsamples, a.seqlen):
        sys.exit(f"gguf_default: error: {OUT} holds a run with other settings; move it away or match them")
    return state


def save(state: dict) -> None:
    """Write the state to OUT (atomically) and re-render its page."""
    write_atomic(OUT, json.dumps(state, indent=2))
    write_page(RESULTS / "gguf_default.md", page(state))


def run_seed(a: argparse.Namespace, state: dict, rows: list[str], f32: Path, seed: int) -> None:
    """Make (imatrix, then each row's file) and score every row of one calibration seed, saving after each score."""
    a.seed = seed
    seed_dir = a.work / f"seed{seed}"
    seed_dir.mkdir(exist_ok=True)
    cells = state["runs"].setdefault(str(seed), {})
    imatrix = seed_dir / "imatrix.gguf"
    if "llama:Q4_0+im" in rows and not imatrix.is_file():
        run(
            [
                TOOLS / "llama-imatrix",
                "-m",
                f32,
                "-f",
                calib_text(a.model, seed_dir, a),
                "-c",
                str(a.seqlen),
                "-b",
                str(a.seqlen),
                "--chunks",
                str(a.nsamples),
                "-t",
                str(a.threads),
                "-o",
                imatrix,
            ],
            seed_dir / "imatrix.log",
        )
    for row in rows:
        if row == "llama:Q4_0" and seed != 0:  # no calibration: made and scored once, with seed 0
            continue
        out = seed_dir / f"{row.replace(':', '-').replace('+', '-')}.gguf"
        cell = cells.setdefault(row, {})
        if not out.is_file():
            if row in OURS:
                ours(row, seed, a, seed_dir, out)
            else:
                llama(row, a, f32, seed_dir, imatrix, out)
        cell["tensor_bytes"] = file_info(out)["tensor_bytes"]
        for ds in DATASETS:
            if ds not in cell:
                log(f"{seed_dir.name} {out.stem}: scoring on {ds}")
                cell[ds] = score(out, ds, a.work, a, logs=seed_dir)  # logs are named by the file's stem
                save(state)


def main() -> int:
    """Score the F32 file, then make and score every row for each seed; print the page."""
    p = build_parser()
    a = p.parse_args()
    rows = check_inputs(p, a)
    from matgptq.quantization.calibration import CalibConfig

    a.nsamples, a.seqlen = CalibConfig.nsamples, CalibConfig.seqlen  # quantize's; calib_text reads them from `a`
    state = load_state(a)
    a.work.mkdir(parents=True, exist_ok=True)
    f32 = f32_gguf(a.model, a.work)
    for ds in DATASETS:  # the F32 file's scores, and its logits every KL is taken against (saved in --work)
        if ds not in state.setdefault("f32", {}):
            state["f32"][ds] = score(f32, ds, a.work, a)
            save(state)
    for seed in (int(s) for s in a.seeds.split(",")):
        run_seed(a, state, rows, f32, seed)
    print(page(state))
    return 0


def _cells(state: dict, row: str) -> list[dict]:
    """The row's finished cells, one per seed (llama.cpp's plain Q4_0: seed 0's only)."""
    return [c[row] for c in state["runs"].values() if all(ds in c.get(row, {}) for ds in DATASETS)]


def _spread(values: list[float], digits: int) -> str:
    if not values:
        return "–"
    mean = statistics.mean(values)
    return f"{mean:.{digits}f}" + (f" ± {max(values) - min(values):.{digits}f}" if len(values) > 1 else "")


def _ratios(state: dict, row: str, ref: str, ds: str) -> list[float]:
    """KL of `row` over KL of `ref` per seed; a reference made without calibration is seed 0's for every seed."""
    out = []
    for seed, cells in state["runs"].items():
        other = cells.get(ref) if ref in cells else state["runs"].get("0", {}).get(ref)
        if ds in cells.get(row, {}) and other and ds in other:
            out.append(cells[row][ds]["kl"] / other[ds]["kl"])
    return out


def _verdict(ratios: list[float], goal: float, strict: bool) -> str:
    below = [r < goal if strict else r <= goal for r in ratios]
    return "–" if not ratios else "met" if all(below) else "**missed**" if not any(below) else "tie"


def page(state: dict) -> str:
    s = state["settings"]
    seeds = sorted(state["runs"], key=int)
    lines = [
        header("benchmarks/gguf/default.py", "gguf_default.json"),
        f"SmolLM2-135M-Instruct, 4 bits at group size 32 (Q4_0's block). Calibration: {s['nsamples']} × "
        f"{s['seqlen']} tokens of WikiText-2 test's second half (`quantize`'s defaults; llama-imatrix gets the "
        f"same windows), seeds {', '.join(seeds)}. Scored by `llama-perplexity -c 512` on {s['wiki_chunks'] * 256} "
        f"WikiText-2 and {s['ts_chunks'] * 256} TinyStories positions; KL(F32 ‖ file). Mean over seeds ± spread "
        "(max − min); llama.cpp's plain Q4_0 uses no calibration, so it is one file.",
        "",
        "| file | seeds | tensor bytes | " + " | ".join(f"{n} ppl | {n} KL" for n in DATASETS.values()) + " |",
        "|---" * (3 + 2 * len(DATASETS)) + "|",
    ]
    f32 = state.get("f32", {})
    if all(ds in f32 for ds in DATASETS):
        lines.append(
            "| F32 (convert_hf_to_gguf) | – | – | " + " | ".join(f"{f32[ds]['ppl']:.3f} | 0" for ds in DATASETS) + " |"
        )
    for row in [*LLAMA, *OURS]:
        cells = _cells(state, row)
        if not cells:
            continue
        lines.append(
            f"| {LABEL[row]} | {len(cells)} | {cells[0]['tensor_bytes']} | "
            + " | ".join(
                f"{_spread([c[ds]['ppl'] for c in cells], 3)} | {_spread([c[ds]['kl'] for c in cells], 4)}"
                for ds in DATASETS
            )
            + " |"
        )
    lines += [
        "",
        f"Goal: KL ≤ {GOAL} × llama.cpp's plain Q4_0's, and below Q4_0 + imatrix's. Ratios per seed (in "
        "seed order), then their mean ± spread; met when every seed meets it, missed when none does, else a "
        "tie.",
        "",
        "| ours | against | goal | " + " | ".join(f"{n} KL ratio" for n in DATASETS.values()) + " | verdict |",
        "|---" * (4 + len(DATASETS)) + "|",
    ]
    for row in OURS:
        for ref, goal, strict in (("llama:Q4_0", GOAL, False), ("llama:Q4_0+im", 1.0, True)):
            ratios = {ds: _ratios(state, row, ref, ds) for ds in DATASETS}
            if not any(ratios.values()):
                continue
            cols = [f"{' / '.join(f'{r:.3f}' for r in v)} ({_spread(v, 3)})" if v else "–" for v in ratios.values()]
            verdict = _verdict([r for v in ratios.values() for r in v], goal, strict)
            lines.append(
                f"| {LABEL[row]} | {LABEL[ref]} | {'≤' if not strict else '<'} {goal:g}× | "
                + " | ".join(cols)
                + f" | {verdict} |"
            )
    return "\n".join(lines)


def readme_block(state: dict) -> str:
    """The README's GGUF quickstart result: `--target gguf` → Q4_0 against llama.cpp's Q4_0, seed means."""
    row = "target-gguf"
    plain, im = (_ratios(state, row, ref, "wiki") for ref in ("llama:Q4_0", "llama:Q4_0+im"))
    cells = _cells(state, row)
    if not (plain and im and cells):
        return "Not measured yet: `python -m benchmarks.gguf.default`."
    kl = [c["wiki"]["kl"] for c in cells]
    return (
        f"On SmolLM2-135M-Instruct this file's KL to the F32 model (WikiText-2, scored by llama.cpp) is "
        f"{_spread(kl, 3)} over {len(cells)} calibration seeds: {_spread(plain, 2)}× that of llama.cpp's own "
        f"Q4_0 and {_spread(im, 2)}× that of its Q4_0 with an importance matrix from the same calibration text, "
        f"in no more tensor bytes ([gguf_default](docs/results/gguf_default.md))."
    )


if __name__ == "__main__":
    sys.exit(main())
