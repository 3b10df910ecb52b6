"""The --mse scale search, plain and weighted per column (--mse-weighted), against a loop written from its definition."""

import pytest
import torch

from matgptq.quantization.algorithm import grid
from matgptq.quantization.algorithm.grid import (
    MSE_GRID,
    MSE_MAX_SHRINK,
    MSE_NORM,
    MSE_SEARCH,
    NearestRounding,
    find_params,
)
from matgptq.quantization.algorithm.solver import gptq_quantize


def coarse_to_fine(error):
    """The grid point i (p = 1 − i/100, i < 80) the search keeps, given E as `error(i)` (grid.py's docstring, written
    as loops): every MSE_SEARCH.coarse-th point scored, the best MSE_SEARCH.keep of them (smallest E, then smallest
    i), the points within MSE_SEARCH.refine steps of those, and of those the one with the smallest E, the smallest i
    on ties."""
    n, step, keep, refine = int(MSE_MAX_SHRINK * MSE_GRID), MSE_SEARCH.coarse, MSE_SEARCH.keep, MSE_SEARCH.refine
    coarse = sorted(range(0, n, step), key=lambda i: (error(i), i))[:keep]
    near = {min(max(c + d, 0), n - 1) for c in coarse for d in range(-refine, refine + 1)}
    return min(near, key=lambda i: (error(i), i))


def brute_force_scale(row, bits, weights, pick=coarse_to_fine):
    """One row, symmetric grid: s(i) = fp16(2·p·max|w| / (2^b − 1)) for p = 1 − i/100, and the s(i) coarse_to_fine
    keeps for E(i) = Σ_j d_j·|w_j − s·(clamp(round(w_j / s) + z) − z)|^2.4, z = 2^(b−1) (grid.py's docstring)."""
    maxq, z = (1 << bits) - 1, 1 << (bits - 1)
    amax = max(max(-min(row), 0.0), max(max(row), 0.0))
    scale = lambda i: float(torch.tensor(2 * amax * (1 - i / MSE_GRID) / maxq).half())  # noqa: E731

    def error(i):
        s = scale(i)
        return sum(d * abs(x - s * (min(max(round(x / s) + z, 0), maxq) - z)) ** MSE_NORM for x, d in zip(row, weights))

    return scale(pick(error))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weighted_search_is_the_weighted_minimiser(seed):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(6, 16, generator=gen, dtype=torch.float64)
    d = torch.rand(16, generator=gen, dtype=torch.float64) ** 4 * 100  # very uneven importances, as H_kk are
    scale, _ = find_params(w, NearestRounding(3), sym=True, mse=True, col_weights=d)
    for r in range(6):
        assert float(scale[r]) == brute_force_scale(w[r].tolist(), 3, d.tolist())


def test_the_search_keeps_the_coarse_to_fine_point_not_the_full_grids():
    """Over many rows some have their full-grid minimiser outside the refined points (so the two definitions
    differ there); each row's scale is still coarse_to_fine's."""
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(200, 12, generator=gen, dtype=torch.float64)  # one row of these differs (seed searched for)
    d = torch.rand(12, generator=gen, dtype=torch.float64) + 0.1
    scale, _ = find_params(w, NearestRounding(4), sym=True, mse=True, col_weights=d)
    got = [float(s) for s in scale]
    assert got == [brute_force_scale(w[r].tolist(), 4, d.tolist()) for r in range(200)]
    full = [
        brute_force_scale(w[r].tolist(), 4, d.tolist(), pick=lambda e: min(range(80), key=lambda i: (e(i), i)))
        for r in range(200)
    ]
    assert got != full


def brute_force_asymmetric(row, bits):
    """One row, asymmetric grid: for p = 1 − i/100: xmin = p·min(min w, 0), xmax = p·max(max w, 0),
    s = fp16((xmax − xmin) / (2^b − 1)), z = clamp(round(−xmin / s), 0, 2^b − 1); the (s, z) coarse_to_fine keeps for
    E(i) = Σ_j |w_j − s·(clamp(round(w_j / s) + z) − z)|^2.4 (grid.py's docstring; round half to even as torch)."""
    maxq = (1 << bits) - 1
    lo, hi = min(min(row), 0.0), max(max(row), 0.0)

    def grid_point(i):
        p = 1 - i / MSE_GRID
        s = float(torch.tensor((hi * p - lo * p) / maxq).half())
        return s, min(max(round(-(lo * p) / s), 0), maxq)

    def error(i):
        s, z = grid_point(i)
        return sum(abs(x - s * (min(max(round(x / s) + z, 0), maxq) - z)) ** MSE_NORM for x in row)

    return grid_point(coarse_to_fine(error))


