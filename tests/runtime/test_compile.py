"""Packed models under torch.compile (CPU) and transformers' generate.

Oracle: the same packed model run eagerly. With backend="aot_eager" (Dynamo + AOTAutograd graph capture, fullgraph:
no graph break is allowed, then the captured aten ops run as in eager) outputs must be bit-identical; that checks the
packed layers (the int4 kernel call, the bit-stream unpack, the act-order gather) trace into one graph. With inductor
one PackedLinear on the int4 decode path is compiled (a bit-stream layer with aot_eager): the kernel stays an extern
call and the bias add is a single rounding, so the output must again be bit-identical. tests/conftest.py disables
Dynamo for the suite (TORCHDYNAMO_DISABLE=1, read at call time); these tests lift that for themselves.
"""

from __future__ import annotations

import pytest
import torch

import matgptq
from matgptq.runtime.packed import Kernel, PackedLinear
from tests.conftest import make_tiny_llama, quick_quantize, random_parent

IDS = torch.tensor([[1, 5, 9, 200, 17, 300, 42, 7]])


@pytest.fixture
def dynamo(monkeypatch):
    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(disable=False):
        yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    root = tmp_path_factory.mktemp("compile")
    model = make_tiny_llama(root / "m", intermediate=96)
    return quick_quantize(
        model, root / "p", method="matgptq", bits="3,4,8", group_size=32, act_order=True, static_groups=False
    )


def test_compiled_forward_and_generate_equal_eager(parent, dynamo):
    """The whole bf16 model (int4 layers; ~45 s on 2 loaded cores, so the bit stream is tested per layer below)."""
    model = matgptq.load(parent, bits=3, dtype=torch.bfloat16, packed=True)
    assert {m.kernel for m in model.modules() if isinstance(m, PackedLinear)} == {Kernel.INT4}
    with torch.no_grad():
        eager = model(IDS).logits
        eager_gen = model.generate(IDS, max_new_tokens=4, do_sample=False)
        model.forward = torch.compile(model.forward, backend="aot_eager", fullgraph=True, dynamic=True)
        assert torch.equal(model(IDS).logits, eager)
        assert torch.equal(model.generate(IDS, max_new_tokens=4, do_sample=False), eager_gen)


def test_inductor_int4_layer(dynamo):
    q = random_parent(64, 128, 32, True).slice(4)
    layer = PackedLinear(q, torch.randn(64).to(torch.bfloat16), torch.bfloat16)
    x = torch.randn(1, 128).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(torch.compile(layer, fullgraph=True)(x), layer(x))


def test_aot_eager_bitstream_layer(dynamo):
    q = random_parent(40, 96, 32, True).slice(3)  # 40 rows: the int4 kernel cannot serve it
    layer = PackedLinear(q, None, torch.float32)
    assert layer.kernel == Kernel.BITSTREAM
    x = torch.randn(2, 5, 96)
    with torch.no_grad():
        assert torch.equal(torch.compile(layer, backend="aot_eager", fullgraph=True)(x), layer(x))
