"""Per-width scale refit against a direct least-squares solve on the calibration inputs themselves."""

import pytest
import torch

from matgptq.formats.slicing import positions
from matgptq.quantization.algorithm.grid import NearestRounding
from matgptq.quantization.algorithm.multibit import PerWidthRounding
from matgptq.quantization.algorithm.refit import damped_hessian, refit_master, refit_scales, row_error_change
from matgptq.quantization.algorithm.solver import gptq_quantize


def random_problem(n, k, seed):
    """Weights, Hessian H = (2/m)·XᵀX and the inputs X, with a few large input channels as in real activations."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen, dtype=torch.float64)
    x = torch.randn(4 * k, k, generator=gen, dtype=torch.float64)
    x[:, :3] *= 20
    return w, 2 * x.T @ x / x.shape[0], x


def lstsq_scales(w, x, codes, zeros, g_idx, c, r, damp):
    """Per row: min_s ‖X_aug (w − Σ_g s_g p_g)‖² with X_aug = [√(2/n)·X ; √(δ·mean diag H)·I], the damped Hessian
    H + δ·mean(diag H)·I written as a stacked design matrix; solved by torch.linalg.lstsq in float64."""
    n = x.shape[0]
    h = 2 * x.T @ x / n
    x_aug = torch.cat([(2 / n) ** 0.5 * x, (damp * torch.diag(h).mean()) ** 0.5 * torch.eye(x.shape[1], dtype=x.dtype)])
    p = positions(codes, c, r).double() - zeros.double()[:, g_idx.long()]
    groups = int(g_idx.max()) + 1
    out = torch.empty(w.shape[0], groups, dtype=torch.float64)
    for row in range(w.shape[0]):
        design = torch.stack([x_aug @ (p[row] * (g_idx == g)) for g in range(groups)], 1)  # [m, G]
        out[row] = torch.linalg.lstsq(design, (x_aug @ w[row]).unsqueeze(1)).solution[:, 0]
    return out


@pytest.mark.parametrize("group_size", [-1, 14, 16, 24])  # per channel; k = 70: 5 even groups, ragged last groups
@pytest.mark.parametrize("r", [3, 4, 8])
@pytest.mark.parametrize("act_order", [False, True])  # act order: each group's columns scattered over the row
def test_refit_is_the_least_squares_scale(group_size, r, act_order):
    w, h, x = random_problem(12, 70, seed=group_size + r)
    res = gptq_quantize(
        w, h, PerWidthRounding(8, (3, 4, 8), (1.0, 1.0, 1.0)), group_size=group_size, block_size=16, act_order=act_order
    )
    got = refit_scales(w, h, res.codes, res.scales, res.zeros, res.g_idx, 8, (2, r), damp=0.01)[r]
    expected = lstsq_scales(w, x, res.codes, res.zeros, res.g_idx, 8, r, 0.01)
    assert got.dtype == torch.float16 and got.shape == res.scales.shape
    # both are the same float64-accurate optimum rounded to float16: equal, or one float16 step apart where the
    # optimum lies within float64 noise of a rounding boundary (a relative step is 2^-10 at most)
    assert torch.allclose(got.double(), expected, rtol=2**-10, atol=0)


def layer_error(w, h, scales, codes, zeros, g_idx, r, master=8):
    p = positions(codes, master, r).double() - zeros.double()[:, g_idx.long()]
    e = w - scales.double()[:, g_idx.long()] * p
    return torch.einsum("nk,kl,nl->n", e, h, e)


def test_refit_never_loses_to_the_master_scale_and_gains_at_low_widths():
    w, h, _ = random_problem(32, 64, seed=11)
    res = gptq_quantize(w, h, PerWidthRounding(8, (3, 4, 8), (1.0, 1.0, 1.0)), group_size=32, block_size=16)
    for r in (2, 3, 4, 6):
        fit = refit_scales(w, h, res.codes, res.scales, res.zeros, res.g_idx, 8, (r,), damp=0.01)[r]
        before = layer_error(w, h, res.scales, res.codes, res.zeros, res.g_idx, r)
        after = layer_error(w, h, fit, res.codes, res.zeros, res.g_idx, r)
        # optimal for the damped H and then rounded to float16: allow that rounding's share of the error (2^-11)
        assert (after <= before * (1 + 2**-10)).all()
        assert after.sum() < before.sum()


def test_a_group_with_no_signal_keeps_its_master_scale():
    w, h, _ = random_problem(4, 32, seed=2)
    res = gptq_quantize(w, h, PerWidthRounding(8, (3, 4, 8), (1.0, 1.0, 1.0)), group_size=16, block_size=16)
    codes = res.codes.clone()
    codes[0, :16] = 128  # every position of row 0, group 0 is the zero point: p = 0
    fit = refit_scales(w, h, codes, res.scales, res.zeros, res.g_idx, 8, (3, 5), damp=0.01)[3]
    assert fit[0, 0] == res.scales[0, 0] and torch.isfinite(fit.float()).all()


@pytest.mark.parametrize("group_size", [-1, 16])
@pytest.mark.parametrize("signed", [False, True])  # llama.cpp's Q4_0 grid: scales of either sign
@pytest.mark.parametrize("act_order", [False, True])  # with static groups: g_idx in the original column order
def test_master_refit_is_the_least_squares_scale_where_it_helps(group_size, signed, act_order):
    """GPTQ-4's own codes refit: each row equals the float64 lstsq optimum (to float16) or keeps the solver's scales,
    and it keeps them only where the optimum, rounded, would not lower that row's error."""
    w, h, x = random_problem(16, 64, seed=5 + group_size)
    res = gptq_quantize(
        w,
        h,
        NearestRounding(4),
        group_size=group_size,
        block_size=16,
        signed=signed,
        mse=True,
        act_order=act_order,
        static_groups=act_order,
    )
    got = refit_master(w, h, res.codes, res.scales, res.zeros, res.g_idx, 4, damp=0.01)
    expected = lstsq_scales(w, x, res.codes, res.zeros, res.g_idx, 4, 4, 0.01)
    damped = h + 0.01 * torch.diag(h).mean() * torch.eye(h.shape[0], dtype=h.dtype)
    before = layer_error(w, damped, res.scales, res.codes, res.zeros, res.g_idx, 4, master=4)
    after = layer_error(w, damped, got, res.codes, res.zeros, res.g_idx, 4, master=4)
    refit = (got != res.scales).any(1)
    # rounding tolerance as in test_refit_is_the_least_squares_scale
    assert torch.allclose(got[refit].double(), expected[refit], rtol=2**-10, atol=0)
    # kept per row only where smaller; both sides are float64 sums of K² = 4096 terms, so they agree with refit's own
    # comparison to ~K·2^-53 relative: 1e-12 covers that and nothing a real loss could hide in
    assert (after <= before * (1 + 1e-12)).all()
    assert refit.float().mean() > 0.5 and after.sum() < 0.97 * before.sum()  # GPTQ's grid is not its codes' optimum


