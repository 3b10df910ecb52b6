"""The Triton kernels of the nested layout (kernels/triton_nested.py) against the dequantized reference
x · QuantizedWeight.slice(r).dequantize()ᵀ, on odd shapes (K not a multiple of 32 or of the block, N not a multiple
of the block, short last groups, act-order), on a parent's layout and on a slice's. Compiled on a CUDA GPU when
TRITON_INTERPRET=0 (make gpu-check), otherwise in Triton's interpreter on CPU tensors (tests/conftest.py).

Tolerance (derived): with float32 x the kernels rebuild every weight's S(q, r) exactly (bitplanes.py; tested bit for
bit in test_bitplanes.py) and compute in float32 in another order than the float64 reference. The word path sums
s·(2^h·Σ x·S − z·Σ x) per word; every term of that evaluation is a product of x_k with s, S_k·2^h or z, so its
rounding error is at most γ_n·Σ_k |x_k|·s_k·(S_k·2^h + z_k) with n ≤ K + 8 operations on any path (K − 1 additions,
the products and the word's combination; γ_n = n·2^-24/(1 − n·2^-24)); the generic path's Σ|x|·|s·(S·2^h − z)| is
smaller, so the same bound holds. Plus 2^-24·|y| for the float32 store (or split-K's last atomic add). With float16
x (GEMM: the weight tile is cast to float16) each weight adds 2^-11·|w| ≤ 2^-11·s·(S·2^h + z), and a float16 store
2^-11·|y|.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are first compiled (triton_nested.py)

import pytest  # noqa: E402
import torch  # noqa: E402

from matgptq.errors import UserError  # noqa: E402
from matgptq.kernels import NestedLayout  # noqa: E402
from matgptq.kernels.triton_nested import NestedKernel, nested_matmul  # noqa: E402
from tests.conftest import random_parent as parent  # noqa: E402
from tests.conftest import require_peer  # noqa: E402

require_peer("triton")  # the kernels extra; CI installs it (MATGPTQ_REQUIRE_PEERS=1 fails instead of skipping)
from matgptq.kernels.triton_nested import Tiles, interpreting  # noqa: E402

if not interpreting() and not torch.cuda.is_available():
    pytest.skip("TRITON_INTERPRET=0 and no CUDA device: nothing can run the kernels", allow_module_level=True)
DEVICE = "cpu" if interpreting() else "cuda"

U32 = 2.0**-24
# the interpreter itself (triton 3.6 with numpy 2) warns about a numpy scalar conversion: not ours
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning")


def magnitude(q, bits):
    """s·(S·2^h + z) per weight [N, K] of the r-bit slice (module doc)."""
    sl = q.slice(bits)
    g = sl.g_idx.long()
    return sl.scales.double()[:, g] * (sl.codes.double() * 2.0**sl.shift + sl.zeros.double()[:, g])


def bound(x, q, bits, extra=0.0, store=U32):
    x = x.double().cpu()
    k = x.shape[-1] + 8
    gamma = k * U32 / (1 - k * U32)
    ref = x @ q.slice(bits).dequantize().double().t()
    return (gamma + extra) * (x.abs() @ magnitude(q, bits).t()) + store * ref.abs() + 1e-30, ref


def check(y, x, q, bits, **kw):
    tol, ref = bound(x, q, bits, **kw)
    err = (y.double().cpu() - ref).abs()
    assert (err <= tol).all(), f"max error {float(err.max()):.3g}, its bound {float(tol.flatten()[err.argmax()]):.3g}"


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("group,act_order", [(-1, False), (32, True), (64, False), (128, False)])
@pytest.mark.parametrize("kernel,rows", [(NestedKernel.GEMV, 3), (NestedKernel.GEMM, 19)])
def test_kernels_match_the_reference(bits, group, act_order, kernel, rows):
    n, k = 40, 150  # odd: 5 words of 32 with 10 padded columns, a short last group, N not a multiple of 32
    q = parent(n, k, group, act_order, width_scales=True, seed=bits)
    layout = NestedLayout.build(q).to(DEVICE)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    tiles = Tiles(block_n=32, block_k=64) if kernel == NestedKernel.GEMV else Tiles(32, 512, 16)  # word paths
    check(nested_matmul(x.to(DEVICE), layout, bits, kernel, tiles), x, q, bits)


@pytest.mark.parametrize("bits", [2, 4, 7])
@pytest.mark.parametrize("kernel", [NestedKernel.GEMV, NestedKernel.GEMM])
def test_a_slice_layout_holds_r_planes_and_serves_its_width(bits, kernel):
    q = parent(48, 200, 64, True, width_scales=True, seed=bits)
    sl = q.slice(bits)
    layout = NestedLayout.build(sl).to(DEVICE)
    assert layout.planes.shape[0] == bits and layout.widths == (bits,)  # 7 < c = 8: a true slice
    x = torch.randn(5, 200, generator=torch.Generator().manual_seed(1))
    check(nested_matmul(x.to(DEVICE), layout, bits, kernel, Tiles(block_n=32, block_k=32)), x, q, bits)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("k,act_order", [(256, False), (250, True)])
@pytest.mark.parametrize("inplace", [True, False])
def test_gemv_without_masks_and_with_lanes_decoded_in_place(bits, k, act_order, inplace):
    """Shapes whose words and outputs fill the blocks (the kernel's EVEN case: no masked load; K = 250 pads x to the
    8 words), with each lane decoded where it lies and x pre-scaled by 2^−o, or shifted down first: the same products
    x·lane (a power-of-two scaling is exact), so the module's bound holds for both."""
    q = parent(64, k, 32, act_order, width_scales=True, seed=bits)
    layout = NestedLayout.build(q).to(DEVICE)
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(k))
    for split_k in (0, 1, 2):  # 0: auto_split's choice
        tiles = Tiles(block_n=32, block_k=64, split_k=split_k, inplace=inplace)
        check(nested_matmul(x.to(DEVICE), layout, bits, NestedKernel.GEMV, tiles), x, q, bits)


