#!/usr/bin/env python
"""Our GGUF exports of SmolLM2-135M-Instruct against llama.cpp's own quantizer, all scored by
llama.cpp's own tools.

Protocol
  float model   llama.cpp's `convert_hf_to_gguf.py` (vendored in the pinned llama-cpp-python sdist, `make interop`)
                writes the F32 GGUF every llama.cpp preset starts from and every file is compared with
  calibration   the project's SmolLM2 protocol (benchmarks/quality/real_model_table.py): 64 windows × 512 tokens, seed 0, from
                the second half (by characters) of WikiText-2 test. GPTQ gets them as token ids; llama-imatrix gets
                the same 64 windows decoded to text (`calib.txt`, one window per 512-token chunk after llama.cpp
                re-tokenizes it; the byte-level BPE round-trips, so the tokens are the same up to chunk boundaries)
  presets       `llama-quantize F32 OUT Q4_0|Q4_K_M|Q3_K_M`, each without and with `--imatrix` (llama-imatrix on
                calib.txt, -c 512); the per-tensor types each really writes are read back with gguf-py
  ours          GPTQ, group size 32, llama.cpp's signed Q4_0/Q5_0 grid (`--signed-scale`), act-order + static groups
                + MSE scale search, exported with `matgptq export --format gguf --type auto` (bit-exact Q4_0/Q5_0;
                embeddings `auto` = Q8_0 for 576-wide rows, as every preset here has them); the "-hw" rows add
                `--mse-weighted --refit-scales`: the scale search weighted by the Hessian diagonal (the same
                statistic as llama.cpp's importance matrix) and each scale refit to its codes by least squares
  searched      one MatGPTQ [4,5,8] parent (the same options, "-hw"), and per preset a `matgptq search` for the
                per-layer widths (levels 4,5,8 → Q4_0/Q5_0/Q8_0) that fill the preset's tensor bytes (search_budget);
                a [4,5,6,8] parent with `--kquant q6_k` (ffn_down's 6-bit slice → Q6_K), searched in GGUF bytes
  re-solved     a search's knapsack mix quantized again, `quantize --method gptq --bits-config MIX` with the "-hw"
                options: every layer a dedicated GPTQ run at its width instead of the parent's slice, same GGUF types
  rows          _presets_rows.py (what is compared), _harness/llamacpp.py (what a file holds), _presets_page.py
                (the tables)
  scoring       `llama-perplexity -c 512` on the first half of WikiText-2 test (--wiki-chunks chunks) and on the
                TinyStories file (--ts-chunks chunks): the F32 file's logits are saved with --kl-divergence-base, each
                quantized file is run with --kl-divergence. llama.cpp scores the second half of every 512-token chunk
                (256 positions each), so perplexity and KL are over chunks·256 positions. Values are llama.cpp's
                "Mean PPL(Q)" and "Mean KLD" with its ± (one standard error)
  size          tensor bytes (the sum of the tensors' data, what llama.cpp's BPW counts); ours must be ≤ the
                preset's. BPW = tensor bytes · 8 / parameters (all tensors, norms included). Whole-file bytes are shown
                too: ours carry ~8 KB more metadata (matgptq.* keys), so at equal tensor bytes the file is 0.01% larger
  goal          our KL ≤ 0.7 × the preset's (the better of without/with imatrix), at ≤ its file size

Needs `make llama-cpp-tools` (llama-quantize, llama-imatrix, llama-perplexity in .venv/llama.cpp-tools) and
`make real-model`. Resumable: every finished step is kept in docs/results/gguf_vs_llamacpp_real.json (files and logits
in --work); re-running skips them, and a killed quantization continues from its last finished block (`--resume`).
Writes docs/results/gguf_vs_llamacpp_real.md (_presets_page.py, from the JSON alone: `python -m benchmarks.render_docs`).

    python -m benchmarks.gguf.presets [--threads 1] [--wiki-chunks 24] [--ts-chunks 16]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import sys
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import IO

from benchmarks._harness import child_env, load_json, write_atomic
from benchmarks._harness.llamacpp import DEFAULT_MODEL, TOOLS, WIKI, calib_text, f32_gguf, file_info, run, score
from benchmarks.gguf._presets_page import STATE, publish
from benchmarks.gguf._presets_rows import (
    CKPTS,
    DATASETS,
    EMBED_BLOCK_BYTES,
    EMBED_OF,
    GPTQ_FLAGS,
    HW,
    ISSUE_PRESETS,
    OURS,
    PRESETS,
    QUANTIZE,
    RESOLVE,
    SEARCH_OF,
)


def search_budget(f32: Path, preset_bytes: int, embed: str, kind: str) -> str:
    """The budget (bits per quantized weight, 4 decimals, rounded down) of `kind` at which a searched mix's file
    holds at most `preset_bytes` of tensors. "gguf" counts the layers' GGUF bytes; "code" counts them exactly too on
    the [4,5,8] parent: at group size 32 each level's type (Q4_0, Q5_0, Q8_0) spends the same 16/32 bits per weight on
    its float16 scales, so a layer of N·K weights at width r takes N·K·(r + 1/2)/8 bytes. The rest of our file is
    fixed: token_embd in `embed` (EMBED_BLOCK_BYTES per 32 weights) and the norms in F32 (from the F32 file)."""
    import gguf

    fixed = quantized = 0
    for t in gguf.GGUFReader(str(f32)).tensors:
        n = int(t.n_elements)
        if t.name.startswith("blk.") and not t.name.endswith("norm.weight"):
            quantized += n
        elif t.name == "token_embd.weight":
            fixed += n * EMBED_BLOCK_BYTES[embed] // 32
        else:
            fixed += 4 * n
    b = Fraction(8 * (preset_bytes - fixed), quantized) - (Fraction(1, 2) if kind == "code" else 0)
    q = math.floor(b * 10**4)
    return f"{q // 10**4}.{q % 10**4:04d}"


def settings(a: argparse.Namespace) -> dict:
    return {
        "model": str(Path(a.model).resolve()),
        "nsamples": a.nsamples,
        "seqlen": a.seqlen,
        "seed": a.seed,
        "wiki_chunks": a.wiki_chunks,
        "ts_chunks": a.ts_chunks,
        "ctx": 512,
        "gptq_flags": GPTQ_FLAGS,
    }


def build_parser() -> argparse.ArgumentParser:
    """The command line: model, work dir, threads, scored chunks, calibration size and seed, rows to compute."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="the fp32 HF model directory (make real-model)")
    p.add_argument(
        "--work",
        type=Path,
        default=Path.home() / ".cache" / "matgptq" / "gguf_vs_llamacpp_real",
        help="GGUF files, checkpoints, saved F32 logits and logs (~3 GB)",
    )
    p.add_argument("--threads", type=int, default=1, help="threads for llama.cpp's tools and GPTQ")
    p.add_argument("--wiki-chunks", type=int, default=24, help="512-token chunks of WikiText-2 scored")
    p.add_argument("--ts-chunks", type=int, default=16, help="512-token chunks of TinyStories scored")
    p.add_argument("--nsamples", type=int, default=64, help="calibration windows (GPTQ and imatrix)")
    p.add_argument("--seqlen", type=int, default=512, help="tokens per calibration window")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the calibration draw (GPTQ and imatrix); a seed other than 0 keeps its files in "
        "WORK/seedS and its results under its seed in docs/results/gguf_vs_llamacpp_real.json, and the "
        "report adds each seed's goal ratios (use --only to limit the rows)",
    )
    p.add_argument(
        "--only", default="", help="comma list of rows to compute (default all): f32, llama:PRESET[+im], gptq4…"
    )
    p.add_argument("--render-only", action="store_true", help="only re-render the page from the JSONs")
    return p