@pytest.mark.parametrize("chunk", [None, 1])
def test_asymmetric_search_is_the_minimiser_in_any_chunking(monkeypatch, chunk):
    """The search scores its shrinks in chunks (grid.search_chunk); one shrink per chunk gives the same pick."""
    if chunk is not None:
        monkeypatch.setattr(grid, "SEARCH_ELEMENTS", chunk)
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(5, 24, generator=gen, dtype=torch.float64) + 0.7  # off-centre rows: the zero point moves
    scale, zero = find_params(w, NearestRounding(3), sym=False, mse=True)
    for r in range(5):
        assert (float(scale[r]), int(zero[r])) == brute_force_asymmetric(w[r].tolist(), 3)


def test_unit_weights_are_the_plain_search_and_weights_change_the_choice():
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(32, 32, generator=gen)
    plain = find_params(w, NearestRounding(3), True, True)
    assert all(
        torch.equal(a, b)
        for a, b in zip(plain, find_params(w, NearestRounding(3), True, True, col_weights=torch.ones(32)))
    )
    d = torch.ones(32)
    d[w.abs().argmax(1)] = 0  # ignore each row's extreme weight: only weights that matter set the range
    weighted = find_params(w, NearestRounding(3), True, True, col_weights=d)
    assert (weighted[0] != plain[0]).any()


def test_gptq_static_groups_take_the_hessian_weighted_scales():
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(8, 48, generator=gen)
    x = torch.randn(200, 48, generator=gen)
    x[:, :4] *= 30
    h = 2 * x.T @ x / 200
    res = gptq_quantize(
        w, h, NearestRounding(4), group_size=16, static_groups=True, act_order=True, mse=True, mse_weighted=True
    )
    d = torch.diag(h)
    expected = torch.stack(
        [
            find_params(w[:, a : a + 16], NearestRounding(4), True, True, col_weights=d[a : a + 16])[0]
            for a in (0, 16, 32)
        ],
        1,
    )
    assert torch.equal(res.scales.float(), expected)


@pytest.mark.parametrize("sym", [True, False])
def test_column_into_is_codes_then_residual(sym):
    """The solver's fused column step writes the bits of codes(), then residual() / d (grid.py says so)."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(64, 40, generator=gen)
    r = NearestRounding(3)
    scale, zero = find_params(w, r, sym, mse=False)
    d = torch.tensor(0.37)
    for col in w.T:
        codes, err = torch.empty(64), torch.empty(64)
        r.column_into(col, scale, zero, d, codes, err)
        q = r.codes(col, scale, zero)
        assert torch.equal(codes, q)
        assert torch.equal(err, r.residual(col, q, scale, zero) / d)


def test_abs_pow_within_its_rounding_bound():
    """|x|^p as exp(p·ln|x|) against float64's pow on the same float32 inputs. torch's CPU log and exp are Sleef's
    1-ulp functions: ln|x| carries 1 ulp and the product by p another half, so y = p·ln|x| is off by up to 1.5 ulp
    of |y|, an absolute error exp turns into the same relative error, plus exp's own 1 ulp:
    |got/ref − 1| ≤ (1.5·|y| + 1)·2^-23 (observed: 0.75 of it); the assertion allows twice that."""
    x = torch.logspace(-9, 3, 20001, dtype=torch.float64) * torch.where(torch.arange(20001) % 2 == 0, 1.0, -1.0)
    got = grid.abs_pow_(x.float(), 2.4).double()
    ref = x.float().double().abs() ** 2.4  # the same float32 inputs
    y = 2.4 * torch.log(x.abs())
    assert ((got / ref - 1).abs() <= 2 * (1.5 * y.abs() + 1) * 2.0**-23).all()
    assert torch.equal(grid.abs_pow_(torch.zeros(3), 2.4), torch.zeros(3))
