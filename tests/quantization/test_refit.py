"""Per-width scale refit against a direct least-squares solve on the calibration inputs themselves."""

import pytest
import torch

from matgptq.formats.slicing import positions
from matgptq.quantization.multibit import PerWidthRounding
from matgptq.quantization.refit import refit_scales
from matgptq.quantization.solver import gptq_quantize


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
    res = gptq_quantize(w, h, PerWidthRounding(8, (3, 4, 8), (1.0, 1.0, 1.0)), group_size=group_size, block_size=16,
                        act_order=act_order)  # fmt: skip
    got = refit_scales(w, h, res.codes, res.scales, res.zeros, res.g_idx, 8, (2, r), damp=0.01)[r]
    expected = lstsq_scales(w, x, res.codes, res.zeros, res.g_idx, 8, r, 0.01)
    assert got.dtype == torch.float16 and got.shape == res.scales.shape
    # both are the same float64-accurate optimum rounded to float16: equal, or one float16 step apart where the
    # optimum lies within float64 noise of a rounding boundary (a relative step is 2^-10 at most)
    assert torch.allclose(got.double(), expected, rtol=2**-10, atol=0)


def layer_error(w, h, scales, codes, zeros, g_idx, r):
    p = positions(codes, 8, r).double() - zeros.double()[:, g_idx.long()]
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
