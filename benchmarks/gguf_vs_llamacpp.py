#!/usr/bin/env python
"""GPTQ / MatGPTQ 4-bit slices exported to GGUF Q4_0 vs llama.cpp's own quantizer, all scored by llama.cpp.

Protocol (the project's reference protocol): calibration = 128 windows × 256 tokens, seed 0, from the last 40% of the
TinyStories text; evaluation = the first 60%, its first 40,000 tokens cut into non-overlapping 256-token windows.
Every GGUF file (our exports, llama.cpp's Q4_0 and Q4_K_M made by `llama_model_quantize` from the F32 GGUF we export)
is run by llama.cpp (llama-cpp-python); perplexity and KL(F32 GGUF ‖ file) use llama.cpp's logits only. The same
numbers from matgptq.load (transformers, fp32) are printed beside them as a cross-check.

stories260K's down_proj has in_features 172 (not a multiple of 32), so no GGUF block type holds it: llama.cpp's Q4_0
falls back to F16 there and keeps token_embd (tied output) at Q8_0. Our exports match that (`float_type="f16"`,
`embed_type="q8_0"`): every other layer is the bit-exact Q4_0 of the GPTQ/MatGPTQ 4-bit codes with group size 32
(one Q4_0 block per group, so the group scales cost nothing extra). The down_proj F16 holds the *quantized* weights
(dequantized 4-bit) in ours but the original weights in llama.cpp's; the "mix" row slices down_proj at 8 bits from
the MatGPTQ parent instead (same F16 bytes).

Set-ups (--variants): "default" is the project's symmetric grid; "q4grid" adds `--signed-scale` (llama.cpp's Q4_0
grid: scale = −m/8 with m the group's largest-magnitude weight, sign kept, so m is exactly code 0 and all 16 levels
are used; the default symmetric grid 2·max|w|/15 clips the largest positive weight) with act-order, static groups and
MSE; "q4grid-fpdown" additionally leaves down_proj unquantized (`--skip mlp.down_proj`): no GGUF block type holds
172-column rows, so llama.cpp keeps down_proj's original weights at F16, and so do we then.

Writes docs/results/gguf_vs_llamacpp.json and, rendered from it alone, docs/results/gguf_vs_llamacpp.md
(`python -m benchmarks.render_docs` re-renders it). Run with the interop venv (llama-cpp-python + matgptq):
    python -m benchmarks.gguf_vs_llamacpp [--out-json docs/results/gguf_vs_llamacpp.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from benchmarks._harness import RESULTS, header, load_json, write_page
from benchmarks.llamacpp_python import gguf_types, llama_quantize, score_llamacpp, stderr_to, type_summary

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def hf_scores(model_dir: Path, bits, windows, teacher) -> tuple[float, float]:
    import matgptq
    from matgptq.evaluation.perplexity import score

    s = score(matgptq.load(model_dir, bits=bits, dtype=torch.float32), windows, teacher)
    return s.ppl, s.kl


def build_parser() -> argparse.ArgumentParser:
    """The command line: model and text, work dir, output JSON, quantizer set-ups and evaluation sizes."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=SHARED / "models" / "stories260K")
    ap.add_argument("--text", type=Path, default=SHARED / "data" / "tinystories" / "tinystories_val_head.txt")
    ap.add_argument("--workdir", type=Path, help="keep checkpoints and GGUF files here (default: a temp dir)")
    ap.add_argument("--out-json", type=Path, default=RESULTS / "gguf_vs_llamacpp.json",
                    help="write all numbers as JSON here, and the page rendered from it beside it (.md)")
    ap.add_argument("--render-only", action="store_true", help="only re-render the page from --out-json")
    ap.add_argument("--group-size", type=int, default=32)
    ap.add_argument("--matgptq-bits", default="3,4,8", help="MatGPTQ target set R (master = max)")
    ap.add_argument("--variants", default="default,q4grid,q4grid-fpdown",
                    help="comma list of quantizer set-ups: default (the project's grid), q4grid (--signed-scale "
                         "+ act-order/static groups + MSE), q4grid-fpdown (same + --skip mlp.down_proj)")
    ap.add_argument("--nsamples", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=40000)
    ap.add_argument("--threads", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)),
                    help="llama.cpp threads (fewer than idle cores: its threads spin and crawl when oversubscribed)")
    ap.add_argument("--reuse", action="store_true", help="reuse checkpoints already in --workdir (same settings!)")
    return ap


