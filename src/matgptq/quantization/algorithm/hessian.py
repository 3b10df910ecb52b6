"""The running Hessian of a layer's input, H = (2/n) Σ x xᵀ over the calibration tokens, accumulated batch by batch.

The running mean of IST-DASLab/gptq `add_batch`: for each batch of n_new rows,
H ← H·n_old/(n_old+n_new) + (√(2/n)·X)ᵀ(√(2/n)·X) with n = n_old + n_new, in float32. XᵀX is symmetric, so only its
column blocks on and above the diagonal are multiplied and the rest mirrored (`add_gram`).

Inputs calibrated in bfloat16 on a CPU with bfloat16 arithmetic (execution.native_bfloat16) are multiplied by oneDNN's
bfloat16 products with float32 accumulation (`torch.backends.mkldnn.matmul.fp32_precision = "bf16"`), and the
factor 2/n is applied to the product instead of to X (√(2/n)·X would no longer be bfloat16 values). That path rounds
the operands to bfloat16, which changes nothing for operands that are bfloat16 values: the product of two 8-bit
significands is exact in float32's 24, so each sum is float32 arithmetic as before, in another order, in about half
the time (docs/decisions/code-constants.md).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ...execution import native_bfloat16


@dataclass
class Accumulator:
    """One layer input's running Hessian (module docstring) and the rows it averages."""

    hessian: torch.Tensor | None = None
    rows: int = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1])
        exact_bf16 = x.dtype is torch.bfloat16 and x.device.type == "cpu" and native_bfloat16(x.device)
        x = x.float()
        if self.hessian is None:
            self.hessian = torch.zeros(x.shape[1], x.shape[1], device=x.device)
        n_old, n_new = self.rows, x.shape[0]
        self.hessian.mul_(n_old / (n_old + n_new))
        self.rows = n_old + n_new
        if exact_bf16:
            with bfloat16_products():
                add_gram(self.hessian, x, alpha=2 / self.rows)
        else:
            add_gram(self.hessian, x * math.sqrt(2 / self.rows))


@contextmanager
def bfloat16_products():
    """CPU float32 matrix products computed by oneDNN from bfloat16-rounded operands, accumulated in float32 (module
    docstring); a torch without that setting (an older one) multiplies in float32 as usual."""
    matmul = getattr(torch.backends.mkldnn, "matmul", None)
    saved = getattr(matmul, "fp32_precision", None)
    if saved is None:
        yield
        return
    matmul.fp32_precision = "bf16"
    try:
        yield
    finally:
        matmul.fp32_precision = saved


# Columns per block of `add_gram`. A [1024, K] batch on 2 cores (ms per product, full XᵀX vs blocks of K/2, K/4,
# K/8, K/16): K = 576: 4.0, 3.3, 2.7, 2.6, 3.3; K = 1536: 34.5, 32.8, 22.2, 21.6, 20.5; K = 4096: 205, 188, 187,
# 158, 138 (the whole product is K²·rows multiply-adds; the blocks, ≈ K²·rows·(1 + 1/parts)/2).
GRAM_BLOCK = 256


def add_gram(h: torch.Tensor, x: torch.Tensor, alpha: float = 1.0) -> None:
    """h += alpha·xᵀx for x [rows, K] and a symmetric h (a running Hessian), in place: for each block of GRAM_BLOCK
    columns a:b, the products with the columns from a on are added into h's rows a:b (the blocks on and above the
    diagonal), and the part right of the diagonal block is copied below it. About half the multiply-adds of one xᵀx,
    no temporary; the same sums up to float32 summation order."""
    k = x.shape[1]
    for a in range(0, k, GRAM_BLOCK):
        b = min(a + GRAM_BLOCK, k)
        h[a:b, a:].addmm_(x[:, a:b].T, x[:, a:], alpha=alpha)
        h[b:, a:b] = h[a:b, b:].T
