"""Checkpoint write/read round trips bit-exactly; atomic writes (formats/parent.py)."""

import json
from pathlib import Path

import pytest
import torch

from matgptq.errors import UserError
from matgptq.formats.parent import read_checkpoint, save_checkpoint
from matgptq.formats.quantized import QuantizedWeight


def _weight(bits, act_order):
    gen = torch.Generator().manual_seed(bits)
    perm = torch.randperm(40, generator=gen) if act_order else None
    return QuantizedWeight(
        codes=torch.randint(0, 2**bits, (12, 40), generator=gen, dtype=torch.uint8),
        scales=torch.rand(12, 3, generator=gen).half(),
        zeros=torch.randint(0, 2**bits, (12, 3), generator=gen, dtype=torch.uint8),
        g_idx=torch.randint(0, 3, (40,), generator=gen, dtype=torch.int32),
        bits=bits,
        perm=perm,
    )


def test_save_read_round_trip(tmp_path):
    layers = {"model.layers.0.mlp.down_proj": _weight(8, True), "model.layers.0.mlp.up_proj": _weight(8, False)}
    tensors = {"model.norm.weight": torch.randn(12)}
    save_checkpoint(tmp_path / "ck", {"model_type": "llama"}, tensors, layers, {"quantization": {"bits": 8}}, None)
    ck = read_checkpoint(tmp_path / "ck")
    for name, q in layers.items():
        r = ck.layers[name]
        assert torch.equal(r.codes, q.codes) and torch.equal(r.scales, q.scales) and torch.equal(r.zeros, q.zeros)
        assert torch.equal(r.g_idx, q.g_idx) and r.bits == 8
        assert (r.perm is None) == (q.perm is None) and (q.perm is None or torch.equal(r.perm, q.perm))
        assert torch.equal(r.dequantize(), q.dequantize())
    assert torch.equal(ck.tensors["model.norm.weight"], tensors["model.norm.weight"])
    config = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "matgptq"


def test_slice_checkpoint_is_smaller_and_exact(tmp_path):
    parent = {"a.b": _weight(8, False)}
    sliced = {"a.b": parent["a.b"].slice(3)}
    save_checkpoint(tmp_path / "p", {}, {}, parent, {}, None)
    save_checkpoint(tmp_path / "s", {}, {}, sliced, {}, None)
    ps, ss = (tmp_path / "p/model.safetensors").stat().st_size, (tmp_path / "s/model.safetensors").stat().st_size
    assert ss < ps
    assert torch.equal(read_checkpoint(tmp_path / "s").layers["a.b"].dequantize(), sliced["a.b"].dequantize())


def test_existing_output_refused_and_failed_write_leaves_nothing(tmp_path, monkeypatch):
    out = tmp_path / "ck"
    out.mkdir()
    with pytest.raises(UserError, match="--overwrite"):
        save_checkpoint(out, {}, {}, {"x": _weight(4, False)}, {}, None)

    def disk_full(tensors, path, metadata=None):  # the weights file half written, then the write fails
        Path(path).write_bytes(b"\0" * 100)
        raise OSError("No space left on device")

    monkeypatch.setattr("matgptq.formats.parent.save_file", disk_full)
    with pytest.raises(UserError, match=r"no space left on the device writing \S+/new \(it needs about \d+ bytes"):
        save_checkpoint(tmp_path / "new", {}, {}, {"x": _weight(4, False)}, {}, None)
    assert not (tmp_path / "new").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]


def _with_width_scales(q):
    gen = torch.Generator().manual_seed(7)
    return QuantizedWeight(
        q.codes,
        q.scales,
        q.zeros,
        q.g_idx,
        q.bits,
        0,
        q.perm,
        {
            r: (q.scales.float() * (1 + 0.1 * torch.rand(q.scales.shape, generator=gen))).half()
            for r in range(2, q.bits)
        },
    )


def test_per_width_scales_round_trip_and_slices_use_them(tmp_path):
    q = _with_width_scales(_weight(8, False))
    save_checkpoint(tmp_path / "ck", {}, {}, {"a.b": q}, {}, None)
    assert json.loads((tmp_path / "ck" / "matgptq.json").read_text())["format_version"] == 4
    r = read_checkpoint(tmp_path / "ck").layers["a.b"]
    assert sorted(r.width_scales) == list(range(2, 8))
    for b in range(2, 8):
        assert torch.equal(r.width_scales[b], q.width_scales[b])
        s = r.slice(b)  # W = s_r · (S(q, r)·2^(c−r) − z): the r-bit scales, the master zero (quantized.py)
        expected = q.width_scales[b].float()[:, q.g_idx.long()] * (
            (s.codes.float() * 2 ** (8 - b)) - q.zeros.float()[:, q.g_idx.long()]
        )
        assert torch.equal(s.dequantize(), expected) and s.width_scales is None
    assert torch.equal(r.slice(8).dequantize(), q.dequantize())  # the master keeps its own scale


