"""llama.cpp's command-line tools as the SmolLM2 GGUF benchmarks drive them (benchmarks/gguf/presets.py and
default.py): the converter's F32 file, the calibration and evaluation texts, llama-perplexity's perplexity and KL to
the F32 file, and what a GGUF file holds (read back with gguf-py). The tools are built by `make llama-cpp-tools` into
the venv."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._harness.smollm2 import DEFAULT_MODEL, SHARED, WIKI

VENV = Path(sys.prefix)
TOOLS = VENV / "llama.cpp-tools"
CONVERTER = VENV / "llama.cpp" / "convert_hf_to_gguf.py"
TINYSTORIES = SHARED / "data" / "tinystories" / "tinystories_val_head.txt"
__all__ = ["DEFAULT_MODEL", "TOOLS", "WIKI", "calib_text", "f32_gguf", "file_info", "log", "run", "score"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], logfile: Path, env: dict | None = None) -> str:
    """Run a tool, its output to `logfile`; a failure ends the script with the log's last lines."""
    log(" ".join(str(c) for c in cmd))
    with open(logfile, "w") as f:
        rc = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    text = logfile.read_text(errors="replace")
    if rc != 0:
        sys.exit(f"llama.cpp: error: {cmd[0]} failed ({rc}), see {logfile}:\n" + "\n".join(text.splitlines()[-8:]))
    return text


def f32_gguf(model: Path, work: Path) -> Path:
    """llama.cpp's converter on the HF model. SmolLM2's config.json (as `make real-model` writes it) has no
    `architectures` entry, which the converter keys on: it reads a copy (symlinks + config with LlamaForCausalLM)."""
    out = work / "f32.gguf"
    if out.is_file():
        return out
    hf = work / "hf"
    hf.mkdir(exist_ok=True)
    for f in model.iterdir():
        if f.name != "config.json" and not (hf / f.name).exists():
            (hf / f.name).symlink_to(f.resolve())
    cfg = json.loads((model / "config.json").read_text())
    cfg.setdefault("architectures", ["LlamaForCausalLM"])
    (hf / "config.json").write_text(json.dumps(cfg, indent=2))
    conv = CONVERTER.parent
    env = {**os.environ, "PYTHONPATH": f"{conv}:{conv / 'gguf-py'}"}
    run([sys.executable, CONVERTER, hf, "--outtype", "f32", "--outfile", work / "f32.tmp.gguf"], work / "f32.log", env)
    (work / "f32.tmp.gguf").replace(out)
    return out


def calib_text(model: Path, work: Path, a: argparse.Namespace) -> Path:
    """The GPTQ calibration windows decoded to text, one after another (llama-imatrix re-tokenizes and chunks it)."""
    out = work / "calib.txt"
    if not out.is_file():
        from matgptq.models import calibration_windows, load_tokenizer, read_text, tokenize

        tok = load_tokenizer(model)
        ids = calibration_windows(tokenize(tok, read_text(WIKI, (0.5, 1.0))), a.nsamples, a.seqlen, a.seed)
        out.write_text("".join(tok.decode(w, skip_special_tokens=False) for w in ids.tolist()), encoding="utf-8")
    return out


def eval_text(work: Path, ds: str) -> Path:
    out = work / f"{ds}_eval.txt"
    if not out.is_file():
        if ds == "wiki":  # the first half: never calibrated on
            t = WIKI.read_text(encoding="utf-8")
            out.write_text(t[: len(t) // 2], encoding="utf-8")
        else:
            out.write_text(TINYSTORIES.read_text(encoding="utf-8"), encoding="utf-8")
    return out


_PPL = re.compile(r"Mean PPL\(Q\)\s*:\s*([0-9.]+)\s*±\s*([0-9.]+)")
_KLD = re.compile(r"Mean\s+KLD:\s*([0-9.]+)\s*±\s*([0-9.]+)")
_TOP = re.compile(r"Same top p:\s*([0-9.]+)\s*±\s*([0-9.]+)")
_BASE_PPL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")


def score(gguf_file: Path, ds: str, work: Path, a: argparse.Namespace, logs: Path | None = None) -> dict:
    """llama-perplexity's perplexity and KL(F32 ‖ file) on `chunks` × 512 tokens of one text; the F32 file and its
    saved logits in `work`, the quantized file's log in `logs` (default `work`)."""
    chunks = a.wiki_chunks if ds == "wiki" else a.ts_chunks
    base = work / f"base-{ds}-{chunks}.kld"
    common = ["-c", "512", "-b", "512", "--chunks", str(chunks), "-t", str(a.threads)]
    if gguf_file.name == "f32.gguf" or not base.is_file():  # the F32 logits every KL is taken against
        f32, tmp = work / "f32.gguf", base.with_suffix(".tmp")
        text = run(
            [TOOLS / "llama-perplexity", "-m", f32, "-f", eval_text(work, ds), *common, "--kl-divergence-base", tmp],
            work / f"f32-{ds}.score.log",
        )
        tmp.replace(base)  # a killed run leaves no partial base behind
        m = _BASE_PPL.search(text)
        if gguf_file == f32:
            return {"ppl": float(m[1]), "ppl_se": float(m[2]), "kl": 0.0, "kl_se": 0.0, "positions": chunks * 256}
    text = run(
        [TOOLS / "llama-perplexity", "-m", gguf_file, *common, "--kl-divergence-base", base, "--kl-divergence"],
        (logs or work) / f"{gguf_file.stem}-{ds}.score.log",
    )
    p, k, top = _PPL.search(text), _KLD.search(text), _TOP.search(text)
    return {
        "ppl": float(p[1]),
        "ppl_se": float(p[2]),
        "kl": float(k[1]),
        "kl_se": float(k[2]),
        "same_top": float(top[1]),
        "positions": chunks * 256,
    }


def tensor_types(path: Path) -> dict:
    """{'ROLE:TYPE': how many tensors} of the weight matrices (norms left out), read back with gguf-py."""
    import gguf

    out: dict[str, int] = {}
    n_params = n_bytes = 0
    for t in gguf.GGUFReader(str(path)).tensors:
        n_params += int(t.n_elements)
        n_bytes += int(t.n_bytes)
        if t.name.endswith("norm.weight"):
            continue
        role = t.name.split(".")[-2] if t.name.startswith("blk.") else t.name.split(".")[0]
        key = f"{role}:{t.tensor_type.name}"
        out[key] = out.get(key, 0) + 1
    return {"types": out, "params": n_params, "tensor_bytes": n_bytes}


def file_info(path: Path) -> dict:
    """A GGUF file's bytes, bits per weight (tensor bytes · 8 / parameters) and tensor_types."""
    info = tensor_types(path)
    size = path.stat().st_size
    return {"bytes": size, "bpw": info["tensor_bytes"] * 8 / info["params"], **info}