@dataclass
class References:
    """The F32 model's scores and outputs every file is compared with, from llama.cpp and from HF."""

    ppl_f32: float  # llama.cpp on the F32 GGUF
    ref_cpp: list[np.ndarray]  # its per-window log-probs (KL reference)
    ref_hf: object  # matgptq Teacher of the HF fp32 model
    ppl_hf_fp: float  # HF fp32 perplexity


def eval_windows_of(a: argparse.Namespace) -> tuple[Path, torch.Tensor]:
    """Create the work dir and cut the evaluation text (first 60%) into windows."""
    from matgptq.models.hf import load_tokenizer
    from matgptq.models.text import eval_windows, read_text, tokenize

    work = a.workdir or Path(tempfile.mkdtemp(prefix="gguf_vs_llamacpp-"))
    work.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer(a.model)
    windows = eval_windows(tokenize(tok, read_text(a.text, (0.0, 0.6))), a.seqlen, a.max_tokens)
    log(f"evaluation: {windows.shape[0]} windows × {a.seqlen} tokens; work dir {work}")
    return work, windows


def quantize_variants(a: argparse.Namespace, work: Path, error) -> dict[str, tuple[Path, object]]:
    """Quantize each --variants set-up with GPTQ and MatGPTQ; the Q4_0 exports to make, label -> (checkpoint, bits)."""
    import matgptq

    base = dict(calib=a.text, calib_range=(0.6, 1.0), nsamples=a.nsamples, seqlen=a.seqlen, seed=0,
                group_size=a.group_size, sym=True, progress=False, overwrite=True)  # fmt: skip
    tuned = dict(base, act_order=True, static_groups=True, mse=True)
    n_layers = json.loads((a.model / "config.json").read_text())["num_hidden_layers"]
    mix = {"*": 4, **{f"model.layers.{i}.mlp.down_proj": 8 for i in range(n_layers)}}
    variants = {  # name: (label, quantize options, Q4_0 grid, keep down_proj unquantized, MatGPTQ R)
        "default": ("project grid", base, False, False, a.matgptq_bits),
        "q4grid": ("--signed-scale --act-order --static-groups --mse", tuned, True, False, "4,8"),
        "q4grid-fpdown": ("same + --skip mlp.down_proj", tuned, True, True, "4,8"),
    }
    exports: dict[str, tuple[Path, object]] = {}
    for name in [v.strip() for v in a.variants.split(",") if v.strip()]:
        if name not in variants:
            error(f"unknown variant {name}; choose from {', '.join(variants)}")
        tag, opts, grid, fpdown, mat_bits = variants[name]
        for method, bits in (("gptq", 4), ("matgptq", mat_bits)):
            out = work / f"{method}-{name}"
            t0 = time.time()
            if a.reuse and (out / "matgptq.json").is_file():
                log(f"{method} {bits} g{a.group_size} {tag}: reusing {out}")
            else:
                options = dict(opts, signed_scale=grid, skip=(r"mlp\.down_proj$",) if fpdown else ())
                matgptq.quantize(a.model, out, method=method, bits=bits, **options)
                log(f"{method} {bits} g{a.group_size} {tag}: {time.time() - t0:.1f}s")
            if method == "gptq":
                exports[f"GPTQ-4 ({tag}) → Q4_0"] = (out, 4)
                continue
            exports[f"MatGPTQ[{bits}] 4-bit slice ({tag}) → Q4_0"] = (out, 4)
            if not fpdown:
                exports[f"MatGPTQ[{bits}] 4-bit, down_proj 8-bit slice ({tag}) → Q4_0"] = (out, mix)
    return exports