def test_parents_without_per_width_scales_slice_on_the_master_scale(tmp_path):
    save_checkpoint(tmp_path / "ck", {}, {}, {"a.b": _weight(8, False)}, {}, None)
    assert json.loads((tmp_path / "ck" / "matgptq.json").read_text())["format_version"] == 4
    r = read_checkpoint(tmp_path / "ck").layers["a.b"]
    assert r.width_scales is None and torch.equal(r.slice(3).scales, r.scales)


def test_damaged_per_width_scale_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    save_checkpoint(tmp_path / "ck", {}, {}, {"a.b": _with_width_scales(_weight(8, False))}, {}, None)
    f = tmp_path / "ck" / "model.safetensors"
    raw = load_file(str(f))
    raw["a.b.scales.3"][0, 0] = float("nan")
    save_file(raw, str(f))
    with pytest.raises(UserError, match="a.b.scales.3 does not match its checksum"):
        read_checkpoint(tmp_path / "ck")
    with pytest.raises(UserError, match="a.b.scales.3 holds zero, NaN or Inf"):  # unverified: the value checks
        read_checkpoint(tmp_path / "ck", verify=False)
    raw["a.b.scales.3"] = raw["a.b.scales.3"][:, :2].contiguous()
    save_file(raw, str(f))
    with pytest.raises(UserError, match="a.b.scales.3 is float16"):
        read_checkpoint(tmp_path / "ck", verify=False)


def test_mixed_widths_round_trip_and_damaged_widths_are_refused(tmp_path):
    """GPTQ/RTN layers of several widths (quantize --bits-config): each stored and read back at its own width; the
    file lists every layer's width (`layer_bits`, since v3), so an older reader refuses it instead of unpacking it
    wrongly."""
    layers = {
        "model.layers.0.mlp.up_proj": _weight(4, False),
        "model.layers.0.mlp.down_proj": _weight(8, True),
        "model.layers.1.mlp.up_proj": _weight(3, False),
    }
    save_checkpoint(tmp_path / "ck", {"model_type": "llama"}, {}, layers, {}, None)
    meta = json.loads((tmp_path / "ck" / "matgptq.json").read_text())
    assert meta["format_version"] == 4 and meta["stored_bits"] == 8
    assert meta["layer_bits"] == {n: q.bits for n, q in layers.items()}
    ck = read_checkpoint(tmp_path / "ck")
    for name, q in layers.items():
        assert ck.layers[name].bits == q.bits and torch.equal(ck.layers[name].codes, q.codes)
        assert torch.equal(ck.layers[name].dequantize(), q.dequantize())
    for damage in (
        {"model.layers.0.mlp.up_proj": 4},
        {**meta["layer_bits"], "model.layers.1.mlp.up_proj": 9},
        {**meta["layer_bits"], "model.layers.0.mlp.down_proj": 5},
    ):  # a layer missing; 9 bits; widest ≠ 8
        (tmp_path / "ck" / "matgptq.json").write_text(json.dumps({**meta, "layer_bits": damage}))
        with pytest.raises(UserError, match="layer_bits"):
            read_checkpoint(tmp_path / "ck")


def test_slices_of_several_widths_are_not_one_checkpoint(tmp_path):
    parent = _weight(8, False)
    with pytest.raises(ValueError, match="one width"):
        save_checkpoint(
            tmp_path / "ck", {"model_type": "llama"}, {}, {"a": parent.slice(4), "b": parent.slice(3)}, {}, None
        )


@pytest.mark.parametrize("shard_bytes", [1 << 30, 20_000], ids=["one-file", "sharded"])
def test_layers_only_reads_the_quantized_layers_alone(tiny_llama_dir, tmp_path, shard_bytes):
    """What from_pretrained reads (integrations/transformers.py): the same layers, and no other tensor."""
    from tests.conftest import quick_quantize

    ckpt = quick_quantize(
        tiny_llama_dir, tmp_path / "p", method="matgptq", bits="3,8", group_size=32, shard_bytes=shard_bytes
    )
    assert (ckpt / "model.safetensors.index.json").is_file() == (shard_bytes < 1 << 30)
    full, layers = read_checkpoint(ckpt), read_checkpoint(ckpt, layers_only=True)
    assert full.tensors and not layers.tensors
    assert layers.layers.keys() == full.layers.keys()
    for name, q in full.layers.items():
        other = layers.layers[name]
        assert torch.equal(q.codes, other.codes) and torch.equal(q.scales, other.scales)
        assert q.width_scales.keys() == other.width_scales.keys()