def test_master_refit_snapped_to_a_lattice_never_grows_the_error():
    """A snap that ruins the fit (every scale halved) is refused row by row: the solver's scales stay."""
    w, h, _ = random_problem(8, 64, seed=3)
    res = gptq_quantize(w, h, NearestRounding(4), group_size=16, block_size=16)
    got = refit_master(w, h, res.codes, res.scales, res.zeros, res.g_idx, 4, damp=0.01, snap=lambda s: s / 2)
    assert torch.equal(got, res.scales)


def test_row_error_change_is_the_difference_of_the_two_errors():
    """The guard's one-product identity against the two errors computed directly, dead inputs included."""
    w, h, _ = random_problem(8, 48, seed=4)
    h = h.clone()
    h[5, :], h[:, 5] = 0, 0  # a dead input: zeroed in w, as the solver does
    gen = torch.Generator().manual_seed(0)
    old, new = (w + 0.1 * torch.randn(w.shape, generator=gen) for _ in range(2))
    hd, dead = damped_hessian(h, 0.01)

    def err(deq):
        e = w.double().masked_fill(dead, 0) - deq.double()
        return torch.einsum("nk,kl,nl->n", e, hd, e)

    # float64 sums of K² = 2304 terms of size ~|e|²·|H|: both sides agree to ~K·2^-53 of the errors themselves
    want = err(new) - err(old)
    assert torch.allclose(row_error_change(w, hd, dead, old, new), want, rtol=0, atol=1e-12 * float(err(old).max()))