@pytest.mark.parametrize("bits", [2, 3, 4, 7, 8])
@pytest.mark.parametrize(
    "kernel,rows,k", [(NestedKernel.GEMV, 2, 256), (NestedKernel.GEMV, 2, 250), (NestedKernel.GEMM, 19, 600)]
)
def test_plane_words_loaded_once(bits, kernel, rows, k):
    """`hoist`: every plane word loaded once and the LB lane offsets composed together (4-bit lanes up to 4 bits, 8-bit
    lanes above; 7 < c reads a carry plane, 8 = c none), masked and unmasked (K = 256 fills GEMV's blocks, 250 and
    GEMM's 600 do not): the same S for every weight, so the module's bound holds."""
    q = parent(64, k, 32, True, width_scales=True, seed=bits)
    layout = NestedLayout.build(q).to(DEVICE)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(k))
    tiles = (
        Tiles(block_n=32, block_k=64, split_k=2, hoist=True)
        if kernel == NestedKernel.GEMV
        else Tiles(32, 512, 16, hoist=True)
    )
    check(nested_matmul(x.to(DEVICE), layout, bits, kernel, tiles), x, q, bits)


def test_auto_split_fills_the_gpu_only_where_the_outputs_do_not():
    from matgptq.kernels.triton_nested import auto_split

    assert auto_split(256, 8, 132) == 1  # 8192² at BLOCK_N 32: two waves of output blocks
    assert auto_split(66, 4, 132) == 1  # half the multiprocessors: still no zeroed buffer
    assert auto_split(32, 4, 132) == 4  # k_proj 1024 × 4096, BLOCK_K 1024: one share per K block
    assert auto_split(32, 14, 132) == 5  # ⌈132 / 32⌉ shares
    assert auto_split(1, 1, 132) == 1


@pytest.mark.parametrize("split_k,block_k", [(2, 32), (3, 64)])
def test_split_k_gemv(split_k, block_k):
    q = parent(72, 300, 32, False, seed=5)
    layout = NestedLayout.build(q, widths=(3, 4)).to(DEVICE)
    x = torch.randn(2, 300, generator=torch.Generator().manual_seed(2))
    for bits in (3, 4):
        y = nested_matmul(
            x.to(DEVICE), layout, bits, NestedKernel.GEMV, Tiles(block_n=64, block_k=block_k, split_k=split_k)
        )
        check(y, x, q, bits)


@pytest.mark.parametrize("kernel,block_k", [(NestedKernel.GEMV, 32), (NestedKernel.GEMM, 32), (NestedKernel.GEMM, 512)])
def test_float16_and_batched_shape(kernel, block_k):
    q = parent(48, 96, 32, False)
    layout = NestedLayout.build(q, widths=(3,)).to(DEVICE)
    x = torch.randn(2, 9, 96, generator=torch.Generator().manual_seed(0)).to(torch.float16)
    y = nested_matmul(x.to(DEVICE), layout, 3, kernel, Tiles(block_n=32, block_k=block_k, block_m=16))
    assert y.shape == (2, 9, 48) and y.dtype == torch.float16
    check(y.reshape(-1, 48), x.reshape(-1, 96), q, 3, extra=2.0**-11, store=2.0**-11)


def test_bad_requests_are_one_line_errors(monkeypatch):
    layout = NestedLayout.build(parent(16, 64, 32, False), widths=(4,))
    with pytest.raises(UserError, match="serves widths 1..4, not 8"):
        nested_matmul(torch.randn(1, 64), layout, 8)
    with pytest.raises(UserError, match="serves no other width"):
        nested_matmul(torch.randn(1, 64), NestedLayout.build(parent(16, 64, 32, False).slice(3)), 4)
    with pytest.raises(UserError, match="multiple of 32"):
        nested_matmul(torch.randn(1, 64, device=DEVICE), layout.to(DEVICE), 4, tiles=Tiles(block_k=48))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(UserError, match="need a CUDA GPU") as e:
        nested_matmul(torch.randn(1, 64), layout, 4)
    assert "\n" not in str(e.value)
