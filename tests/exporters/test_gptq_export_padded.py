"""GPTQ export without peer libraries, odd shapes: features that do not fill int32 words (MLP width 172, as in
stories260K, and 170) are zero-padded as GPTQModel 7.6.0 pads them — ceil(K·b/32) qweight rows, ceil(N·b/32) qzeros
columns, zero codes and zero (v2) zero points in the unused fields, v1 zeros by GPTQModel's word subtraction — and
read back exactly; a padded file missing a row is refused."""

import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import matgptq
from matgptq.errors import UserError
from matgptq.exporters.gptq import export_gptq
from matgptq.formats.gptq.reader import read_gptq_checkpoint
from matgptq.formats.parent import read_checkpoint
from matgptq.formats.slicing import slice_codes
from tests.conftest import make_tiny_llama
from tests.exporters.gptq_helpers import _logits, _relabel, synthetic


@pytest.fixture(scope="module")
def odd_llama(tmp_path_factory):
    """Random Llamas whose MLP width does not fill int32 words: 172 (stories260K: pads at 2/4 bits) and 170 (also 8)."""
    base = tmp_path_factory.mktemp("odd")
    return {i: make_tiny_llama(base / str(i), intermediate=i) for i in (172, 170)}


# The last qzeros word of a 172-wide layer in GPTQModel 7.6.0's own stories260K checkpoints (sym, group size 32);
# test_gptq_interop.py compares whole files.
GPTQMODEL_LAST_QZEROS_WORD = {("gptq_v2", 4): 0x00008888, ("gptq_v1", 4): 0xEEEF7777, ("gptq_v1", 2): 0xAB555555}


@pytest.mark.parametrize("fmt", ["gptq_v1", "gptq_v2"])
@pytest.mark.parametrize("inter,bits", [(172, 2), (172, 4), (172, 8), (170, 8)])  # 172 fills whole words at 8 bits
def test_padded_shapes_round_trip(odd_llama, tmp_path, inter, bits, fmt):
    """Features that do not fill int32 words are zero-padded as GPTQModel pads them and read back exactly."""
    src = synthetic(tmp_path / "p", odd_llama[inter], act_order=bits == 4)
    fill = inter % (32 // bits) * bits  # bits used in the last word of a 172/170-value axis, 0 if it is full
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = export_gptq(src, tmp_path / "g", fmt, bits=bits)
    assert any("zero-padded" in str(w.message) for w in caught) == bool(fill)
    raw = load_file(str(out / "model.safetensors"))
    words = -(-inter * bits // 32)
    gate, down = "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.down_proj"  # 64 → inter, inter → 64
    assert raw[f"{gate}.qweight"].shape == (64 * bits // 32, inter) and raw[f"{gate}.qzeros"].shape == (2, words)
    assert raw[f"{down}.qweight"].shape == (words, 64) and raw[f"{down}.qzeros"].shape == (
        -(-inter // 32),
        64 * bits // 32,
    )
    assert raw[f"{down}.g_idx"].shape == (inter,) and raw[f"{gate}.scales"].shape == (2, inter)
    if fill:  # the unused high fields of the last word: zero codes; zero v2 zeros, from which v1 borrows
        last = raw[f"{down}.qweight"][-1].numpy().view(np.uint32)
        assert (last >> np.uint32(fill) == 0).all()
        stored = raw[f"{gate}.qzeros"][:, -1].numpy().view(np.uint32)
        v2_word = sum((1 << (bits - 1)) << (bits * i) for i in range(fill // bits))
        want = v2_word if fmt == "gptq_v2" else (v2_word - {2: 0x55555555, 4: 0x11111111, 8: 0x01010101}[bits]) % 2**32
        assert (stored == want).all()
        if inter == 172 and (fmt, bits) in GPTQMODEL_LAST_QZEROS_WORD:
            assert want == GPTQMODEL_LAST_QZEROS_WORD[fmt, bits]
    parent, back = read_checkpoint(src), read_gptq_checkpoint(out)
    for name, q in parent.layers.items():
        assert torch.equal(back.layers[name].codes, slice_codes(q.codes, q.bits, bits)), name
        assert torch.equal(back.layers[name].dequantize(), q.slice(bits).dequantize()), name
    assert torch.equal(_logits(matgptq.load(out)), _logits(matgptq.load(src, bits=bits)))
    if fmt == "gptq_v1":  # GPTQModel's reader path (word add) gives the same zeros
        _relabel(out, meta={"quantizer": ["gptqmodel:7.6.0"]})
        for name, q in read_gptq_checkpoint(out).layers.items():
            assert torch.equal(q.zeros, back.layers[name].zeros), name


def test_padded_asymmetric_v2_round_trip(odd_llama, tmp_path):
    src = synthetic(tmp_path / "p", odd_llama[172], sym=False, master=4)
    with pytest.warns(UserWarning, match="zero-padded"):
        out = export_gptq(src, tmp_path / "g", "gptq_v2", bits=4)
    back = read_gptq_checkpoint(out)
    for name, q in read_checkpoint(src).layers.items():
        assert torch.equal(back.layers[name].dequantize(), q.dequantize()), name
    assert torch.equal(_logits(matgptq.load(out)), _logits(matgptq.load(src)))


def test_padded_qweight_with_a_missing_row_is_refused(odd_llama, tmp_path):
    with pytest.warns(UserWarning, match="zero-padded"):
        out = export_gptq(synthetic(tmp_path / "p", odd_llama[172]), tmp_path / "g", "gptq_v2", bits=4)
    raw = load_file(str(out / "model.safetensors"))
    key = "model.layers.0.mlp.down_proj.qweight"
    raw[key] = raw[key][:-1].contiguous()  # 21 rows hold 168 of the 172 inputs g_idx names
    save_file(raw, str(out / "model.safetensors"))
    with pytest.raises(UserError, match=r"qweight \(21, 64\) for 172 inputs, which is not 4-bit GPTQ"):
        read_gptq_checkpoint(out)
