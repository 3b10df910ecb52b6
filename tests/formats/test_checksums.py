"""Every tensor's checksum (formats/checksums.py, format v4): recorded as the formula says (checked on the files' own
bytes, parsed here by hand), verified by every reader, refusing a damaged tensor by name; older files still read."""

from __future__ import annotations

import json
import random
import shutil
import zlib
from pathlib import Path

import pytest
import torch

import matgptq
from matgptq.cli import main
from matgptq.errors import UserError
from matgptq.formats import read_checkpoint
from tests.conftest import quick_quantize


def file_tensors(path: Path) -> dict[str, tuple[str, list[int], int, int]]:
    """{name: (dtype, shape, first byte, end byte)} of a safetensors file, from its bytes (its README's layout)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    return {
        k: (v["dtype"], v["shape"], 8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1])
        for k, v in header.items()
    }


def crc_oracle(path: Path) -> dict[str, str]:
    """The documented formula on the file's bytes: CRC-32 of `DTYPE[d0,d1,...]` then the tensor's data."""
    raw, out = path.read_bytes(), {}
    for k, (dtype, shape, b, e) in file_tensors(path).items():
        descriptor = (dtype + "[" + ",".join(map(str, shape)) + "]").encode()
        out[k] = "%08x" % zlib.crc32(raw[b:e], zlib.crc32(descriptor))
    return out


def weight_files(ckpt: Path) -> list[Path]:
    return sorted(ckpt.glob("*.safetensors"))


@pytest.fixture(scope="module")
def parents(tiny_llama_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sums")
    one = quick_quantize(tiny_llama_dir, root / "one", method="matgptq", bits="3,8", group_size=32)
    sharded = quick_quantize(
        tiny_llama_dir, root / "sharded", method="matgptq", bits="3,8", group_size=32, shard_bytes=20_000
    )
    return {"one": one, "sharded": sharded, "slice": matgptq.slice(one, 3, root / "slice")}


def copy(src: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(src, tmp_path / src.name))


@pytest.mark.parametrize("kind", ["one", "sharded", "slice"])
def test_recorded_checksums_follow_the_formula_on_the_files_bytes(parents, kind):
    meta = json.loads((parents[kind] / "matgptq.json").read_text())
    assert meta["format_version"] == 4 and meta["checksums"]["algorithm"] == "crc32"
    expected = {k: v for f in weight_files(parents[kind]) for k, v in crc_oracle(f).items()}
    files = len(weight_files(parents[kind]))
    assert files > 2 if kind == "sharded" else files == 1
    assert meta["checksums"]["tensors"] == expected


def flip(path: Path, name: str, rng: random.Random) -> None:
    dtype, shape, b, e = file_tensors(path)[name]
    data = bytearray(path.read_bytes())
    at = rng.randrange(b, e)
    data[at] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("kind", ["one", "sharded"])
def test_one_flipped_bit_in_any_tensor_is_refused_naming_it(parents, tmp_path, kind):
    """Every tensor of the files, one at a time (a bit at a random place in its data): the full read and the
    layers-only read (from_pretrained's, which reads the other tensors only to check them) both name it; an
    unverified read loads."""
    rng = random.Random(0)
    where = {k: f.name for f in weight_files(parents[kind]) for k in file_tensors(f)}
    for name in sorted(where):
        d = tmp_path / name
        shutil.copytree(parents[kind], d)
        flip(d / where[name], name, rng)
        for layers_only in (False, True):
            with pytest.raises(UserError, match=f"tensor {name} does not match its checksum"):
                read_checkpoint(d, layers_only=layers_only)
        shutil.rmtree(d)


def test_swapped_tensors_are_refused_though_each_is_well_formed(parents, tmp_path):
    """Two tensors of one dtype and shape with their data ranges exchanged in the header: every structural check
    passes (the file is a valid safetensors file, every value in range); only the checksums see it."""
    d = copy(parents["one"], tmp_path)
    f = d / "model.safetensors"
    raw = f.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    a, b = "model.layers.0.self_attn.q_proj.scales", "model.layers.1.self_attn.q_proj.scales"
    header[a]["data_offsets"], header[b]["data_offsets"] = header[b]["data_offsets"], header[a]["data_offsets"]
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (n - len(text))
    assert len(text) == n
    f.write_bytes(raw[:8] + text + raw[8 + n :])
    swapped = read_checkpoint(d, verify=False).layers  # well-formed, and another model
    assert not torch.equal(
        swapped[a.removesuffix(".scales")].scales,
        read_checkpoint(parents["one"]).layers[a.removesuffix(".scales")].scales,
    )
    with pytest.raises(UserError, match=r"tensor model\.layers\.[01]\.self_attn\.q_proj\.scales does not match"):
        read_checkpoint(d)


def test_commands_refuse_a_damaged_parent_in_one_line_and_no_verify_skips(parents, tmp_path, capsys):
    d = copy(parents["one"], tmp_path)
    flip(d / "model.safetensors", "model.embed_tokens.weight", random.Random(1))
    for args in (
        ["slice", str(d), "--bits", "3", "--out", str(tmp_path / "s")],
        ["export", str(d), "--format", "gptq_v2", "--out", str(tmp_path / "g")],
        ["verify", str(d)],
    ):
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "model.embed_tokens.weight does not match its checksum" in err
    assert not (tmp_path / "s").exists() and not (tmp_path / "g").exists()
    assert main(["slice", str(d), "--bits", "3", "--out", str(tmp_path / "s"), "--no-verify"]) == 0
    with pytest.raises(UserError, match="does not match its checksum"):
        matgptq.load(d)
    model = matgptq.load(d, verify=False)  # trusted: it loads, with the damaged value
    assert not torch.equal(model.model.embed_tokens.weight, matgptq.load(parents["one"]).model.embed_tokens.weight)


def test_a_v4_record_without_its_checksums_is_refused(parents, tmp_path):
    d = copy(parents["one"], tmp_path)
    meta = json.loads((d / "matgptq.json").read_text())
    for damage in (
        {k: v for k, v in meta.items() if k != "checksums"},
        {**meta, "checksums": {"algorithm": "md5", "tensors": meta["checksums"]["tensors"]}},
        {**meta, "checksums": {"algorithm": "crc32", "tensors": {"x": "zz"}}},
    ):
        (d / "matgptq.json").write_text(json.dumps(damage))
        with pytest.raises(UserError, match="`checksums` must give every tensor's crc32"):
            read_checkpoint(d)
    sums = dict(meta["checksums"]["tensors"])
    sums["model.extra.weight"] = "00000000"  # recorded, not in the file: incomplete
    (d / "matgptq.json").write_text(json.dumps({**meta, "checksums": {"algorithm": "crc32", "tensors": sums}}))
    with pytest.raises(UserError, match="model.extra.weight is recorded in the checksums but not in the files"):
        read_checkpoint(d)


def test_older_files_still_read_and_verify_add_checksums_upgrades_them(parents, tmp_path, capsys):
    """A v3 file (as written before checksums: no `checksums`) reads as before, unverified; `matgptq verify
    --add-checksums` records them (the tensors untouched), after which damage is caught."""
    d = copy(parents["one"], tmp_path)
    meta = json.loads((d / "matgptq.json").read_text())
    old = {k: v for k, v in meta.items() if k != "checksums"} | {"format_version": 3}
    (d / "matgptq.json").write_text(json.dumps(old))
    tensors_before = (d / "model.safetensors").read_bytes()
    ref = read_checkpoint(parents["one"])
    assert {n: q.codes for n, q in read_checkpoint(d).layers.items()}.keys() == ref.layers.keys()
    assert main(["verify", str(d)]) == 0 and "records no checksums" in capsys.readouterr().out
    assert main(["verify", str(d), "--add-checksums"]) == 0
    assert json.loads((d / "matgptq.json").read_text()) == meta  # the very record the writer makes
    assert (d / "model.safetensors").read_bytes() == tensors_before
    assert main(["verify", str(d), "--add-checksums"]) == 2  # already there
    capsys.readouterr()
    assert main(["verify", str(d)]) == 0 and "matches its checksum" in capsys.readouterr().out
    flip(d / "model.safetensors", "model.norm.weight", random.Random(2))
    with pytest.raises(UserError, match="model.norm.weight does not match its checksum"):
        read_checkpoint(d)
