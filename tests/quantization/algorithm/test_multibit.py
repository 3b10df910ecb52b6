"""The fast multi-bit search returns exactly the brute-force (Algorithm 1) codes."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from matgptq.formats.slicing import position_table
from matgptq.quantization.algorithm.multibit import (
    MatryoshkaRounding,
    PerWidthRounding,
    brute_force_codes,
    envelope,
    multibit_loss,
)


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
    same_minimiser(
        rounding.codes(w, scale, zero),
        brute_force_codes(w, scale, zero, c, widths, lambdas),
        w,
        scale,
        zero,
        c,
        widths,
        lambdas,
    )
    # 2-D weights with one (scale, zero) per row broadcast over columns, as the MSE scale search calls it
    w2, s2, z2 = w.view(40, 50), scale[:40].unsqueeze(1), zero[:40].unsqueeze(1)
    same_minimiser(
        rounding.codes(w2, s2, z2), brute_force_codes(w2, s2, z2, c, widths, lambdas), w2, s2, z2, c, widths, lambdas
    )


def same_minimiser(fast, brute, w, scale, zero, c, widths, lambdas) -> None:
    """The fast codes equal the float32 enumeration's, except where float32 cannot tell the two codes apart: there the
    fast code must be the better one in float64 (the exact minimiser). Found by this test (c=8, R=(2, 8), λ=(3.7, 0.1),
    u = 238.5016): the objective is ~8000 while the two codes differ by 3e-4, below float32's resolution there.
    Bound: each float32 loss Σ_r λ_r (w − s·(D_r − z))² is computed with a relative error of at most a few 2^-24 of
    the terms it sums, plus the cancellation in w − s·(D_r − z), |error| ≤ 2^-24·s·|D_r − z| per difference; so two
    losses closer than 2^-20·Σ_r λ_r·s²·((u − D_r)² + 2|u − D_r|·|D_r − z| + (D_r − z)²) are a float32 tie."""
    differ = fast != brute
    if not differ.any():
        return
    table = position_table(c, widths).T.contiguous().double()
    lam = torch.tensor(lambdas, dtype=torch.float64)
    w64, s64 = w.double().expand_as(fast)[differ], scale.double().expand_as(fast)[differ]
    z64 = zero.double().expand_as(fast)[differ] if torch.is_tensor(zero) else torch.full_like(w64, float(zero))
    exact = {
        k: multibit_loss(w64, codes[differ].long(), s64, z64, table, lam)
        for k, codes in (("fast", fast), ("brute", brute))
    }
    pos = table[brute[differ].long()]  # [m, |R|]
    u = (w64 / s64 + z64).unsqueeze(-1)
    terms = (u - pos) ** 2 + 2 * (u - pos).abs() * (pos - z64.unsqueeze(-1)).abs() + (pos - z64.unsqueeze(-1)) ** 2
    tie = 2.0**-20 * (s64**2) * (terms * lam).sum(-1)
    assert ((exact["brute"] - exact["fast"]).abs() <= tie).all(), (
        "fast and enumerated codes differ beyond a float32 tie"
    )
    assert (exact["fast"] <= exact["brute"]).all(), "where float32 ties, the fast code must be the exact minimiser"


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


def brute_force_tracks(u: torch.Tensor, c: int, widths: tuple[int, ...], lambdas: tuple[float, ...]) -> torch.Tensor:
    """Σ_r λ_r (u_r − D_r(q))² for every master code q (float64): [N, 2^c], from u [R, N] on the master grid."""
    pos = position_table(c, widths).double()  # [R, 2^c]
    lam = torch.tensor(lambdas, dtype=torch.float64)
    return (lam[:, None, None] * (u[:, :, None] - pos[:, None, :]) ** 2).sum(0)


@settings(max_examples=60, deadline=None)
@given(problems(), st.sampled_from([0.0, 0.3, 3.0, 40.0]))
def test_per_width_codes_minimise_the_objective_like_enumeration(problem, spread):
    """PerWidthRounding's cell search returns a brute-force minimiser for per-track targets (module docstring), the
    the same from the host's window loop (numpy) and the GPU's scoring of every cell (torch)."""
    c, widths, lambdas, sym, seed = problem
    gen = torch.Generator().manual_seed(seed)
    n, t = 1500, len(widths)
    scale = (torch.rand(n, generator=gen, dtype=torch.float64) * 0.2 + 1e-3).half().double()
    zero = (
        torch.full((n,), 2.0 ** (c - 1), dtype=torch.float64)
        if sym
        else torch.randint(0, 2**c, (n,), generator=gen).double()
    )
    base = torch.rand(n, generator=gen, dtype=torch.float64) * (2**c + 6) - 3  # positions, some beyond the grid
    base[:100] = torch.randint(0, 2**c, (100,), generator=gen).double() + 0.5 * (torch.arange(100) % 2)  # ties
    u = base + spread * torch.randn(t, n, generator=gen, dtype=torch.float64)  # the tracks drift apart
    w = scale * (u - zero)
    rounding = PerWidthRounding(c, widths, lambdas)
    got = rounding.codes_tracks(w, scale, zero).long()
    tables = rounding._device_tables(torch.device("cpu"))
    on_gpu = rounding._search_all(w / scale + zero, *tables[:2])
    assert torch.equal(on_gpu.long(), got)  # the GPU's search over every cell (here on CPU tensors): the host's codes
    obj = brute_force_tracks(w / scale + zero, c, widths, lambdas)
    best = obj.min(1).values
    chosen = obj.gather(1, got[:, None])[:, 0]
    assert torch.allclose(chosen, best, rtol=1e-12, atol=1e-9)  # always a minimiser
    clear = (obj - best[:, None] > 1e-7).sum(1) == obj.shape[1] - 1  # a unique minimiser beyond float noise
    assert torch.equal(got[clear], obj.argmin(1)[clear])


def test_per_width_codes_with_equal_tracks_are_the_paper_codes():
    """With no drift between tracks the objective is Algorithm 1's: same codes as the envelope search."""
    gen = torch.Generator().manual_seed(0)
    scale, zero = torch.full((3000,), 0.01), torch.full((3000,), 128.0)
    w = torch.randn(3000, generator=gen) * 0.6
    paper = MatryoshkaRounding(8, (3, 4, 8), (1.0, 1.0, 4.0)).codes(w, scale, zero)
    per_width = PerWidthRounding(8, (3, 4, 8), (1.0, 1.0, 4.0)).codes_tracks(w.expand(3, -1), scale, zero)
    assert (paper == per_width).float().mean() > 0.999  # differ only where float noise decides a near-tie
    u = (w / scale + zero).double()
    obj = brute_force_tracks(u.expand(3, -1), 8, (3, 4, 8), (1.0, 1.0, 4.0))
    differ = paper != per_width
    gap = obj.gather(1, paper.long()[:, None]) - obj.gather(1, per_width.long()[:, None])
    assert (gap[differ].abs() < 1e-6).all()


def test_per_width_residual_is_each_tracks_own_slice_error():
    r = PerWidthRounding(8, (3, 4, 8), (1.0, 1.0, 1.0))
    w = torch.tensor([[0.37, -0.2], [0.36, -0.21], [0.35, -0.19]])
    s, z = torch.tensor([0.01, 0.01]), torch.tensor([128.0, 128.0])
    q = r.codes_tracks(w, s, z)
    for t, b in enumerate((3, 4, 8)):
        expected = w[t] - s * (position_table(8, (b,))[0, q.long()] - z)
        assert torch.allclose(r.residual_tracks(w, q, s, z)[t], expected)
