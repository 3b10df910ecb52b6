"""The Triton kernels of the nested layout (kernels/triton_nested.py) in Triton's interpreter (TRITON_INTERPRET=1, CPU
tensors) against the dequantized reference x · QuantizedWeight.slice(r).dequantize()ᵀ, on odd shapes (K not a
multiple of 32 or of the block, N not a multiple of the block, short last groups, act-order).

Tolerance (derived): with float32 x the kernels rebuild the weight exactly (bitplanes.py; the tile equals
slice(r).dequantize(), tested bit for bit in test_bitplanes.py) and accumulate in float32 in another order than the
float64 reference, so |y − y_ref| ≤ γ_K · Σ_k |x_k|·|w_k| with γ_K = K·2^-24/(1 − K·2^-24) (the kernels' float32
rounding; the float64 reference's own is ~2^-29 of it), plus 2^-24·|y| for the store. With float16 x (the GPU case, GEMM
only: the weight tile is cast to float16) each weight adds 2^-11·|w| and x is float16 already, so the bound gains
2^-11 · Σ|x|·|w|.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are first compiled (triton_nested.py)

import pytest  # noqa: E402
import torch  # noqa: E402


from matgptq.errors import UserError  # noqa: E402
from matgptq.kernels import NestedLayout  # noqa: E402
from matgptq.kernels.triton_nested import NestedKernel, nested_matmul  # noqa: E402
from tests.conftest import require_peer  # noqa: E402
from tests.conftest import random_parent as parent  # noqa: E402

require_peer("triton")  # the kernels extra; CI installs it (MATGPTQ_REQUIRE_PEERS=1 fails instead of skipping)

U32 = 2.0**-24
# the interpreter itself (triton 3.6 with numpy 2) warns about a numpy scalar conversion: not ours
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning")


def bound(x, w, extra=0.0):
    k = x.shape[-1]
    gamma = k * U32 / (1 - k * U32)
    xa, wa = x.double().abs(), w.double().abs()
    return (gamma + extra) * (xa @ wa.t()) + U32 * (x.double() @ w.double().t()).abs() + 1e-30


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("group,act_order", [(-1, False), (32, True), (64, False), (128, False)])
@pytest.mark.parametrize("kernel,rows", [(NestedKernel.GEMV, 3), (NestedKernel.GEMM, 19)])
def test_kernels_match_the_reference(bits, group, act_order, kernel, rows):
    n, k = 40, 150  # odd: 5 words of 32 with 10 padded columns, a short last group, N not a multiple of 32
    q = parent(n, k, group, act_order, width_scales=True, seed=bits)
    layout = NestedLayout.build(q)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    w = q.slice(bits).dequantize()
    y = nested_matmul(x, layout, bits, kernel, block_n=32, block_k=64, block_m=16)
    assert ((y.double() - x.double() @ w.double().t()).abs() <= bound(x, w)).all()


def test_float16_gemm_and_batched_shape():
    q = parent(48, 96, 32, False)
    layout = NestedLayout.build(q, widths=(3,))
    x = torch.randn(2, 9, 96, generator=torch.Generator().manual_seed(0)).to(torch.float16)
    y = nested_matmul(x, layout, 3, NestedKernel.GEMM, block_n=32, block_k=32, block_m=16)
    assert y.shape == (2, 9, 48) and y.dtype == torch.float16
    w = q.slice(3).dequantize()
    ref = x.double() @ w.double().t()
    # + 2^-11·|y| for the float16 store of the output
    tol = bound(x.reshape(-1, 96), w, 2.0**-11).view(2, 9, 48) + 2.0**-11 * ref.abs()
    assert ((y.double() - ref).abs() <= tol).all()


def test_bad_requests_are_one_line_errors(monkeypatch):
    layout = NestedLayout.build(parent(16, 64, 32, False), widths=(4,))
    with pytest.raises(UserError, match="serves widths 1..4, not 8"):
        nested_matmul(torch.randn(1, 64), layout, 8)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(UserError, match="need a CUDA GPU") as e:
        nested_matmul(torch.randn(1, 64), layout, 4)
    assert "\n" not in str(e.value)