@dataclass
class Job:
    """One run: its options, its results JSON (`state`, saved after every step), work dir, and the files made so far."""

    a: argparse.Namespace
    state: dict  # this seed's run, under its seed in STATE
    work: Path | None = None
    lock: IO | None = None  # WORK/run.lock, held open (and locked) until the process ends
    only: set[str] = field(default_factory=set)  # --only's rows; empty: all
    files: dict[str, Path] = field(default_factory=dict)  # llama.cpp's files: row -> path
    budget_of: dict = field(default_factory=dict)  # (parent, preset, embed) -> search budget

    def save(self) -> None:
        """This seed's run into STATE (read again and written whole under a lock in --work: runs of other seeds may
        write it too), then the tables re-rendered."""
        with open(Path(self.a.work) / "results.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = load_json(STATE) if STATE.is_file() else {"seeds": {}}
            data["seeds"][str(self.a.seed)] = self.state
            write_atomic(STATE, json.dumps(data, indent=2))
        publish()  # seed 0's tables, and every seed's goal ratios beside them

    def want(self, name: str) -> bool:
        """Whether --only asks for this row."""
        return not self.only or name in self.only

    def score_all(self, name: str, path: Path) -> None:
        """Score a file on every dataset not yet scored, saving after each."""
        for ds in DATASETS:
            if ds not in self.state["scores"].get(name, {}):
                self.state["scores"].setdefault(name, {})[ds] = score(path, ds, self.work, self.a)
                self.save()

    def quantize(self, ckpt: Path, options: list, key: str) -> None:
        """`matgptq quantize` a checkpoint with GPTQ_FLAGS and the calibration protocol, unless it exists."""
        a, work = self.a, self.work
        if not (ckpt / "config.json").is_file():
            t0 = time.time()
            run(
                [
                    sys.executable,
                    "-m",
                    "matgptq",
                    "quantize",
                    a.model,
                    "--out",
                    ckpt,
                    *options,
                    *GPTQ_FLAGS,
                    "--calib",
                    WIKI,
                    "--calib-range",
                    "0.5:1",
                    "--nsamples",
                    str(a.nsamples),
                    "--seqlen",
                    str(a.seqlen),
                    "--seed",
                    str(a.seed),
                    "--overwrite",
                    "--resume",
                    "--quiet",
                ],
                work / f"{key}.quantize.log",
                child_env(a.threads),
            )
            self.state.setdefault("quantize_seconds", {})[key] = round(time.time() - t0, 1)


def load_job(a: argparse.Namespace) -> Job:
    """This seed's results so far (or a new state); a run with other settings there ends the script."""
    runs = load_json(STATE)["seeds"] if STATE.is_file() else {}
    state = runs.get(str(a.seed)) or {"settings": settings(a), "files": {}, "scores": {}}
    if state["settings"] != settings(a):
        sys.exit(
            f"gguf_vs_llamacpp_real: error: {STATE} holds a run of seed {a.seed} with other settings; move it "
            "away or match them"
        )
    return Job(a, state)


def check_prerequisites(a: argparse.Namespace) -> None:
    """End the script unless llama.cpp's tools and the model are there."""
    for tool in ("llama-quantize", "llama-imatrix", "llama-perplexity"):
        if not (TOOLS / tool).is_file():
            sys.exit(f"gguf_vs_llamacpp_real: error: no {TOOLS / tool}; run `make llama-cpp-tools` first")
    if not (a.model / "config.json").is_file():
        sys.exit(f"gguf_vs_llamacpp_real: error: no model at {a.model}; run `make real-model` first")


def open_work(job: Job) -> None:
    """Create and lock the seed's work dir (seed 0's F32 file and logits linked in) and read --only."""
    a = job.a
    work = a.work if a.seed == 0 else a.work / f"seed{a.seed}"
    work.mkdir(parents=True, exist_ok=True)
    lock = open(work / "run.lock", "w")  # noqa: SIM115 (held until the process ends, however it ends)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(
            f"gguf_vs_llamacpp_real: error: another run of seed {a.seed} is writing {STATE}; wait for it to end "
            "(two runs of one seed would overwrite each other's results)"
        )
    if a.seed:  # the F32 file and its saved logits do not depend on the calibration seed: seed 0's are reused
        for f in ("f32.gguf", f"base-wiki-{a.wiki_chunks}.kld", f"base-ts-{a.ts_chunks}.kld"):
            if (a.work / f).is_file() and not (work / f).exists():
                (work / f).symlink_to(a.work / f)
    job.work, job.lock = work, lock
    job.only = set(filter(None, a.only.split(",")))


