"""GPTQ/RTN solver against the slow, plainly written reference (quantization/algorithm/reference.py: column by column,
no lazy batches, no tricks)."""

import pytest
import torch

from matgptq.formats.slicing import position_table
from matgptq.quantization.algorithm.grid import NearestRounding, find_params
from matgptq.quantization.algorithm.multibit import MatryoshkaRounding, PerWidthRounding
from matgptq.quantization.algorithm.reference import group_order as reference_group_order
from matgptq.quantization.algorithm.reference import reference_gptq
from matgptq.quantization.algorithm.solver import gptq_quantize, group_aware_order, inverse_hessian_factor, rtn_quantize
from tests.conftest import require_peer


def random_problem(n, k, seed, outliers=True):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen, dtype=torch.float64)
    x = torch.randn(4 * k, k, generator=gen, dtype=torch.float64)
    if outliers:
        x[:, :3] *= 20  # a few large-magnitude channels, as in real activations
    x[:, 5] = 0  # a dead input
    return w, 2 * x.T @ x / x.shape[0], x


def dequant(res):
    s = res.scales.double()[:, res.g_idx.long()]
    z = res.zeros.double()[:, res.g_idx.long()]
    return s * (res.codes.double() - z)


CASES = [
    # (bits, group_size, sym, act_order, static_groups, block_size, group_order)
    (4, -1, True, False, False, 128, False),
    (3, 16, False, False, False, 8, False),  # groups crossing lazy-block boundaries
    (2, 20, True, True, False, 16, False),  # ragged last group (k=70), act-order
    (8, 32, False, True, True, 128, False),
    (4, 24, True, True, True, 7, False),
    (3, 16, True, False, False, 8, True),  # group act-order, groups crossing lazy blocks, ragged last group
    (4, -1, False, False, False, 32, True),  # group act-order with one group per row: act-order, plain layout
    (2, 20, True, False, True, 16, True),  # group act-order with static groups
    (4, 16, True, True, False, 16, True),  # act-order overrides group act-order
]


@pytest.mark.parametrize("bits,group_size,sym,act_order,static_groups,block_size,group_order", CASES)
def test_gptq_matches_reference(bits, group_size, sym, act_order, static_groups, block_size, group_order):
    w, h, _ = random_problem(24, 70, seed=bits * 7 + group_size)
    rounding = NearestRounding(bits)
    res = gptq_quantize(
        w,
        h,
        rounding,
        group_size=group_size,
        sym=sym,
        act_order=act_order,
        static_groups=static_groups,
        damp=0.01,
        block_size=block_size,
        group_order=group_order,
    )
    codes_ref, deq_ref = reference_gptq(w, h, rounding, group_size, sym, act_order, static_groups, 0.01, group_order)
    assert res.codes.shape == (24, 70) and res.codes.dtype == torch.uint8
    assert torch.equal(res.codes.double(), codes_ref)
    assert torch.allclose(dequant(res), deq_ref, atol=1e-12)
    assert int(res.codes.max()) <= 2**bits - 1 and int(res.zeros.max()) <= 2**bits - 1


@pytest.mark.parametrize("group_size,act_order,group_order", [(32, False, True), (-1, True, False), (64, False, False)])
def test_block_buffers_run_the_same_loop(monkeypatch, group_size, act_order, group_order):
    """Full blocks on the fixed buffers of lazy_blocks.BlockGraph (replayed as a CUDA graph on a GPU, run without one
    here) give the reference's codes, and with the weighted MSE search the plain loop's codes, scales and zeros bit
    for bit (the same operations on the same values)."""
    import functools

    from matgptq.quantization.algorithm import lazy_blocks, solver

    w, h, _ = random_problem(24, 300, seed=group_size + 3)
    rounding = NearestRounding(4)
    kw = dict(group_size=group_size, act_order=act_order, group_order=group_order, block_size=64)
    plain = [gptq_quantize(w, h, rounding, mse=m, mse_weighted=m, **kw) for m in (False, True)]
    runs, run = [], lazy_blocks.BlockGraph.run  # the blocks it ran (their first column)
    monkeypatch.setattr(lazy_blocks.BlockGraph, "run", lambda self, *a: runs.append(a[-3]) or run(self, *a))
    monkeypatch.setattr(solver, "_solve", functools.partial(solver._solve, graphs=True))
    buffered = [gptq_quantize(w, h, rounding, mse=m, mse_weighted=m, **kw) for m in (False, True)]
    assert runs == [0, 64, 128, 192] * 2  # the last block (256..300) is short: the plain loop runs it
    codes_ref, _ = reference_gptq(w, h, rounding, group_size, True, act_order, False, 0.01, group_order)
    assert torch.equal(buffered[0].codes.double(), codes_ref)
    for a, b in zip(plain, buffered):
        assert all(
            torch.equal(x, y)
            for x, y in zip((a.codes, a.scales, a.zeros, a.g_idx), (b.codes, b.scales, b.zeros, b.g_idx))
        )


