"""quantization/algorithm/hessian.py: the running Hessian against float64 arithmetic."""

import torch

from matgptq.quantization.algorithm.hessian import GRAM_BLOCK, Accumulator, add_gram, bfloat16_products


def test_add_gram_is_the_gram_matrix_from_its_upper_blocks():
    """add_gram adds xᵀx (the oracle: float64 xᵀx) from the column blocks on and above the diagonal: K = 600 is two
    whole blocks and a ragged one, added onto a symmetric h; outside the diagonal blocks (where a product's two
    triangles may round differently) the result is symmetric bit for bit: each mirrored entry is the same sum."""
    g = torch.Generator().manual_seed(0)
    x, a = torch.randn(300, 600, generator=g), torch.randn(600, 600, generator=g)
    h0 = a + a.T  # symmetric, as a running Hessian is
    h = h0.clone()
    add_gram(h, x)
    expected = h0.double() + x.double().T @ x.double()
    # float32 dot products of 300 terms: error ≲ 300·2⁻²⁴·Σ|x_i||x_j| ≈ 300·6e-8·300 ≈ 5e-3, plus rounding h0 + p
    assert torch.allclose(h.double(), expected, rtol=0, atol=5e-3)
    off = torch.ones(600, 600, dtype=torch.bool)
    for a in range(0, 600, GRAM_BLOCK):
        off[a : a + GRAM_BLOCK, a : a + GRAM_BLOCK] = False
    assert torch.equal(h[off], h.T[off])


def test_bfloat16_operands_keep_float32_sums():
    """bfloat16 values multiplied through oneDNN's bfloat16 path (bfloat16_products, where the CPU has it; float32
    elsewhere) are the float32 Gram matrix: each product of two 8-bit significands is exact in float32, so only the
    float32 summation can err. The oracle is float64 alpha·xᵀx; the bound is the float32 one above (300 terms of
    |x_i x_j| ≲ 1 on average: 300·2⁻²⁴·300 ≈ 5e-3, times alpha ≤ 1)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 600, generator=g).bfloat16().float()
    alpha = 2 / 300
    h = torch.zeros(600, 600)
    with bfloat16_products():
        add_gram(h, x, alpha=alpha)
    expected = alpha * (x.double().T @ x.double())
    assert torch.allclose(h.double(), expected, rtol=0, atol=5e-3 * alpha)


def test_bfloat16_products_restores_the_setting():
    """The reduced-precision setting is scoped: float32 products after the block are float32 again (inputs that are
    not bfloat16 values would otherwise be rounded)."""
    matmul = getattr(torch.backends.mkldnn, "matmul", None)
    before = getattr(matmul, "fp32_precision", None)
    with bfloat16_products():
        pass
    assert getattr(matmul, "fp32_precision", None) == before


def test_accumulator_running_mean_in_both_dtypes():
    """Accumulator.add over batches is (2/n) Σ x xᵀ over all rows (float64 oracle), for float32 inputs (scaled
    operands) and bfloat16 ones (the factor on the product): the same matrix to float32 summation error
    (n = 96 rows of |x| ~ 1: 96·2⁻²⁴·96·(2/96) ≈ 1e-5 per entry; 1e-4 leaves room for the running rescale)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 32, 80, generator=g).bfloat16()
    expected = 2 / 96 * (x.reshape(96, 80).double().T @ x.reshape(96, 80).double())
    for batches in (x, x.float()):
        acc = Accumulator()
        for batch in batches:
            acc.add(batch)
        assert acc.rows == 96 and acc.hessian.dtype is torch.float32
        assert torch.allclose(acc.hessian.double(), expected, rtol=0, atol=1e-4)
