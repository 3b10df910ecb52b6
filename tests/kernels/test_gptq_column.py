"""The fused GPTQ column step (kernels/gptq_column.py) against the torch operations it replaces
(grid.NearestRounding.codes and .residual, then the division by U_jj): bit for bit, since every operation is rounded
on its own in both. In Triton's interpreter on CPU tensors, compiled on a GPU (make gpu-check)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported (tests/conftest.py)

import pytest  # noqa: E402
import torch  # noqa: E402

from matgptq.quantization.grid import NearestRounding  # noqa: E402
from tests.conftest import require_peer  # noqa: E402

require_peer("triton")
from matgptq.kernels.gptq_column import column_step  # noqa: E402
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
