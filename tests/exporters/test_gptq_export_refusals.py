"""GPTQ export and import without peer libraries, what is refused and what others write: widths, zeros, shapes and
scales GPTQ cannot hold exactly are refused with nothing left behind; checkpoints written by others (mislabelled
v1/v2, GPTQModel's asymmetric v1 with zero points of zero, `dynamic` overrides, other scale dtypes, corrupt tensors)
are read when the data determines them and refused otherwise."""

import json
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import matgptq
from matgptq.errors import UserError
from matgptq.exporters.gptq import export_gptq
from matgptq.formats.gptq.packing import pack_cols, unpack_cols
from matgptq.formats.gptq.reader import read_gptq_checkpoint
from matgptq.formats.parent import read_checkpoint, save_checkpoint
from matgptq.formats.quantized import QuantizedWeight
from tests.exporters.gptq_helpers import _no_output, _relabel, synthetic

# ------------------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("bits", [5, 6, 7])
def test_widths_without_gptq_packing_are_refused(parents, tmp_path, bits):
    with pytest.raises(UserError, match="no packing"):
        export_gptq(parents["sym", False], tmp_path / "g", "gptq_v2", bits=bits)
    _no_output(tmp_path / "g")


def test_fractional_asymmetric_zero_is_refused(tiny_llama_dir, tmp_path):
    src = synthetic(tmp_path / "p", tiny_llama_dir, sym=False, master=8)
    with pytest.raises(UserError, match="not multiples of 2"):
        export_gptq(src, tmp_path / "g", "gptq_v2", bits=4)
    _no_output(tmp_path / "g")
    export_gptq(src, tmp_path / "g8", "gptq_v2", bits=8)  # the parent width itself is exact


