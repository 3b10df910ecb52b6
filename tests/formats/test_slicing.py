"""Slicing rule S(q, r) against the official formula written out bit by bit, and slice dequantization."""

import torch

from matgptq.formats.quantized import QuantizedWeight
from matgptq.formats.slicing import slice_codes


def official_slice(q: int, c: int, r: int) -> int:
    """IST-DASLab/MatGPTQ `matryoshka_slice`, generalised to master c: top r bits + next bit, saturating."""
    if r == c:
        return q
    d = c - r
    return min((q >> d) + ((q >> (d - 1)) & 1), 2**r - 1)


def test_slice_matches_official_rule_for_all_codes():
    for c in range(2, 9):
        q = torch.arange(2**c, dtype=torch.uint8)
        for r in range(1, c + 1):
            assert slice_codes(q, c, r).tolist() == [official_slice(int(v), c, r) for v in q]


def test_documented_examples():
    # docs/formats.md §1.6: q = 0b0111_1000 (120), c=8, r=4 -> 8; saturation for the top 2^(d-1) codes
    assert int(slice_codes(torch.tensor([120]), 8, 4)) == 8
    top = slice_codes(torch.arange(248, 256), 8, 4)
    assert top.tolist() == [15] * 8


def test_slice_equals_round_half_up_of_master_position():
    q = torch.arange(256)
    for r in range(2, 8):
        expect = torch.clamp(torch.floor(q / 2 ** (8 - r) + 0.5), max=2**r - 1).long()
        assert torch.equal(slice_codes(q, 8, r), expect)


def test_sliced_weight_dequantizes_on_the_master_grid():
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (6, 10), generator=gen, dtype=torch.uint8)
    scales = torch.rand(6, 2, generator=gen).half()
    zeros = torch.randint(0, 256, (6, 2), generator=gen, dtype=torch.uint8)
    g_idx = torch.tensor([0] * 5 + [1] * 5, dtype=torch.int32)
    parent = QuantizedWeight(codes, scales, zeros, g_idx, bits=8)
    for r in (2, 3, 4, 6, 8):
        s = parent.slice(r)
        expect = torch.empty(6, 10)
        for n in range(6):
            for k in range(10):
                g = int(g_idx[k])
                pos = official_slice(int(codes[n, k]), 8, r) * 2 ** (8 - r)
                expect[n, k] = float(scales[n, g]) * (pos - int(zeros[n, g]))
        assert torch.equal(s.dequantize(), expect)
        assert s.bits == r and s.shift == 8 - r and int(s.codes.max()) < 2**r
