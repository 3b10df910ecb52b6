"""Damaged files get one clear line, never a traceback: every reader is fuzzed, and the named cases feed the docs.

Readers: the matgptq parent/slice (`matgptq.load(parent, bits=r)`), a GPTQ checkpoint (`matgptq.load(dir)`), a plain
Hugging Face model directory (`matgptq.load(dir)` and its tokenizer) and mix files (`--bits mix.json`). The property,
for every damage hypothesis draws (truncation at any offset, byte flips in safetensors headers and JSON, dropped /
renamed / reshaped / retyped tensors, JSON values replaced by out-of-range or ill-typed ones): the reader either works
(the damage was harmless) or raises `UserError` with a one-line message — never another exception, never a hang.
The CLI cases below also check exit status 2, one line on stderr and no output written; each records its message, and
`benchmarks/robustness/bad_input.py` renders them into docs/results/bad_input.md.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import matgptq
from matgptq.cli import main
from matgptq.errors import UserError
from matgptq.exporters.gptq import export_gptq
from matgptq.models import load_tokenizer
from tests.conftest import TINYSTORIES, quick_quantize

# 20 draws per reader and damage kind in CI (~1 min); MATGPTQ_FUZZ_EXAMPLES=500 for a longer hunt.
SETTINGS = settings(
    max_examples=int(os.environ.get("MATGPTQ_FUZZ_EXAMPLES", 20)),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
HANG_SECONDS = 120  # a tiny model loads in < 1 s; anything near this is a hang


@contextmanager
def no_hang(seconds: int = HANG_SECONDS):
    def fail(*_):
        raise AssertionError(f"a reader ran longer than {seconds} s on a damaged file")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def sources(tiny_llama_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("damage")
    parent = quick_quantize(
        tiny_llama_dir,
        root / "parent",
        method="matgptq",
        bits="3,4,8",
        group_size=32,
        act_order=True,
        static_groups=False,
    )
    gptq = export_gptq(parent, root / "gptq", "gptq_v2", bits=4)
    return {"parent": parent, "gptq": gptq, "hf": tiny_llama_dir}


def read_parent(d: Path):
    matgptq.load(d, bits=4)


def read_gptq(d: Path):
    matgptq.load(d)


def read_hf(d: Path):
    matgptq.load(d)
    load_tokenizer(d)


READERS = {"parent": read_parent, "gptq": read_gptq, "hf": read_hf}
FILES = {
    "parent": ["model.safetensors", "matgptq.json", "config.json"],
    "gptq": ["model.safetensors", "config.json", "quantize_config.json"],
    "hf": ["model.safetensors", "config.json", "tokenizer.json"],
}


def holds(read, d: Path) -> None:
    """The property: works, or one UserError line."""
    with no_hang():
        try:
            read(d)
        except UserError as e:
            assert str(e) and "\n" not in str(e), repr(str(e))


def copy(sources, kind, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("case") / kind
    shutil.copytree(sources[kind], d)
    return d


# --- fuzzing -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", READERS)
@SETTINGS
@given(data=st.data())
def test_truncated_anywhere(sources, tmp_path_factory, kind, data):
    d = copy(sources, kind, tmp_path_factory)
    f = d / data.draw(st.sampled_from(FILES[kind]))
    raw = f.read_bytes()
    f.write_bytes(raw[: data.draw(st.integers(0, len(raw) - 1))])
    holds(READERS[kind], d)


def _header_end(raw: bytes) -> int:
    return 8 + struct.unpack("<Q", raw[:8])[0]


@pytest.mark.parametrize("kind", READERS)
@SETTINGS
@given(data=st.data())
def test_byte_flips_in_headers_and_metadata(sources, tmp_path_factory, kind, data):
    d = copy(sources, kind, tmp_path_factory)
    f = d / data.draw(st.sampled_from(FILES[kind]))
    raw = bytearray(f.read_bytes())
    end = _header_end(raw) if f.suffix == ".safetensors" else len(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        raw[data.draw(st.integers(0, end - 1))] ^= data.draw(st.integers(1, 255))
    f.write_bytes(bytes(raw))
    holds(READERS[kind], d)


TENSOR_OPS = ("drop", "rename", "reshape", "retype", "transpose")


def _damage_tensor(t: torch.Tensor, op: str) -> torch.Tensor:
    if op == "reshape":
        return t.reshape(-1)[: max(1, t.numel() - 1)].clone()
    if op == "transpose":
        return t.T.contiguous() if t.dim() == 2 else t.unsqueeze(0).clone()
    return t.to(torch.float32 if not t.is_floating_point() else torch.int64)  # retype


@pytest.mark.parametrize("kind", READERS)
@SETTINGS
@given(data=st.data())
def test_dropped_renamed_reshaped_retyped_tensors(sources, tmp_path_factory, kind, data):
    d = copy(sources, kind, tmp_path_factory)
    tensors = load_file(str(d / "model.safetensors"))
    key = data.draw(st.sampled_from(sorted(tensors)))
    op = data.draw(st.sampled_from(TENSOR_OPS))
    t = tensors.pop(key)
    if op == "rename":
        tensors[key + "_renamed"] = t
    elif op != "drop":
        tensors[key] = _damage_tensor(t, op)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    holds(READERS[kind], d)


JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.integers(-3, 12),
    st.floats(allow_nan=True),
    st.text(max_size=4),
    st.lists(st.integers(-2, 9), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
JSON_FILES = {
    "parent": ["matgptq.json", "config.json"],
    "gptq": ["config.json", "quantize_config.json"],
    "hf": ["config.json"],
}


def _json_paths(obj, prefix=()):
    """Every (key path) of a JSON object down to depth 3: the places a value can be replaced."""
    if isinstance(obj, dict) and len(prefix) < 3:
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _json_paths(v, prefix + (k,))
    elif isinstance(obj, list) and len(prefix) < 3:
        for i, v in enumerate(obj[:4]):
            yield prefix + (i,)
            yield from _json_paths(v, prefix + (i,))


@pytest.mark.parametrize("kind", READERS)
@SETTINGS
@given(data=st.data())
def test_out_of_range_or_ill_typed_metadata(sources, tmp_path_factory, kind, data):
    d = copy(sources, kind, tmp_path_factory)
    f = d / data.draw(st.sampled_from(JSON_FILES[kind]))
    meta = json.loads(f.read_text())
    path = data.draw(st.sampled_from(sorted(_json_paths(meta), key=str)))
    node = meta
    for k in path[:-1]:
        node = node[k]
    if data.draw(st.booleans(), label="delete") and isinstance(node, dict):
        del node[path[-1]]
    else:
        node[path[-1]] = data.draw(JSON_VALUES)
    f.write_text(json.dumps(meta))
    holds(READERS[kind], d)


@SETTINGS
@given(mix=st.one_of(JSON_VALUES, st.dictionaries(st.text(max_size=40), JSON_VALUES, max_size=3)))
def test_mix_files(sources, tmp_path_factory, mix):
    f = tmp_path_factory.mktemp("mix") / "mix.json"
    f.write_text(json.dumps(mix))
    holds(lambda d: matgptq.load(sources["parent"], bits=str(f)), f)


# --- named cases through the CLI: exit 2, one line, nothing written; their messages make docs/results/bad_input.md -


def _truncate(name, frac=0.5):
    def damage(d: Path):
        raw = (d / name).read_bytes()
        (d / name).write_bytes(raw[: int(len(raw) * frac)])

    return damage


def _edit_json(name, key, value):
    def damage(d: Path):
        meta = json.loads((d / name).read_text())
        node = meta
        for k in key[:-1]:
            node = node[k]
        node[key[-1]] = value
        (d / name).write_text(json.dumps(meta))

    return damage


def _edit_tensor(suffix, fn):
    def damage(d: Path):
        tensors = load_file(str(d / "model.safetensors"))
        key = next(k for k in sorted(tensors) if k.endswith(suffix))
        value = fn(tensors.pop(key))
        if value is not None:
            tensors[key] = value
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})

    return damage


def _write(name, text):
    def damage(d: Path):
        (d / name).write_text(text)

    return damage


LAYER = "model.layers.0.mlp.down_proj"
CASES = [  # (id, source, damage, command after the source path; OUT is the output path)
    ("hf-truncated-weights", "hf", _truncate("model.safetensors"), ["quantize", "--out", "OUT", "--calib", "CALIB"]),
    ("hf-config-not-json", "hf", _write("config.json", "{not json"), ["quantize", "--out", "OUT", "--calib", "CALIB"]),
    (
        "hf-config-bad-size",
        "hf",
        _edit_json("config.json", ("hidden_size",), -64),
        ["quantize", "--out", "OUT", "--calib", "CALIB"],
    ),
    ("hf-tokenizer-truncated", "hf", _truncate("tokenizer.json"), ["quantize", "--out", "OUT", "--calib", "CALIB"]),
    (
        "parent-truncated-weights (eval)",
        "parent",
        _truncate("model.safetensors"),
        ["eval", "--bits", "4", "--text", "CALIB"],
    ),
    (
        "parent-truncated-weights (export)",
        "parent",
        _truncate("model.safetensors"),
        ["export", "--format", "gptq_v2", "--bits", "4", "--out", "OUT"],
    ),
    (
        "parent-missing-g_idx",
        "parent",
        _edit_tensor(f"{LAYER}.g_idx", lambda t: None),
        ["eval", "--bits", "4", "--text", "CALIB"],
    ),
    (
        "parent-scales-retyped",
        "parent",
        _edit_tensor(".scales", lambda t: t.float()),
        ["slice", "--bits", "3", "--out", "OUT"],
    ),
    (
        "parent-g_idx-out-of-range",
        "parent",
        _edit_tensor(".g_idx", lambda t: t + 100),
        ["slice", "--bits", "3", "--out", "OUT"],
    ),
    (
        "parent-perm-not-a-permutation",
        "parent",
        _edit_tensor(".perm", torch.zeros_like),
        ["slice", "--bits", "3", "--out", "OUT"],
    ),
    (
        "parent-stored-bits-out-of-range",
        "parent",
        _edit_json("matgptq.json", ("stored_bits",), 99),
        ["export", "--format", "gguf", "--bits", "4", "--out", "OUT.gguf"],
    ),
    (
        "parent-layer-shape-mismatch",
        "parent",
        _edit_json("matgptq.json", ("layers", f"{LAYER}"), [64, 999]),
        ["eval", "--bits", "4", "--text", "CALIB"],
    ),
    (
        "parent-newer-format",
        "parent",
        _edit_json("matgptq.json", ("format_version",), 99),
        ["eval", "--bits", "4", "--text", "CALIB"],
    ),
    (
        "parent-config-other-size",
        "parent",
        _edit_json("config.json", ("intermediate_size",), 96),
        ["eval", "--bits", "4", "--text", "CALIB"],
    ),
    ("gptq-missing-scales", "gptq", _edit_tensor(f"{LAYER}.scales", lambda t: None), ["eval", "--text", "CALIB"]),
    ("gptq-bits-unsupported", "gptq", _edit_json("quantize_config.json", ("bits",), 5), ["eval", "--text", "CALIB"]),
    (
        "gptq-truncated-weights",
        "gptq",
        _truncate("model.safetensors", 0.9),
        ["export", "--format", "gguf", "--out", "OUT.gguf"],
    ),
]


@pytest.mark.parametrize("case,kind,damage,args", CASES, ids=[c[0] for c in CASES])
def test_cli_one_line_and_nothing_written(sources, tmp_path_factory, capsys, record_property, case, kind, damage, args):
    d = copy(sources, kind, tmp_path_factory)
    damage(d)
    out = d.parent / "out"
    argv = [args[0], str(d)] + [
        str(out) + a[3:] if a.startswith("OUT") else str(TINYSTORIES) if a == "CALIB" else a for a in args[1:]
    ]
    if args[0] == "eval":
        argv += ["--seqlen", "32", "--max-tokens", "64"]
    if args[0] == "quantize":
        argv += ["--nsamples", "2", "--seqlen", "32", "--quiet"]
    with no_hang():
        code = main(argv)
    err = capsys.readouterr().err
    record_property("message", err.strip())
    assert code == 2 and err.startswith("matgptq: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert sorted(p.name for p in d.parent.iterdir()) == [kind], "something was written"
