"""quantization/hessian.py: the running Hessian against float64 arithmetic."""

import torch

from matgptq.quantization.hessian import GRAM_BLOCK, add_gram


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