def make_gguf_files(a: argparse.Namespace, work: Path, exports: dict[str, tuple[Path, object]]) -> dict[str, dict]:
    """Write the F32 GGUF, llama.cpp's Q4_0 and Q4_K_M of it, and our Q4_0 exports; label -> path and provenance."""
    from matgptq.exporters.gguf import export_gguf

    files: dict[str, dict] = {}
    f32 = work / "f32.gguf"
    export_gguf(a.model, f32, overwrite=True)
    files["F32 (matgptq export of fp32)"] = {"path": f32, "source": "fp32", "hf": (a.model, None)}
    for name in ("Q4_0", "Q4_K_M"):
        dst = work / f"llamacpp-{name}.gguf"
        t0 = time.time()
        with stderr_to(work / f"llama_quantize-{name}.log"):
            llama_quantize(f32, dst, name, a.threads)
        log(f"llama.cpp {name}: {time.time() - t0:.1f}s")
        files[f"llama.cpp {name}"] = {"path": dst, "source": "llama_model_quantize(F32)", "hf": None}
    for label, (ck, bits) in exports.items():
        dst = work / f"{ck.name}{'-mix' if isinstance(bits, dict) else ''}.gguf"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rep = export_gguf(ck, dst, bits=None if isinstance(bits, dict) else bits,
                              bits_config=bits if isinstance(bits, dict) else None, qtype="q4_0",
                              float_type="f16", embed_type="q8_0", overwrite=True)  # fmt: skip
        q_layers = [t for t in rep.tensors if t.bits is not None]
        files[label] = {"path": dst, "source": f"matgptq export ({ck.name})", "hf": (ck, bits),
                        "exact_layers": f"{sum(t.exact for t in q_layers)}/{len(q_layers)}",
                        "max_dw_exact_layers": max((t.max_abs_err for t in q_layers if t.method == 'codes'),
                                                   default=0.0)}  # fmt: skip
    return files


def token_embd_identical(files: dict[str, dict], exports: dict[str, tuple[Path, object]]) -> bool:
    """Whether our first export's Q8_0 token_embd has the same bytes as llama.cpp's Q4_0 file's."""
    # Our Q8_0 token_embd is gguf-py's port of ggml's quantize_row_q8_0: compare bytes with llama.cpp's own file.
    import gguf

    def tensor_bytes(path: Path, name: str) -> bytes:
        """The raw data of tensor `name` in the GGUF file `path`."""
        return next(np.asarray(t.data).tobytes() for t in gguf.GGUFReader(str(path)).tensors if t.name == name)

    return tensor_bytes(files["llama.cpp Q4_0"]["path"], "token_embd.weight") == tensor_bytes(
        files[next(iter(exports))]["path"], "token_embd.weight")  # fmt: skip


def score_references(model: Path, f32: Path, windows: torch.Tensor, threads: int) -> References:
    """Score the F32 GGUF with llama.cpp and the fp32 model with HF: the references of every KL."""
    from matgptq.evaluation.perplexity import Teacher, perplexity
    from matgptq.models.hf import load_fp_model

    t0 = time.time()
    ppl_f32, _, ref_cpp = score_llamacpp(f32, windows, None, threads)
    log(f"llama.cpp F32 reference: ppl {ppl_f32:.4f} ({time.time() - t0:.1f}s)")
    fp = load_fp_model(model, torch.float32)
    ref_hf = Teacher(fp, windows)
    ppl_hf_fp = perplexity(fp, windows)
    del fp
    return References(ppl_f32, ref_cpp, ref_hf, ppl_hf_fp)


def score_file(label: str, info: dict, refs: References, windows: torch.Tensor, threads: int) -> dict:
    """One file's row: llama.cpp's ppl and KL, the HF cross-check, its tensor types and size."""
    t0 = time.time()
    if label.startswith("F32"):
        ppl, kl = refs.ppl_f32, 0.0
    else:
        ppl, kl, _ = score_llamacpp(info["path"], windows, refs.ref_cpp, threads)
    hf_ppl = hf_kl = None
    if info["hf"] is not None:
        src, bits = info["hf"]
        hf_ppl, hf_kl = (refs.ppl_hf_fp, 0.0) if bits is None else hf_scores(src, bits, windows, refs.ref_hf)
    types = gguf_types(info["path"])
    size = info["path"].stat().st_size
    row = {"file": str(info["path"]), "source": info["source"], "size_bytes": size,
           "types": types, "types_summary": type_summary(types), "ppl_llamacpp": ppl,
           "kl_llamacpp": kl, "ppl_hf": hf_ppl, "kl_hf": hf_kl,
           **{k: info[k] for k in ("exact_layers", "max_dw_exact_layers") if k in info}}  # fmt: skip
    log(f"{label}: ppl {ppl:.4f} KL {kl:.5f} ({time.time() - t0:.1f}s)")
    return row


def score_files(files: dict[str, dict], refs: References, windows: torch.Tensor, threads: int) -> dict[str, dict]:
    """Score every file in order, then each one's KL as a multiple of llama.cpp Q4_0's."""
    results = {label: score_file(label, info, refs, windows, threads) for label, info in files.items()}
    base_kl = results["llama.cpp Q4_0"]["kl_llamacpp"]
    for r in results.values():
        r["kl_vs_llamacpp_q4_0"] = r["kl_llamacpp"] / base_kl if base_kl else None
    return results


