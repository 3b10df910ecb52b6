"""The K-quant scale lattice (quantization/algorithm/kquant_scales.py): its arithmetic claims checked by enumeration, and GPTQ
with it against the plain column-by-column recursion of test_solver with the same snapping step."""

from __future__ import annotations

import pytest
import torch

from matgptq.errors import UserError
from matgptq.formats.gguf import KQuantType
from matgptq.quantization import GPTQConfig, config_from_json
from matgptq.quantization.algorithm.grid import NearestRounding, find_params
from matgptq.quantization.algorithm.kquant_scales import LATTICES, SUPER_BLOCK, lattice_for
from matgptq.quantization.algorithm.solver import gptq_quantize, rtn_quantize
from tests.quantization.algorithm.test_solver import dequant, output_error, random_problem

TYPES = list(KQuantType)


def _random_scales(n: int, groups: int, seed: int) -> torch.Tensor:
    """fp16 scales over six decades (down into fp16 subnormals), as per-group GPTQ scales can be."""
    gen = torch.Generator().manual_seed(seed)
    mag = 10 ** (-6 * torch.rand(n, groups, generator=gen, dtype=torch.float64))
    return (mag * torch.rand(n, groups, generator=gen, dtype=torch.float64) + 1e-7).to(torch.float16).float()


def _significant_bits(x: torch.Tensor) -> int:
    """Largest number of significant bits among the positive float64 values `x` (exact binary)."""
    m, _ = torch.frexp(x.double())
    bits = 0
    for v in m.flatten().tolist():
        b = 0
        while v != int(v):
            v *= 2
            b += 1
        bits = max(bits, b)
    return bits