def make_presets(job: Job) -> Path:
    """The F32 GGUF, the imatrix and every llama.cpp preset (each without and with it); returns the F32 file."""
    a, work, state = job.a, job.work, job.state
    f32 = f32_gguf(a.model, work)
    job.files = {"f32": f32}
    state["files"]["f32"] = file_info(f32)
    imatrix = work / "imatrix.gguf"
    if not imatrix.is_file():
        run(
            [
                TOOLS / "llama-imatrix",
                "-m",
                f32,
                "-f",
                calib_text(a.model, work, a),
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
            work / "imatrix.log",
        )
    for preset in PRESETS:
        for im in (False, True):
            name = f"llama:{preset}" + ("+im" if im else "")
            out = work / f"llama-{preset}{'-im' if im else ''}.gguf"
            if not out.is_file():
                tmp = out.with_suffix(".tmp.gguf")
                qtype, options = QUANTIZE[preset]
                run(
                    [
                        TOOLS / "llama-quantize",
                        *(["--imatrix", imatrix] if im else []),
                        *options,
                        f32,
                        tmp,
                        qtype,
                        str(a.threads),
                    ],
                    out.with_suffix(".log"),
                )
                tmp.replace(out)
            job.files[name] = out
            state["files"][name] = file_info(out)
    for name in OURS:  # files of an earlier run: read again (file_info may have grown fields)
        if (work / f"{name}.gguf").is_file():
            state["files"][name] = file_info(work / f"{name}.gguf")
    job.save()
    return f32


def search_budgets(job: Job, f32: Path) -> dict:
    """The search budget of every searched row: (parent, preset, embed) -> the preset's tensor bytes as a budget."""
    return {
        (ck, *w[1:3]): search_budget(f32, job.state["files"][f"llama:{w[1]}"]["tensor_bytes"], w[2], SEARCH_OF[ck][0])
        for ck, w, _ in OURS.values()
        if isinstance(w, tuple)
    }  # (parent, preset, embed) -> budget


def searched_mix(job: Job, name: str, ck: str, ckpt: Path, width: tuple) -> tuple[Path, list, str]:
    """Run (once per parent) `matgptq search` for a searched row; the checkpoint, export selection and embed type."""
    a, work, state, budget_of = job.a, job.work, job.state, job.budget_of
    embed, budget = width[2], budget_of[(ck, *width[1:3])]
    sdir = work / f"{ck}-search"
    if not (sdir / f"mix-{budget}.json").is_file():  # one search for every budget of this parent:
        todo = list(
            dict.fromkeys(  # one teacher, one sensitivity pass
                budget_of[(c, *w[1:3])]
                for n, (c, w, _) in OURS.items()
                if c == ck
                and isinstance(w, tuple)
                and job.want(n)
                and not (sdir / f"mix-{budget_of[(c, *w[1:3])]}.json").is_file()
            )
        )
        t0 = time.time()
        kind, levels = SEARCH_OF[ck]
        run(
            [
                sys.executable,
                "-m",
                "matgptq",
                "search",
                ckpt,
                "--budget",
                ",".join(todo),
                "--budget-kind",
                kind,
                "--levels",
                levels,
                "--calib",
                WIKI,
                "--calib-range",
                "0.5:1",
                "--seed",
                str(a.seed),
                "--out",
                sdir,
                "--resume",
                "--quiet",
                "--sensitivity",
                "probe",
            ],  # the recorded seeds' start (the default until 2026-11-28)
            work / f"{ck}.search.log",
            child_env(a.threads),
        )
        state.setdefault("search_seconds", {})[",".join(todo)] = round(time.time() - t0, 1)
    state.setdefault("search_budgets", {})[name] = budget
    # each row names its candidate; the command's own output ("bits") is the lower-KL of the two
    mix = json.loads((sdir / f"mix-{budget}.json").read_text())
    bits = mix["dp_bits"] if width[3:4] == ("dp",) else mix.get("search_bits", mix["bits"])
    (work / f"{name}.mix.json").write_text(json.dumps({"bits": bits}))
    sel = ["--bits-config", work / f"{name}.mix.json"]
    if width[4:] == (RESOLVE,):  # the mix's own checkpoint: every layer GPTQ at its width
        ckpt, sel = work / f"{name}-ckpt", []
        job.quantize(ckpt, ["--method", "gptq", "--bits-config", work / f"{name}.mix.json", *HW], name)
    return ckpt, sel, embed


def make_ours(job: Job, name: str, ck: str, width, out: Path) -> None:
    """Quantize one of our rows' checkpoint (and search its mix) and export it to `out`."""
    a, work = job.a, job.work
    ckpt = work / f"{ck}-ckpt"
    method, bits, extra = CKPTS[ck]
    job.quantize(ckpt, ["--method", method, "--bits", bits, *extra], ck)
    sel = []
    embed = EMBED_OF.get(name, "auto")
    if isinstance(width, tuple):  # (SEARCH, preset, embed[, "dp"[, RESOLVE]])
        ckpt, sel, embed = searched_mix(job, name, ck, ckpt, width)
    elif isinstance(width, dict):
        (work / f"{name}.mix.json").write_text(json.dumps({"bits": width}))
        sel = ["--bits-config", work / f"{name}.mix.json"]
    elif width is not None:
        sel = ["--bits", str(width)]
    run(
        [
            sys.executable,
            "-m",
            "matgptq",
            "export",
            ckpt,
            *sel,
            "--format",
            "gguf",
            "--type",
            "auto",
            "--embed-type",
            embed,
            "--out",
            out,
            "--overwrite",
        ],
        work / f"{name}.export.log",
        child_env(a.threads),
    )


def ours_row(job: Job, name: str, ck: str, width, vs: tuple) -> None:
    """Make one of our files if missing, check its size against the presets it is matched with, and score it."""
    out = job.work / f"{name}.gguf"
    if not out.is_file():
        make_ours(job, name, ck, width, out)
    job.state["files"][name] = file_info(out)
    job.save()
    for preset in set(vs) & set(ISSUE_PRESETS):  # a size over the preset's is a bug in the budget
        if job.state["files"][name]["tensor_bytes"] > job.state["files"][f"llama:{preset}"]["tensor_bytes"]:
            sys.exit(f"gguf_vs_llamacpp_real: error: {out} has more tensor bytes than llama.cpp's {preset}")
    job.score_all(name, out)


def main() -> int:
    """Make llama.cpp's presets and our files, score each against the F32 file, and print the tables."""
    a = build_parser().parse_args()
    job = load_job(a)
    if a.render_only:
        publish(echo=True)
        return 0
    check_prerequisites(a)
    open_work(job)
    f32 = make_presets(job)
    # in the order of the comparisons (F32 base, then each of ours followed by the presets it is matched with), so
    # a run cut short still holds whole comparisons
    job.score_all("f32", f32)
    job.budget_of = search_budgets(job, f32)
    for name, (ck, width, vs) in OURS.items():
        if job.want(name):
            ours_row(job, name, ck, width, vs)
        for preset in vs:
            for ref in (f"llama:{preset}", f"llama:{preset}+im"):
                if job.want(ref):
                    job.score_all(ref, job.files[ref])
    publish(echo=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