def test_matgptq_matches_reference():
    w, h, _ = random_problem(16, 50, seed=3)
    rounding = MatryoshkaRounding(8, (3, 4, 8), (1.0, 1.0, 1.0))
    res = gptq_quantize(w, h, rounding, group_size=16, sym=True, act_order=True, block_size=8)
    codes_ref, _ = reference_gptq(w, h, rounding, 16, True, True, False, 0.01)
    assert torch.equal(res.codes.double(), codes_ref)


def reference_per_width_gptq(w, h, c, widths, lambdas, group_size, damp=0.01):
    """GPTQ with one weight copy per width, each updated only by its own slice's error (the plain recursion run
    len(widths) times in lockstep); the shared code of a column enumerates all 2^c codes. Float64."""
    w, h = w.double().clone(), h.double().clone()
    k = w.shape[1]
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    h = h + damp * torch.diag(h).mean() * torch.eye(k, dtype=h.dtype)
    u = torch.linalg.cholesky(torch.linalg.inv(h), upper=True)
    tracks = [w.clone() for _ in widths]
    lam = torch.tensor(lambdas, dtype=torch.float64)
    pos = position_table(c, widths).double()  # [R, 2^c]
    paper = MatryoshkaRounding(c, widths, lambdas)  # the parameter search sees the λ-mean track
    codes = torch.zeros_like(w)
    for j in range(k):
        if j % group_size == 0:
            mean = sum(lam[t] * tracks[t][:, j : j + group_size] for t in range(len(widths))) / lam.sum()
            scale, zero = (t[:, None] for t in find_params(mean, paper, True, False))
        objective = sum(
            lam[t] * (tracks[t][:, j, None] - scale * (pos[t][None] - zero)) ** 2 for t in range(len(widths))
        )
        q = objective.argmin(1)
        codes[:, j] = q.double()
        for t in range(len(widths)):
            err = (tracks[t][:, j] - scale[:, 0] * (pos[t][q] - zero[:, 0])) / u[j, j]
            for col in range(j, k):
                tracks[t][:, col] -= err * u[j, col]
    return codes


def test_per_width_matgptq_matches_reference():
    w, h, _ = random_problem(16, 50, seed=4)
    rounding = PerWidthRounding(8, (3, 4, 8), (1.0, 1.0, 2.0))
    res = gptq_quantize(w, h, rounding, group_size=16, sym=True, block_size=8)
    codes_ref = reference_per_width_gptq(w, h, 8, (3, 4, 8), (1.0, 1.0, 2.0), 16)
    assert torch.equal(res.codes.double(), codes_ref)


@pytest.mark.parametrize("group_size,group_order", [(16, False), (16, True), (-1, False)])
def test_per_width_block_buffers_run_the_same_loop(monkeypatch, group_size, group_order):
    """MatGPTQ's per-width rounding on the fixed buffers of lazy_blocks.BlockGraph (a CUDA graph on a GPU; here run
    without one): the slow reference's codes, and the plain loop's codes, scales and zeros bit for bit; with --mse
    (codes from the host) the layer keeps the plain loop."""
    import functools

    from matgptq.quantization.algorithm import lazy_blocks, solver

    w, h, _ = random_problem(16, 80, seed=5)
    rounding = PerWidthRounding(8, (3, 4, 8), (1.0, 1.0, 2.0))
    kw = dict(group_size=group_size, sym=True, block_size=16, group_order=group_order)
    plain = gptq_quantize(w, h, rounding, **kw)
    runs, run = [], lazy_blocks.BlockGraph.run
    monkeypatch.setattr(lazy_blocks.BlockGraph, "run", lambda self, *a: runs.append(a[-3]) or run(self, *a))
    monkeypatch.setattr(solver, "_solve", functools.partial(solver._solve, graphs=True))
    buffered = gptq_quantize(w, h, rounding, **kw)
    assert runs == [0, 16, 32, 48, 64]
    if not group_order:
        assert torch.equal(
            buffered.codes.double(),
            reference_per_width_gptq(w, h, 8, (3, 4, 8), (1.0, 1.0, 2.0), 80 if group_size == -1 else group_size),
        )
    for x, y in zip(
        (plain.codes, plain.scales, plain.zeros, plain.g_idx),
        (buffered.codes, buffered.scales, buffered.zeros, buffered.g_idx),
    ):
        assert torch.equal(x, y)
    runs.clear()
    gptq_quantize(w, h, rounding, mse=True, **kw)
    assert runs == []