@pytest.mark.parametrize("kq", TYPES, ids=[t.value for t in TYPES])
@pytest.mark.parametrize("group_size", [16, 32, 64, 128])
def test_lattice_properties(kq, group_size):
    lat = LATTICES[kq]
    if group_size % lat.sub_block:
        pytest.skip("group smaller than the type's sub-block")
    s = _random_scales(8, 2 * SUPER_BLOCK // group_size, seed=group_size)
    d = lat.super_scales(s, group_size)
    snapped = lat.snap(s, d)
    # every snapped scale is float16 and d·sc with an integer sc in [1, sc_max]
    assert torch.equal(snapped.to(torch.float16).float(), snapped)
    sc = snapped.double() / d
    assert torch.equal(sc, sc.round()) and sc.min() >= 1 and sc.max() <= lat.sc_max
    # d is one value per row and super-block, with at most d_bits significant bits ...
    per = SUPER_BLOCK // group_size
    assert torch.equal(d.view(8, -1, per), d.view(8, -1, per)[..., :1].expand(-1, -1, per))
    assert _significant_bits(d) <= lat.d_bits
    # ... so d·sc is float16-exact for *every* sc the type allows, not just the ones drawn here
    all_sc = torch.arange(1, lat.sc_max + 1, dtype=torch.float64)
    prods = d.flatten()[:, None] * all_sc
    assert torch.equal(prods.to(torch.float16).double(), prods)
    # d ≥ max/sc_max (no sub-scale above the grid) and at most one step of d_bits (or the fp16 subnormal step) above
    smax = s.double().view(8, -1, per).amax(-1).repeat_interleave(per, 1)
    assert (d >= smax / lat.sc_max).all()
    assert (d <= smax / lat.sc_max * (1 + 2.0 ** (1 - lat.d_bits)) + 2.0**-24).all()
    # nearest point: moved by at most d/2, except scales below d/2 that the floor sc = 1 lifts to d
    moved = (snapped.double() - s.double()).abs()
    assert (moved <= torch.where(s.double() >= d / 2, d / 2, d)).all()


def reference_gptq_lattice(w, h, bits, group_size, static_groups, damp=0.01):
    """test_solver's recursion (one column at a time, float64) with the lattice step made explicit: d from the
    static scales of the original weights, each group's scale snapped when the group starts."""
    rounding = NearestRounding(bits)
    lat = LATTICES[KQuantType.Q3_K]
    w, h = w.double().clone(), h.double().clone()
    k, g = w.shape[1], group_size
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    statics = [find_params(w[:, a : a + g], rounding, True, False) for a in range(0, k, g)]
    d = lat.super_scales(torch.stack([s for s, _ in statics], 1), g)
    h = h + damp * torch.diag(h).mean() * torch.eye(k, dtype=h.dtype)
    u = torch.linalg.cholesky(torch.linalg.inv(h), upper=True)
    deq = torch.zeros_like(w)
    for j in range(k):
        if static_groups:
            scale, zero = statics[j // g]
            scale = lat.snap(scale, d[:, j // g])
        elif j % g == 0:
            scale, zero = find_params(w[:, j : j + g], rounding, True, False)
            scale = lat.snap(scale, d[:, j // g])
        q = rounding.codes(w[:, j], scale, zero)
        deq[:, j] = scale * (q - zero)
        err = (w[:, j] - deq[:, j]) / u[j, j]
        w[:, j:] -= err[:, None] * u[j, j:]
    return deq


@pytest.mark.parametrize("static_groups", [False, True])
def test_gptq_on_the_lattice_matches_reference(static_groups):
    w, h, _ = random_problem(24, 512, seed=3)
    res = gptq_quantize(
        w, h, NearestRounding(3), group_size=32, static_groups=static_groups, lattice=LATTICES[KQuantType.Q3_K]
    )
    ref = reference_gptq_lattice(w, h, 3, 32, static_groups)
    assert torch.allclose(dequant(res), ref, rtol=0, atol=1e-12)  # both in float64: same codes, same scales


def test_lattice_costs_little_and_gptq_still_beats_rtn():
    """Snapping moves a group scale s by at most d/2, i.e. by a relative δ = d/(2s); a rounding error scales with the
    step, so the layer's output error may grow by at most a factor 1 + max δ over unconstrained GPTQ's (the codes then
    see the same weights up to that scaling). Measured here: δ ≤ 3.9%, error ratios 0.994-1.003 over 5 seeds."""
    w, h, x = random_problem(64, 512, seed=5)
    r, lat = NearestRounding(3), LATTICES[KQuantType.Q3_K]
    snapped = gptq_quantize(w, h, r, group_size=32, lattice=lat)
    delta = float((lat.super_scales(snapped.scales.double(), 32) / (2 * snapped.scales.double())).max())
    free = output_error(w, dequant(gptq_quantize(w, h, r, group_size=32)), x)
    lat_err = output_error(w, dequant(snapped), x)
    rtn = output_error(w, dequant(rtn_quantize(w, r, 32, True, lattice=lat)), x)
    assert lat_err < rtn and lat_err <= (1 + delta) * free


@pytest.mark.parametrize("kq", [t for t in TYPES if LATTICES[t].signed], ids=lambda t: t.value)
def test_signed_lattices_keep_the_sign(kq):
    """Q3_K/Q6_K store signed sub-scales: a `--signed-scale` grid's negative scales snap to d·sc with sc < 0, and
    d (from the largest |s|) is what the positive scales of the same magnitudes give; unsigned lattices refuse them."""
    lat = LATTICES[kq]
    s = _random_scales(8, 16, seed=3)
    sign = torch.where(torch.rand(s.shape, generator=torch.Generator().manual_seed(4)) < 0.5, -1.0, 1.0)
    d = lat.super_scales(s * sign, 16)
    assert torch.equal(d, lat.super_scales(s, 16))
    snapped = lat.snap(s * sign, d)
    assert torch.equal(snapped, sign * lat.snap(s, d))
    with pytest.raises(ValueError, match="unsigned"):
        LATTICES[KQuantType.Q4_K].snap(s * sign, d)


def test_rtn_on_the_lattice_rounds_to_nearest():
    w, _, _ = random_problem(16, 256, seed=1, outliers=False)
    lat = LATTICES[KQuantType.Q2_K]
    res = rtn_quantize(w, NearestRounding(2), 16, True, lattice=lat)
    s = res.scales.double()[:, res.g_idx.long()]
    assert torch.equal(res.codes.double(), torch.clamp(torch.round(w / s) + 2, 0, 3))
    d = lat.super_scales(res.scales.float(), 16).double()
    assert torch.equal(res.scales.double() / d, (res.scales.double() / d).round())


def test_where_the_lattice_applies():
    assert lattice_for(None, 32, 512) is None
    assert lattice_for(KQuantType.Q4_K, -1, 512) is None  # one scale per super-block: exact as it is
    assert lattice_for(KQuantType.Q4_K, 256, 512) is None
    assert lattice_for(KQuantType.Q4_K, 32, 576) is None  # K-quants cannot hold 576 columns at all
    assert lattice_for(KQuantType.Q4_K, 32, 512) is LATTICES[KQuantType.Q4_K]


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(kquant="q9_k"), "unknown K-quant"),
        (dict(kquant="q3_k", sym=False), "symmetric"),
        (dict(kquant="q4_k", signed_scale=True), "unsigned sub-scales"),
        (dict(kquant="q2_k", signed_scale=True), "unsigned sub-scales"),
        (dict(kquant="q3_k", act_order=True, static_groups=False), "static-groups"),
        (dict(kquant="q4_k", group_size=16), "does not tile"),
        (dict(kquant="q3_k", group_size=48), "does not tile"),
    ],
)
def test_config_refuses_what_the_lattice_cannot_hold(kw, match):
    with pytest.raises(UserError, match=match):
        GPTQConfig(bits=3, **{"group_size": 32, **kw})


def test_config_round_trips_the_type():
    cfg = GPTQConfig(bits=3, group_size=32, kquant="q3_k")
    assert cfg.kquant is KQuantType.Q3_K and config_from_json(cfg.to_json()) == cfg
    assert LATTICES[KQuantType.Q6_K].d_bits == 4  # 127 needs 7 bits: d keeps 11 - 7