def write_json(a: argparse.Namespace, windows: torch.Tensor, refs: References, same_embd: bool, results: dict,
               t_start: float) -> None:
    """Write the protocol, the references and every file's row to --out-json."""
    data = {
        "protocol": {"model": str(a.model), "text": str(a.text), "calibration": "128x256 from last 40%, seed 0",
                     "evaluation": f"first 60%, first {a.max_tokens} tokens, {windows.shape[0]}x{a.seqlen}",
                     "group_size": a.group_size, "matgptq_bits": a.matgptq_bits, "nsamples": a.nsamples,
                     "variants": a.variants},
        "ppl_f32_llamacpp": refs.ppl_f32, "ppl_fp32_hf": refs.ppl_hf_fp, "token_embd_q8_0_identical": same_embd,
        "results": results, "seconds": time.time() - t_start,
    }  # fmt: skip
    a.out_json.parent.mkdir(parents=True, exist_ok=True)
    a.out_json.write_text(json.dumps(data, indent=2, default=str))


def main(argv: list[str] | None = None) -> int:
    """Quantize, export and score every file, write the JSON and print the page rendered from it."""
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.render_only:
        return publish(a.out_json)

    t_start = time.time()
    work, windows = eval_windows_of(a)
    exports = quantize_variants(a, work, ap.error)
    files = make_gguf_files(a, work, exports)
    same_embd = token_embd_identical(files, exports)
    refs = score_references(a.model, files["F32 (matgptq export of fp32)"]["path"], windows, a.threads)
    results = score_files(files, refs, windows, a.threads)
    write_json(a, windows, refs, same_embd, results, t_start)
    return publish(a.out_json)


def publish(out_json: Path) -> int:
    """The page of `out_json` beside it (.md)."""
    text = page(load_json(out_json))
    write_page(out_json.with_suffix(".md"), text)
    print(text)
    return 0


def page(data: dict) -> str:
    """docs/results/gguf_vs_llamacpp.md from its JSON: every file's size, types and scores, and the goal ratios."""
    from matgptq.execution import format_table

    results, proto = data["results"], data["protocol"]
    rows = [[label, r["size_bytes"], r["types_summary"], r.get("exact_layers"), r["ppl_llamacpp"], r["kl_llamacpp"],
             r["kl_vs_llamacpp_q4_0"], r["ppl_hf"], r["kl_hf"]] for label, r in results.items()]  # fmt: skip
    table = format_table(["GGUF", "bytes", "tensor types (excl. norms)", "bit-exact layers", "ppl (llama.cpp)",
                          "KL (llama.cpp)", "KL / llama.cpp Q4_0", "ppl (HF fp32)", "KL (HF fp32)"], rows)  # fmt: skip
    windows = proto["evaluation"].rsplit(", ", 1)[-1].replace("x", "×")  # "156x256": windows x tokens
    ours = {k: v["kl_vs_llamacpp_q4_0"] for k, v in results.items() if not k.startswith(("F32", "llama.cpp"))}
    return "\n".join([
        header("benchmarks/gguf_vs_llamacpp.py", "gguf_vs_llamacpp.json"),
        "# GGUF Q4_0 exports of stories260K vs llama.cpp's own quantizer",
        "",
        f"{Path(proto['model']).name}, group size {proto['group_size']}, MatGPTQ R = {{{proto['matgptq_bits']}}}; "
        f"calibration {proto['calibration']} of {Path(proto['text']).name}; evaluation {proto['evaluation']} tokens. "
        "Every file is run by llama.cpp (llama-cpp-python); the HF columns are matgptq.load of the same checkpoint "
        "(transformers, fp32) as a cross-check.",
        "",
        table,
        "",
        f"KL(F32 GGUF ‖ file) and perplexity from llama.cpp logits on {windows} tokens; HF columns: matgptq.load of "
        f"the same checkpoint, KL to the HF fp32 model (ppl {data['ppl_fp32_hf']:.4f}). token_embd Q8_0 bytes "
        f"identical to llama.cpp's: {data['token_embd_q8_0_identical']}.",
        "",
        "Goal: KL ≤ 0.7 × llama.cpp Q4_0's (KL ours ÷ llama.cpp Q4_0's):",
        "",
        *[f"- {k}: {v:.3f} {'✓' if v <= 0.7 else '✗'}" for k, v in ours.items()],
        "",
    ])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