def output_error(w, deq, x):
    return torch.linalg.norm((w - deq) @ x.T) / torch.linalg.norm(w @ x.T)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("group_size", [-1, 32])
def test_gptq_beats_rtn_on_layer_output(bits, group_size):
    w, h, x = random_problem(64, 96, seed=bits)
    rounding = NearestRounding(bits)
    gptq = gptq_quantize(w, h, rounding, group_size=group_size, sym=True)
    rtn = rtn_quantize(w, rounding, group_size, sym=True)
    assert output_error(w, dequant(gptq), x) < output_error(w, dequant(rtn), x)


def test_act_order_g_idx_and_static_groups_layout():
    w, h, _ = random_problem(8, 40, seed=1)
    r = NearestRounding(4)
    dynamic = gptq_quantize(w, h, r, group_size=16, act_order=True)
    order = torch.argsort(torch.diag(h), descending=True, stable=True)
    expected = torch.empty(40, dtype=torch.int64)
    expected[order] = torch.arange(40) // 16
    assert torch.equal(dynamic.g_idx.long(), expected) and torch.equal(dynamic.perm, order)
    static = gptq_quantize(w, h, r, group_size=16, act_order=True, static_groups=True)
    assert torch.equal(static.g_idx.long(), torch.arange(40) // 16) and static.perm is None  # nothing to undo
    assert static.scales.shape == (8, 3)  # ceil(40 / 16) groups, the last one ragged


@pytest.mark.parametrize("mse,weighted", [(False, False), (True, False), (True, True)])
def test_per_channel_act_order_with_static_groups_is_group_act_order(mse, weighted):
    """One group per row: GAR's order is the columns by decreasing diag H, act order's too, and the one group's
    scale comes from the weights before any update either way, so GPTQ's default (act order, static groups) and GAR
    give the same codes and scales, bit for bit, per channel."""
    for seed in range(5):
        w, h, _ = random_problem(32, 96, seed)
        kw = dict(group_size=-1, mse=mse, mse_weighted=weighted)
        ao = gptq_quantize(w, h, NearestRounding(3), act_order=True, static_groups=True, **kw)
        gar = gptq_quantize(w, h, NearestRounding(3), group_order=True, **kw)
        assert torch.equal(ao.codes, gar.codes) and torch.equal(ao.scales, gar.scales), seed
        assert torch.equal(ao.g_idx, gar.g_idx) and ao.perm is None and gar.perm is None


def test_group_act_order_keeps_the_plain_layout():
    """Groups stay whole, so a group act-order result stores no permutation and the plain g_idx, and its order
    differs from the natural one (the test would pass vacuously otherwise)."""
    w, h, _ = random_problem(8, 70, seed=2)
    res = gptq_quantize(w, h, NearestRounding(3), group_size=16, group_order=True)
    assert res.perm is None and torch.equal(res.g_idx.long(), torch.arange(70) // 16)
    assert not torch.equal(reference_group_order(torch.diag(h), 16), torch.arange(70))
    plain = gptq_quantize(w, h, NearestRounding(3), group_size=16)
    assert not torch.equal(res.codes, plain.codes)


def test_group_order_matches_gptqmodel():
    """The order is GPTQModel's GAR (gptqmodel.quantization.gar, its default `act_group_aware`) where GPTQModel
    defines it: K a multiple of the group size (it leaves a ragged tail in place; we sort inside it), no exact ties
    (its sort inside a group is not stable, so tied columns may come in either order; ours keep theirs)."""
    gar = require_peer("gptqmodel.quantization.gar")
    gen = torch.Generator().manual_seed(0)
    for k, g in [(128, 32), (576, 128), (96, 96)]:  # 576: SmolLM2's width, 4 groups of 128 and a tail of 64
        diag = torch.rand(k, generator=gen) ** 4
        local, values = gar.compute_local_perms(diag, g, return_values=True)
        theirs = gar.compose_final_perm(local, gar.compute_global_perm(diag, g, precomputed_values=values), g)
        ours = group_aware_order(diag, g)
        assert torch.equal(ours[: len(theirs)], theirs)
        assert sorted(ours[len(theirs) :].tolist()) == list(range(len(theirs), k))  # the tail: last, whole
    assert torch.equal(group_aware_order(diag, -1), torch.argsort(diag, descending=True, stable=True))


def test_damping_retries_when_hessian_not_positive_definite():
    w = torch.randn(4, 6, dtype=torch.float64)
    x = torch.randn(3, 6, dtype=torch.float64)  # fewer samples than inputs: rank 3
    h = x.T @ x
    h -= 0.05 * torch.diag(h).mean() * torch.eye(6, dtype=torch.float64)  # eigenvalues -0.05·mean: 1% damping fails
    with pytest.raises(RuntimeError):
        torch.linalg.cholesky(h + 0.01 * torch.diag(h).mean() * torch.eye(6, dtype=torch.float64))
    res = gptq_quantize(w, h, NearestRounding(4), damp=0.01)
    assert res.damp == pytest.approx(0.1)


@pytest.mark.parametrize("k,seed", [(64, 0), (576, 1)])
def test_one_cholesky_factor_is_the_inverse_hessians_cholesky_factor(k, seed):
    """The factor of one Cholesky of the flipped Hessian and one triangular inverse against the textbook Cholesky of
    the inverse in float64, both paths run in float32. Bound: a backward-stable Cholesky and triangular inverse each
    perturb H by at most ~n·ε relative, and a relative perturbation η of H moves its factors by at most κ₂(H)·η
    (first-order Cholesky perturbation), so ‖ΔU‖_F/‖U‖_F ≤ 2·n·ε₃₂·κ₂(H) for either path; the two paths then differ by
    at most twice that."""
    _, h, _ = random_problem(8, k, seed)
    damped = h + 0.01 * torch.diag(h).mean() * torch.eye(k, dtype=torch.float64)
    truth = torch.linalg.cholesky(torch.linalg.inv(damped), upper=True)
    new, damp = inverse_hessian_factor(h.float(), 0.01)
    textbook = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(damped.float())), upper=True)
    bound = 2 * k * torch.finfo(torch.float32).eps * torch.linalg.cond(damped).item()
    rel = lambda u, v: float((u.double() - v.double()).norm() / v.norm())  # noqa: E731
    assert damp == 0.01 and torch.equal(new, new.triu()) and bool((new.diagonal() > 0).all())
    assert rel(new, truth) <= bound and rel(textbook, truth) <= bound
    assert rel(new, textbook) <= 2 * bound


