"""The fast multi-bit search returns exactly the brute-force (Algorithm 1) codes."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from matgptq.formats.slicing import position_table
from matgptq.quantization.multibit import MatryoshkaRounding, brute_force_codes, envelope, multibit_loss


@st.composite
def problems(draw):
    c = draw(st.integers(3, 8))
    widths = tuple(sorted(set(draw(st.lists(st.integers(2, c - 1), max_size=4))) | {c}))
    lambdas = tuple(draw(st.sampled_from([0.1, 0.5, 1.0, 2.0, 3.7])) for _ in widths)
    sym = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    return c, widths, lambdas, sym, seed


@settings(max_examples=60, deadline=None)
@given(problems())
def test_fast_search_equals_brute_force(problem):
    c, widths, lambdas, sym, seed = problem
    gen = torch.Generator().manual_seed(seed)
    n = 2000
    scale = (torch.rand(n, generator=gen) * 0.2 + 1e-3).half().float()
    zero = torch.full((n,), 2.0 ** (c - 1)) if sym else torch.randint(0, 2**c, (n,), generator=gen).float()
    w = torch.randn(n, generator=gen) * scale * 2 ** (c - 1) * 1.2  # includes weights beyond the grid
    w[:50] = scale[:50] * (torch.randint(0, 2**c, (50,), generator=gen) - zero[:50])  # exactly on grid points
    w[50:100] = scale[50:100] * (torch.randint(0, 2**c, (50,), generator=gen) + 0.5 - zero[50:100])  # midpoints
    rounding = MatryoshkaRounding(c, widths, lambdas)
    assert torch.equal(rounding.codes(w, scale, zero), brute_force_codes(w, scale, zero, c, widths, lambdas))
    # 2-D weights with one (scale, zero) per row broadcast over columns, as the MSE scale search calls it
    w2, s2, z2 = w.view(40, 50), scale[:40].unsqueeze(1), zero[:40].unsqueeze(1)
    assert torch.equal(rounding.codes(w2, s2, z2), brute_force_codes(w2, s2, z2, c, widths, lambdas))


def test_ties_go_to_the_lowest_code_like_argmin():
    # single width: midpoints between two codes tie exactly; the enumeration keeps the lower code
    w = torch.tensor([0.5, 1.5, -0.5, 2.5])
    one = torch.ones(4)
    fast = MatryoshkaRounding(4, (4,), (1.0,)).codes(w, one, torch.zeros(4))
    assert torch.equal(fast, torch.tensor([0.0, 1.0, 0.0, 2.0]))
    assert torch.equal(fast, brute_force_codes(w, one, torch.zeros(4), 4, (4,), (1.0,)))


def test_envelope_is_the_argmin_of_the_objective_on_a_fine_grid():
    codes, breaks = envelope(8, (3, 4, 8), (1.0, 1.0, 1.0))
    u = torch.linspace(-3, 258, 5000, dtype=torch.float64)
    pos = position_table(8, (3, 4, 8)).double()
    obj = ((u[None, None, :] - pos[:, :, None]) ** 2).sum(0)  # [2^c, points]
    expected = obj.argmin(0)
    got = codes[torch.searchsorted(breaks, u)]
    assert torch.equal(got, expected)


def test_search_evaluates_far_fewer_candidates_than_brute_force():
    r = MatryoshkaRounding(8, (3, 4, 8), (1.0, 1.0, 1.0))
    assert r.exact_lookup and r.cells_per_step <= 64  # one table cell lookup per weight (≤ 3 candidates near ties)


def test_propagated_error_is_unweighted_mean_over_widths():
    r = MatryoshkaRounding(8, (3, 4, 8), (5.0, 1.0, 0.1))
    w, s, z = torch.tensor([0.37]), torch.tensor([0.01]), torch.tensor([128.0])
    q = r.codes(w, s, z)
    per_width = [w - s * (position_table(8, (b,))[0, int(q)] - z) for b in (3, 4, 8)]
    assert torch.allclose(r.residual(w, q, s, z), sum(per_width) / 3)
    loss = multibit_loss(w, q.long(), s, z, r.table, r.lambda_t)
    assert torch.allclose(loss, sum(lam * e**2 for lam, e in zip((5.0, 1.0, 0.1), per_width)))
