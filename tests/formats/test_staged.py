"""Finished blocks written as they come (formats/staged.py) and the sharded parent layout.

The oracle for the streamed, staged checkpoint is the pipeline as it was before streaming: the whole model loaded by
transformers, every layer kept in memory, one `save_checkpoint` at the end. Both must agree byte for byte (the
file), and a checkpoint written in several shards must hold the same tensors and load, slice and export to the same
results as the one-file checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import matgptq
from matgptq.api import make_config, unquantized_tensors
from matgptq.cli import main
from matgptq.errors import UserError
from matgptq.formats import save_checkpoint
from matgptq.models import calibration_windows, load_fp_model, load_tokenizer, read_text, tokenize
from matgptq.quantization import quantize_model
from matgptq.untrusted import read_sharded
from tests.conftest import TINYSTORIES, make_tiny_llama

ARGS = dict(
    calib=TINYSTORIES,
    calib_range=(0.6, 1.0),
    method="matgptq",
    bits=(3, 4, 8),
    nsamples=8,
    seqlen=64,
    group_size=32,
    act_order=True,
    static_groups=False,
    dtype="float32",  # the reference below calibrates in float32 (auto would take bfloat16 passes on some CPUs)
    progress=False,
)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("staged") / "m", layers=3)


@pytest.fixture(scope="module")
def written(model, tmp_path_factory):
    """The same quantization three ways: streamed (the default), whole model in memory, and sharded."""
    root = tmp_path_factory.mktemp("staged-out")
    out = {k: root / k for k in ("streamed", "in_memory", "sharded")}
    matgptq.quantize(model, out["streamed"], stream=True, **ARGS)
    matgptq.quantize(model, out["in_memory"], stream=False, **ARGS)
    matgptq.quantize(model, out["sharded"], shard_bytes=40_000, **ARGS)
    return out


def _reference(model, out):
    """The pre-streaming path: whole model, layers kept in memory, one save_checkpoint."""
    cfg = make_config(ARGS["method"], ARGS["bits"], group_size=32, act_order=True, static_groups=False)
    tokens = tokenize(load_tokenizer(model), read_text(TINYSTORIES, ARGS["calib_range"]))
    windows = calibration_windows(tokens, ARGS["nsamples"], ARGS["seqlen"], 0)
    fp = load_fp_model(model)
    layers, _, _ = quantize_model(fp, windows, cfg, progress=False)
    save_checkpoint(out, fp.config.to_dict(), unquantized_tensors(fp, layers), layers, {}, model)
    return out


def _header_and_data(path):
    """A safetensors file as (its JSON header parsed, its data bytes): safetensors writes the `__metadata__` map
    in Rust HashMap order, which varies from call to call, so the raw header bytes are not comparable."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def test_streamed_checkpoint_is_byte_identical_to_the_in_memory_one(model, written, tmp_path):
    ref = _reference(model, tmp_path / "ref")
    want = _header_and_data(ref / "model.safetensors")
    for kind in ("streamed", "in_memory"):
        assert _header_and_data(written[kind] / "model.safetensors") == want, kind
        meta, ref_meta = (json.loads((d / "matgptq.json").read_text()) for d in (written[kind], ref))
        assert meta["layers"] == ref_meta["layers"] and list(meta["layers"]) == list(ref_meta["layers"])
        assert meta["checksums"] == ref_meta["checksums"] and ".scales.3" in str(meta["checksums"])  # per-width


def test_sharded_checkpoint_holds_the_same_tensors(written):
    shards = sorted(p.name for p in written["sharded"].glob("*.safetensors"))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((written["sharded"] / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    for shard in shards[1:]:  # each holds whole blocks: at most 40,000 bytes or one block
        assert (written["sharded"] / shard).stat().st_size < 2 * 40_000
    one = load_file(str(written["streamed"] / "model.safetensors"))
    many = read_sharded(written["sharded"] / "model.safetensors.index.json")
    assert sorted(one) == sorted(many)
    assert all(torch.equal(one[k], many[k]) for k in one)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in one.values())


def test_sharded_parent_loads_slices_and_exports_like_the_one_file_parent(written, tmp_path):
    one, many = written["streamed"], written["sharded"]
    ids = torch.randint(0, 512, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for bits in (3, 8):
            assert torch.equal(matgptq.load(one, bits=bits)(ids).logits, matgptq.load(many, bits=bits)(ids).logits)
    for d, tag in ((one, "one"), (many, "many")):
        assert main(["slice", str(d), "--bits", "4", "--out", str(tmp_path / f"slice-{tag}")]) == 0
        assert (
            main(["export", str(d), "--format", "gptq_v1", "--bits", "3", "--out", str(tmp_path / f"gptq-{tag}")]) == 0
        )
    for kind in ("slice", "gptq"):
        a, b = (load_file(str(tmp_path / f"{kind}-{t}" / "model.safetensors")) for t in ("one", "many"))
        assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a), kind


def _index(path, weight_map):
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.mark.parametrize("damage", ["moved", "outside", "missing_file"])
def test_damaged_shard_index_is_one_error(written, tmp_path, damage):
    d = tmp_path / "copy"
    d.mkdir()
    index = json.loads((written["sharded"] / "model.safetensors.index.json").read_text())["weight_map"]
    for f in set(index.values()):
        (d / f).write_bytes((written["sharded"] / f).read_bytes())
    name, file = next(iter(index.items()))
    if damage == "moved":  # the index maps a tensor to a shard that does not hold it
        other = next(f for f in index.values() if f != file)
        index[name] = other
    elif damage == "outside":
        index[name] = "../elsewhere.safetensors"
    else:
        (d / file).unlink()
    _index(d, index)
    with pytest.raises(UserError, match="safetensors"):
        read_sharded(d / "model.safetensors.index.json")


def test_shard_size_must_be_positive(model, tmp_path):
    with pytest.raises(UserError, match="--shard-size"):
        matgptq.quantize(model, tmp_path / "o", shard_bytes=0, **ARGS)
    assert not (tmp_path / "o").exists()


def test_stream_required_but_impossible_is_refused(tmp_path):
    path = make_tiny_llama(tmp_path / "m")
    tensors = load_file(str(path / "model.safetensors"))
    tensors["renamed.q_proj"] = tensors.pop("model.layers.0.self_attn.q_proj.weight")
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match="cannot be streamed"):
        matgptq.quantize(path, tmp_path / "o", stream=True, **ARGS)
    assert not (tmp_path / "o").exists()
    # loaded whole instead, transformers would leave the missing q_proj randomly initialised: refused too
    with pytest.raises(UserError, match="has no tensor model.layers.0.self_attn.q_proj.weight"):
        matgptq.quantize(path, tmp_path / "new" / "o", **ARGS)
    assert not (tmp_path / "new").exists() or not list((tmp_path / "new").iterdir())  # no staging left behind