def test_scales_are_float16_and_zeros_in_range():
    w, h, _ = random_problem(16, 64, seed=9)
    w[3] = 0  # an all-zero row must not give a zero scale
    w[4] = w[4].abs()  # all-positive row, asym zero must stay in range
    res = gptq_quantize(w, h, NearestRounding(3), group_size=32, sym=False, mse=True)
    assert res.scales.dtype == torch.float16 and bool((res.scales > 0).all())
    assert 0 <= int(res.zeros.min()) and int(res.zeros.max()) <= 7


def test_static_groups_without_act_order_use_original_weights():
    w, h, _ = random_problem(12, 64, seed=4)
    r = NearestRounding(3)
    res = gptq_quantize(w, h, r, group_size=16, static_groups=True)
    codes_ref, _ = reference_gptq(w, h, r, 16, True, False, True, 0.01)
    assert torch.equal(res.codes.double(), codes_ref)
    expected_scales = torch.stack([find_params(w[:, a : a + 16], r, True, False)[0] for a in range(0, 64, 16)], 1)
    assert torch.equal(res.scales.double(), expected_scales.half().double())


def test_signed_scale_grid_puts_the_extreme_weight_on_code_zero():
    from matgptq.quantization.algorithm.grid import minmax_params

    w = torch.tensor([[0.5, -0.25, 1.5, -1.0], [-2.0, 0.5, 1.0, 1.75]])
    scale, zero = minmax_params(w, 4, sym=True, signed=True)
    assert torch.equal(scale, torch.tensor([1.5 / -8, -2.0 / -8]))  # sign of the largest-|w| weight, / -2^(b-1)
    codes = NearestRounding(4).codes(w, scale.unsqueeze(1), zero.unsqueeze(1))
    assert codes[0, 2] == 0 and codes[1, 0] == 0  # extreme weights exactly on level -8
    assert torch.equal(
        scale.unsqueeze(1) * (codes[:, [2, 0]].diag().unsqueeze(1) - zero.unsqueeze(1)), torch.tensor([[1.5], [-2.0]])
    )


@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_with_signed_scale_matches_reference(act_order, monkeypatch):
    import matgptq.quantization.algorithm.reference as reference

    w, h, _ = random_problem(16, 48, seed=7)
    r = NearestRounding(4)
    res = gptq_quantize(w, h, r, group_size=16, act_order=act_order, signed=True)
    original = reference.find_params  # the reference calls find_params(w, rounding, sym, mse): the signed grid
    monkeypatch.setattr(reference, "find_params", lambda w_, r_, s_, m_: original(w_, r_, s_, m_, signed=True))
    codes_ref, deq_ref = reference_gptq(w, h, r, 16, True, act_order, False, 0.01)
    assert torch.equal(res.codes.double(), codes_ref)
    assert bool((res.scales < 0).any())  # negative scales occur and survive
