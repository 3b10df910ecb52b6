"""The fused GPTQ column step (kernels/gptq_column.py) against the torch operations it replaces
(grid.NearestRounding.codes and .residual, then the division by U_jj): bit for bit, since every operation is rounded
on its own in both. In Triton's interpreter on CPU tensors, compiled on a GPU (make gpu-check)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported (tests/conftest.py)

import pytest  # noqa: E402
import torch  # noqa: E402

from matgptq.quantization.algorithm.grid import NearestRounding  # noqa: E402
from tests.conftest import require_peer  # noqa: E402

require_peer("triton")
from matgptq.kernels.gptq_column import column_step, per_width_step  # noqa: E402
from matgptq.kernels.triton_nested import interpreting  # noqa: E402

if not interpreting() and not torch.cuda.is_available():
    pytest.skip("TRITON_INTERPRET=0 and no CUDA device: nothing can run the kernel", allow_module_level=True)
DEVICE = "cpu" if interpreting() else "cuda"


@pytest.mark.parametrize("bits,sym", [(2, True), (4, False), (8, False)])
def test_fused_column_is_the_torch_operations(bits, sym):
    g = torch.Generator().manual_seed(bits)
    n = 3000  # three programs, the last one partly masked
    w = torch.randn(n, generator=g) * 0.05
    scale = (torch.rand(n, generator=g) * 0.02 + 1e-3).half().float()
    zero = torch.full((n,), 2.0 ** (bits - 1)) if sym else torch.randint(0, 2**bits, (n,), generator=g).float()
    w[:50] = scale[:50] * (torch.arange(50) % 7 - 3 + 0.5)  # exact halves: rint's ties go to even, like torch.round
    w[50:60] = 1e3  # clamped to the top code
    d = torch.tensor(0.37)
    rounding = NearestRounding(bits)
    q = rounding.codes(w, scale, zero)
    e = torch.div(rounding.residual(w, q, scale, zero), d)
    codes, err = torch.empty(n, device=DEVICE), torch.empty(n, device=DEVICE)
    args = [t.to(DEVICE) for t in (w, scale, zero, d)]
    column_step(*args, rounding.maxq, codes, err)
    assert torch.equal(codes.cpu(), q) and torch.equal(err.cpu(), e)


@pytest.mark.parametrize(
    "widths,lambdas", [((3, 4, 8), (1.0, 1.0, 16.0)), ((4, 8), (1.0, 16.0)), ((2, 3, 4, 6), (1.0, 2.0, 1.0, 16.0))]
)
def test_fused_per_width_column_is_the_torch_operations(widths, lambdas):
    """kernels/gptq_column.per_width_step against PerWidthRounding's device path (every cell scored in torch,
    `_search_all`, then residual_tracks and the division): codes and errors bit for bit. Tracks apart by up to a few
    grid steps (as per-width error feedback leaves them), weights beyond both ends of the grid (clamped cells), and
    equal tracks on every sixteenth of a step (where codes tie exactly and the first, the lowest, must win)."""
    from matgptq.quantization.algorithm.multibit import PerWidthRounding

    rounding = PerWidthRounding(widths[-1], widths, lambdas)
    g = torch.Generator().manual_seed(len(widths))
    grid = 2 ** widths[-1] * 16  # equal tracks at every sixteenth of a step, with s = 2^-7: exact in float64
    t, n = len(widths), 200 + grid + 99  # the last program partly masked
    scale = (torch.rand(n, generator=g) * 0.02 + 1e-3).half().float()
    zero = torch.randint(0, 2 ** widths[-1], (n,), generator=g).float()
    w = torch.randn(n, generator=g) * 0.05
    tracks = w + torch.randn(t, n, generator=g) * scale * 3  # [T, N]
    tracks[:, :40] = 1e3  # above the grid
    tracks[:, 40:80] = -1e3  # below it
    scale[200 : 200 + grid] = 2.0**-7
    tracks[:, 200 : 200 + grid] = (torch.arange(grid) / 16 - zero[200 : 200 + grid]) * 2.0**-7
    d = torch.tensor(0.37)
    u = tracks.double() / scale.double() + zero.double()
    cells, n_cells, lam, table = rounding.column_tables(torch.device("cpu"))
    q = rounding._search_all(u, cells, lam).float()
    e = torch.div(rounding.residual_tracks(tracks, q, scale, zero).reshape(-1), d)
    # Algorithm 1's objective over every code, exact on the sixteenths (dyadic, small): tied minimisers exist there,
    # and the first (lowest) one is the choice
    pos = table.double().T  # [T, 2^c]
    exact = ((u[:, 200 : 200 + grid, None] - pos[:, None]) ** 2 * torch.tensor(lambdas)[:, None, None]).sum(0)
    ties = (exact == exact.min(1, keepdim=True).values).sum(1) > 1
    assert int(ties.sum()) > 0 and torch.equal(q[200 : 200 + grid], exact.argmin(1).float())
    codes, err = torch.empty(n, device=DEVICE), torch.empty(t * n, device=DEVICE)
    args = [x.to(DEVICE) for x in (tracks.reshape(-1), scale, zero, d)]
    per_width_step(*args, *(x.to(DEVICE) for x in (cells,)), n_cells, lam.to(DEVICE), table.to(DEVICE), codes, err)
    assert torch.equal(codes.cpu(), q) and torch.equal(err.cpu(), e)
