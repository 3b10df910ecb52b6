"""The one-shot allocators against their definitions (allocators.py): a replaced weight scores as its slice does, the
power law through two probes, noise of the asked norm, the imatrix-weighted error from the layer's input computed by
hand, and every allocation within its budget."""

from fractions import Fraction

import pytest
import torch

import matgptq
from matgptq.allocation.allocators import (
    ALPHA_DEFAULT,
    ALPHA_MAX,
    Allocator,
    allocate,
    error_table,
    noise,
    noise_table,
    power_law,
    tables,
    uniform_mix,
)
from matgptq.allocation.budget import BudgetKind, CostModel
from matgptq.formats import read_checkpoint

LEVELS = (2, 3, 4, 8)


@pytest.fixture(scope="module")
def setup(stories_fitness, stories_parent):
    return stories_fitness, stories_parent


def slice_weight(parent, names, name: str, r: int) -> torch.Tensor:
    """Layer `name`'s weight at width r, from a model loaded with that mix (not through the fitness)."""
    model = matgptq.load(parent, bits={name: r} | {x: 8 for x in names if x != name})
    return model.get_submodule(name).weight.detach().clone()


def test_a_replaced_weight_scores_as_its_slice(setup):
    fitness, parent = setup
    n = len(fitness.names)
    top = tuple(8 for _ in range(n))
    cache = fitness.prefix_cache(top, (0, 1, 2))
    for layer in (0, 17, n - 1):
        w = slice_weight(parent, fitness.names, fitness.names[layer], 3)
        lowered = tuple(3 if i == layer else 8 for i in range(n))
        # the same weights through the same arithmetic: equal to the bit, with and without the prefix cache
        assert fitness.kl(top, (0, 1, 2), cache, (layer, w)) == fitness.kl(lowered, (0, 1, 2))
        assert fitness.kl(top, (0, 1, 2), None, (layer, w)) == fitness.kl(lowered, (0, 1, 2))
    assert fitness.kl(top, (0, 1, 2)) == fitness.kl(top, (0, 1, 2), cache)  # the weight was put back


def test_power_law_through_two_probes():
    s, alpha = power_law(0.2, 0.3 * 0.2**2.5, 0.05, 0.3 * 0.05**2.5)
    assert s == pytest.approx(0.3, rel=1e-12) and alpha == pytest.approx(2.5, rel=1e-12)
    assert power_law(0.2, 1.0, 0.1, 1e-9)[1] == ALPHA_MAX  # steeper than any network: clamped
    assert power_law(0.2, 0.5, 0.1, -1e-4) == (0.5 / 0.2**ALPHA_DEFAULT, ALPHA_DEFAULT)  # a probe below the base
    assert power_law(0.2, -0.1, 0.1, -0.2)[0] == 0.0  # a layer whose noise does not raise the loss costs nothing


def test_noise_has_the_asked_relative_norm():
    w = torch.randn(64, 48, generator=torch.Generator().manual_seed(1))
    for rho in (0.3, 0.01):
        e = noise(w, rho, seed=7).double() - w.double()
        # built in float64, stored in float32: the norm is off by float32 rounding of w + e only (~1e-7 relative)
        assert float(e.norm() / w.double().norm()) == pytest.approx(rho, rel=1e-4)
    assert torch.equal(noise(w, 0.3, 7), noise(w, 0.3, 7)) and not torch.equal(noise(w, 0.3, 7), noise(w, 0.3, 8))


def test_noise_table_is_the_law_through_its_probes(setup):
    fitness, parent = setup
    windows = (0, 1)
    table = noise_table(fitness, LEVELS, windows, seed=3)
    n = len(fitness.names)
    top = tuple(8 for _ in range(n))
    base = fitness.kl(top, windows)
    for layer in (0, n - 1):
        name = fitness.names[layer]
        w = {r: slice_weight(parent, fitness.names, name, r).double() for r in LEVELS}
        rfn = {r: float((w[r] - w[8]).norm() / w[8].norm()) for r in LEVELS}
        d = [
            fitness.kl(top, windows, None, (layer, noise(w[8].float(), rfn[r], 3 + 2 * layer + i))) - base
            for i, r in enumerate(LEVELS[:2])
        ]
        s, alpha = power_law(rfn[2], d[0], rfn[3], d[1])
        # rfn from the float32 module weights vs the parent's float64 dequantization: ~1e-7 relative
        assert table[layer] == pytest.approx([base + s * rfn[r] ** alpha for r in LEVELS], rel=1e-5, abs=1e-9)
    assert all(row[-1] == pytest.approx(base, abs=1e-12) for row in table)


def test_error_table_is_the_imatrix_weighted_error(setup):
    """Layer 0 (block 0's q_proj) reads the first RMSNorm of the embeddings: its imatrix computed by hand."""
    fitness, parent = setup
    windows = (0, 1, 2)
    table = error_table(fitness, LEVELS, windows)
    assert fitness.names[0].endswith("layers.0.self_attn.q_proj")
    ref = matgptq.load(parent, bits=8)
    with torch.no_grad():
        x = ref.model.layers[0].input_layernorm(ref.model.embed_tokens(fitness.windows[list(windows)])).double()
    imatrix = x.reshape(-1, x.shape[-1]).square().mean(0)
    w = {r: slice_weight(parent, fitness.names, fitness.names[0], r).double() for r in LEVELS}
    expected = [float(((w[r] - w[8]).square() * imatrix).sum()) for r in LEVELS]
    assert table[0] == pytest.approx(expected, rel=1e-5)  # float32 forward and weights vs float64 here
    assert all(row[-1] == 0.0 for row in table) and all(row[0] > row[1] > row[2] > 0 for row in table)


def test_every_allocation_fits_its_budget(setup):
    fitness, parent = setup
    cost = CostModel.from_checkpoint(read_checkpoint(parent), LEVELS)
    filled = tables(fitness, LEVELS, (0, 1), list(Allocator), seed=0, floors=(2, 3))
    assert set(filled) == set(Allocator) - {Allocator.UNIFORM}
    assert all(f.seconds >= 0 for f in filled.values())
    for budget in (Fraction(5, 2), Fraction(3), Fraction(7, 2)):
        for a in Allocator:
            mix = allocate(cost, filled[a][0] if a in filled else None, budget, BudgetKind.CODE)
            assert cost.fits(mix, budget, BudgetKind.CODE) and set(mix) <= set(LEVELS)
    assert uniform_mix(cost, Fraction(3), BudgetKind.CODE) == tuple(3 for _ in fitness.names)
    assert uniform_mix(cost, Fraction(7, 2), BudgetKind.CODE) == tuple(3 for _ in fitness.names)


def test_probe_beside_additive_is_read_off_its_lowest_width(setup):
    """Asked for together, PROBE costs no scoring of its own (the fitness counts every one) and is the table PROBE
    scores alone."""
    fitness, _ = setup
    before = fitness.evaluations
    both = tables(fitness, LEVELS, (0, 1), (Allocator.PROBE, Allocator.ADDITIVE))
    scorings = fitness.evaluations - before
    alone = tables(fitness, LEVELS, (0, 1), (Allocator.ADDITIVE,))
    assert fitness.evaluations - before - scorings == scorings  # ADDITIVE alone scores as many
    assert both[Allocator.PROBE].table == tables(fitness, LEVELS, (0, 1), (Allocator.PROBE,))[Allocator.PROBE].table
    assert both[Allocator.PROBE].measured == (2,) and both[Allocator.ADDITIVE].table == alone[Allocator.ADDITIVE].table