def test_asymmetric_slice_with_divisible_zeros_is_exported(tiny_llama_dir, tmp_path):
    src = synthetic(tmp_path / "p", tiny_llama_dir, sym=False, master=8)
    ck = read_checkpoint(src)
    layers = {n: QuantizedWeight(q.codes, q.scales, (q.zeros // 16) * 16, q.g_idx, 8) for n, q in ck.layers.items()}
    save_checkpoint(tmp_path / "p16", ck.config, ck.tensors, layers, ck.meta, src)
    export_gptq(tmp_path / "p16", tmp_path / "g", "gptq_v2", bits=4)
    back = read_gptq_checkpoint(tmp_path / "g")
    for n, q in layers.items():
        assert torch.equal(back.layers[n].dequantize(), q.slice(4).dequantize())


@pytest.mark.parametrize("fmt", ["gptq_v1", "gptq_v2"])
@pytest.mark.parametrize("n,k", [(172, 64), (64, 172), (32, 48)])
def test_three_bit_partial_block_is_refused(tiny_llama_dir, tmp_path, n, k, fmt):
    """3-bit GPTQ packs 32 values into 3 words; a partial block is refused (naming the layer and the way out)."""
    shapes = {"model.layers.0.mlp.down_proj": (n, k), "model.layers.1.mlp.down_proj": (64, 128)}
    src = synthetic(tmp_path / "p", tiny_llama_dir, shapes=shapes, group=-1)
    with pytest.raises(
        UserError,
        match=rf"layers\.0\.mlp\.down_proj has {n} output × {k} input.*multiples of 32.*"
        r"export 2, 4 or 8 bits.*--format gguf",
    ):
        export_gptq(src, tmp_path / "g", fmt, bits=3)
    _no_output(tmp_path / "g")


def test_scale_overflow_is_refused(tiny_llama_dir, tmp_path):
    ck = read_checkpoint(synthetic(tmp_path / "p", tiny_llama_dir))
    layers = {
        n: QuantizedWeight(q.codes, torch.full_like(q.scales, 60000.0), q.zeros, q.g_idx, 8)
        for n, q in ck.layers.items()
    }
    save_checkpoint(tmp_path / "big", ck.config, ck.tensors, layers, ck.meta, None)
    export_gptq(tmp_path / "big", tmp_path / "g8", "gptq_v2", bits=8)
    with pytest.raises(UserError, match="overflows float16"):
        export_gptq(tmp_path / "big", tmp_path / "g", "gptq_v2", bits=2)
    _no_output(tmp_path / "g")


def test_bad_requests_are_refused(parents, tiny_llama_dir, tmp_path):
    src = parents["sym", False]
    for kwargs, match in [
        (dict(fmt="gptq_v3"), "unknown GPTQ format"),
        (dict(fmt="gptq_v2", bits=4, bits_config={"*": 4}), "either"),
        (dict(fmt="gptq_v2", bits=9), "cannot use 9 bits"),
    ]:
        with pytest.raises(UserError, match=match):
            export_gptq(src, tmp_path / "g", **kwargs)
        _no_output(tmp_path / "g")
    with pytest.raises(UserError, match="not quantized"):
        export_gptq(tiny_llama_dir, tmp_path / "g", "gptq_v2")
    (tmp_path / "exists").mkdir()
    with pytest.raises(UserError, match="already exists"):
        export_gptq(src, tmp_path / "exists", "gptq_v2", bits=4)
    export_gptq(src, tmp_path / "exists", "gptq_v2", bits=4, overwrite=True)


# --------------------------------------------------------------------------------------------------------- import


@pytest.mark.parametrize("written,label", [("gptq_v1", "gptq_v2"), ("gptq_v2", "gptq")])
def test_mislabelled_symmetric_checkpoint_trusts_the_data(parents, tmp_path, written, label):
    out = export_gptq(parents["sym", False], tmp_path / "g", written, bits=4)
    want = read_gptq_checkpoint(out)
    _relabel(out, checkpoint_format=label, format=label)
    with pytest.warns(UserWarning, match="labelled"):
        got = read_gptq_checkpoint(out)
    for n, q in want.layers.items():
        assert torch.equal(got.layers[n].dequantize(), q.dequantize())


def test_consistent_label_does_not_warn(parents, tmp_path):
    out = export_gptq(parents["sym", True], tmp_path / "g", "gptq_v1", bits=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_gptq_checkpoint(out)


def _asym_v1(parents, tmp_path, bits, gptqmodel_tag):
    """An asymmetric v1 checkpoint as GPTQModel writes it: v2 words minus a constant per word (borrows included)."""
    out = export_gptq(parents["asym", bits, False], tmp_path / "g", "gptq_v2", bits=bits)
    raw = load_file(str(out / "model.safetensors"))
    want = read_gptq_checkpoint(out)
    for k in [k for k in raw if k.endswith(".qzeros")]:
        if bits == 3:  # GPTQModel 3-bit: (z - 1) & 7 per field
            n = raw[k].shape[1] * 32 // 3
            raw[k] = torch.from_numpy(pack_cols((unpack_cols(raw[k].numpy(), 3, n).astype(np.int64) - 1) & 7, 3))
        else:
            words = (
                raw[k].numpy().view(np.uint32).astype(np.int64) - {2: 0x55555555, 4: 0x11111111, 8: 0x01010101}[bits]
            )
            raw[k] = torch.from_numpy((words & 0xFFFFFFFF).astype(np.uint32).view(np.int32))
    save_file(raw, str(out / "model.safetensors"))
    _relabel(
        out, checkpoint_format="gptq", format="gptq", meta={"quantizer": ["gptqmodel:7.6.0"] if gptqmodel_tag else []}
    )
    return out, want


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_gptqmodel_asymmetric_v1_with_zero_points_of_zero(parents, tmp_path, bits):
    out, want = _asym_v1(parents, tmp_path, bits, gptqmodel_tag=True)
    assert any((q.zeros == 0).any() for q in want.layers.values())
    got = read_gptq_checkpoint(out)
    for n, q in want.layers.items():
        assert torch.equal(got.layers[n].zeros, q.zeros), n


def test_v1_zero_field_overflow_from_other_producers_is_refused(parents, tmp_path):
    out, _ = _asym_v1(parents, tmp_path, 3, gptqmodel_tag=False)
    with pytest.raises(UserError, match="re-export it as gptq_v2"):
        read_gptq_checkpoint(out)


def test_dynamic_negative_override_and_unsupported_checkpoints(parents, tmp_path):
    out = export_gptq(parents["sym", False], tmp_path / "g", "gptq_v2", bits=4)
    _relabel(out, dynamic={r"+:.*q_proj": {"bits": 8}})
    with pytest.raises(UserError, match="not 8-bit GPTQ"):
        read_gptq_checkpoint(out)
    _relabel(out, dynamic={r"-:.*mlp\.down_proj": {}})
    with pytest.raises(UserError, match="excludes"):
        read_gptq_checkpoint(out)
    _relabel(out, checkpoint_format="gptq_p", format="gptq_p", dynamic={})
    with pytest.raises(UserError, match="gptq_p"):
        read_gptq_checkpoint(out)
    _relabel(out, checkpoint_format="gptq_v2", format="gptq_v2", pack_dtype="int16")
    with pytest.raises(UserError, match="int16"):
        read_gptq_checkpoint(out)
    _relabel(out, pack_dtype="int32")
    (out / "model.safetensors").rename(out / "pytorch_model.bin")
    with pytest.raises(UserError, match="safetensors"):
        matgptq.load(out)


def test_gptq_source_converts_between_v1_and_v2(parents, tmp_path):
    v2 = export_gptq(parents["sym", True], tmp_path / "v2", "gptq_v2", bits=3)
    v1 = export_gptq(v2, tmp_path / "v1", "gptq_v1")  # a GPTQ checkpoint is a valid source too
    a, b = read_gptq_checkpoint(v2), read_gptq_checkpoint(v1)
    assert b.meta["checkpoint_format"] == "gptq" and json.loads((v1 / "quantize_config.json").read_text())["desc_act"]
    for n, q in a.layers.items():
        assert torch.equal(b.layers[n].dequantize(), q.dequantize())


def test_scales_in_other_dtypes_are_read_only_when_exact(parents, tmp_path):
    out = export_gptq(parents["sym", False], tmp_path / "g", "gptq_v2", bits=4)
    want = read_gptq_checkpoint(out)
    raw = load_file(str(out / "model.safetensors"))
    key = "model.layers.0.mlp.up_proj.scales"
    raw[key] = raw[key].float()
    save_file(raw, str(out / "model.safetensors"))
    assert torch.equal(read_gptq_checkpoint(out).layers[key[:-7]].dequantize(), want.layers[key[:-7]].dequantize())
    raw[key][0, 0] += 1e-6
    save_file(raw, str(out / "model.safetensors"))
    with pytest.raises(UserError, match="float16 cannot hold"):
        read_gptq_checkpoint(out)


def test_corrupt_tensors_are_reported(parents, tmp_path):
    out = export_gptq(parents["sym", False], tmp_path / "g", "gptq_v2", bits=4)
    raw = load_file(str(out / "model.safetensors"))
    raw["model.layers.0.mlp.up_proj.qzeros"] = raw["model.layers.0.mlp.up_proj.qzeros"][:, :-1].contiguous()
    save_file(raw, str(out / "model.safetensors"))
    with pytest.raises(UserError, match="corrupt"):
        read_gptq_checkpoint(out)
