"""Packed layers (runtime/packed.py): the same outputs as the float model of the same slice, bit for bit, with r bits
per weight; generate and set_bits work."""

from __future__ import annotations

import math

import pytest
import torch

import matgptq
from matgptq.errors import UserError
from matgptq.runtime.packed import PREFILL_ROWS, Kernel, PackedLinear, weight_bytes
from tests.conftest import make_tiny_llama, quick_quantize

IDS = torch.tensor([[1, 5, 9, 200, 17, 300, 42, 7, 99, 1000 % 512, 3, 64]])


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    root = tmp_path_factory.mktemp("packed")
    model = make_tiny_llama(root / "m", intermediate=96)  # down_proj K = 96: rows of 36 bytes at 3 bits
    return quick_quantize(
        model, root / "p", method="matgptq", bits="3,4,8", group_size=32, act_order=True, static_groups=False
    )


@pytest.mark.parametrize("bits", [3, 4, 8, {"*": 4, "model.layers.0.mlp.down_proj": 2}])
def test_same_logits_as_the_float_model(parent, bits):
    dense = matgptq.load(parent, bits=bits, packed=False)
    packed = matgptq.load(parent, bits=bits, packed=True)
    with torch.no_grad():
        assert torch.equal(packed(IDS).logits, dense(IDS).logits)
    layers = [m for m in packed.modules() if isinstance(m, PackedLinear)]
    assert len(layers) == 14
    for m in layers:  # r bits per weight: the packed rows, plus fp16 scales, uint8 zeros, int32 g_idx
        assert m.packed.numel() == m.out_features * math.ceil(m.in_features * m.bits / 8)
    assert weight_bytes(packed) < weight_bytes(dense)


def test_generate_and_set_bits(parent):
    packed = matgptq.load(parent, bits=3, packed=True)
    matgptq.set_bits(packed, 4)
    dense = matgptq.load(parent, bits=4)
    with torch.no_grad():
        assert torch.equal(packed(IDS).logits, dense(IDS).logits)
    out = packed.generate(IDS, max_new_tokens=6, do_sample=False)
    assert torch.equal(out, dense.generate(IDS, max_new_tokens=6, do_sample=False))


def test_packed_needs_a_quantized_checkpoint(tmp_path):
    model = make_tiny_llama(tmp_path / "fp")
    with pytest.raises(UserError, match="not quantized"):
        matgptq.load(model, packed=True)


def test_bfloat16_models_use_the_int4_kernel(parent):
    """bf16 + packed: every layer on Kernel.INT4; a prefill of ≥ PREFILL_ROWS tokens equals the dense bf16 model bit for
    bit (that path dequantizes exactly, test_int4_cpu.py); decode steps go through the kernel and generate runs."""
    ids = torch.arange(3, 3 + PREFILL_ROWS + 4).view(1, -1) * 7 % 500
    packed = matgptq.load(parent, bits=3, dtype=torch.bfloat16, packed=True)
    layers = [m for m in packed.modules() if isinstance(m, PackedLinear)]
    assert {m.kernel for m in layers} == {Kernel.INT4}
    dense = matgptq.load(parent, bits=3, dtype=torch.bfloat16, packed=False)
    with torch.no_grad():
        assert torch.equal(packed(ids).logits, dense(ids).logits)
    matgptq.set_bits(packed, 8)  # two planes
    matgptq.set_bits(dense, 8)
    with torch.no_grad():
        assert torch.equal(packed(ids).logits, dense(ids).logits)
    out = packed.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 4) and torch.equal(out[:, : ids.shape[1]], ids)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a CUDA machine the default stays dense (packed_wins)")
def test_packed_is_the_default_for_bfloat16_only(parent):
    """load() without `packed`: bfloat16 → PackedLinear on the int4 kernel; float32 → dense nn.Linear (the bit-stream
    path would be exact but slow); packed=False forces dense."""
    kinds = lambda model: {type(model.get_submodule(n)).__name__ for n in model.matgptq.layers}  # noqa: E731
    assert kinds(matgptq.load(parent, bits=3, dtype=torch.bfloat16)) == {"PackedLinear"}
    assert kinds(matgptq.load(parent, bits=3)) == {"Linear"}  # the tiny model is float32
    assert kinds(matgptq.load(parent, bits=3, dtype=torch.bfloat16, packed=False)) == {"Linear"}
