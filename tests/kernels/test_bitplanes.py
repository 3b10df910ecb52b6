"""The nested bit-plane layout (kernels/bitplanes.py) reproduces every slice of a parent exactly: its codes equal
formats.slicing's S(q, r) and its dequantized weight equals QuantizedWeight.slice(r).dequantize(), bit for bit, for
every width it serves; a width it cannot serve is a one-line UserError."""

from __future__ import annotations

import pytest
import torch

from matgptq.errors import UserError
from matgptq.formats.slicing import slice_codes
from matgptq.kernels import NestedLayout
from tests.conftest import random_parent as parent


@pytest.mark.parametrize("group,act_order", [(-1, False), (32, False), (64, True), (128, False)])
def test_every_width_is_exact(group, act_order):
    q = parent(24, 200, group, act_order, width_scales=True)  # K = 200: padded words, a short last group
    layout = NestedLayout.build(q)
    assert layout.widths == tuple(range(1, 9))
    for r in range(2, 9):
        assert torch.equal(layout.slice_codes(r), slice_codes(q.codes, 8, r).to(torch.int32))
        assert torch.equal(layout.dequantize(r), q.slice(r).dequantize())


def test_other_master_widths():
    q = parent(8, 40, 32, False, bits=5)
    layout = NestedLayout.build(q)
    for r in range(2, 6):
        assert torch.equal(layout.dequantize(r), q.slice(r).dequantize())


def test_a_layout_keeps_only_the_planes_its_widths_need():
    q = parent(16, 64, 32, False)
    layout = NestedLayout.build(q, widths=(2, 4))
    assert layout.planes.shape[0] == 5 and layout.widths == (1, 2, 3, 4)
    assert torch.equal(layout.dequantize(4), q.slice(4).dequantize())
    with pytest.raises(UserError, match="serves widths 1..4, not 8") as e:
        layout.dequantize(8)
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="cannot serve 9 bits"):
        NestedLayout.build(q, widths=(9,))
    with pytest.raises(UserError, match="already a 3-bit slice"):
        NestedLayout.build(q.slice(3), widths=(3, 4))


@pytest.mark.parametrize("bits", [2, 3, 5, 8])
def test_a_slice_layout_is_its_r_planes_exactly(bits):
    q = parent(24, 200, 64, True, width_scales=True, seed=bits)
    layout = NestedLayout.build(q.slice(bits))
    assert layout.planes.shape[0] == bits and layout.sliced == (bits < 8)
    assert layout.widths == ((bits,) if bits < 8 else tuple(range(1, 9)))  # slice(c) is the parent itself
    assert torch.equal(layout.slice_codes(bits), slice_codes(q.codes, 8, bits).to(torch.int32))
    assert torch.equal(layout.dequantize(bits), q.slice(bits).dequantize())
