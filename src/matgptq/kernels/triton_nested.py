"""Triton kernels for the nested bit-plane layout (bitplanes.py): y = x Ŵ_rᵀ for any width r the layout serves.

Both kernels rebuild the weight tile in registers from planes 0..r exactly as NestedLayout.slice_codes / dequantize
do (module doc of bitplanes.py):

    S = min(Σ_{p<r} plane_p · 2^(r−1−p) + plane_r, 2^r − 1),   w = s_r[g, n] · (S · 2^(c−r) − z[g, n]),  g = k // gs

in float32 (exact: an fp16 scale times an integer below 2^9), and read r + 1 bits per weight from memory, never the
other planes. `nested_gemv` (batch 1–8: one program per (row of x, BLOCK_N outputs), a multiply-and-reduce on CUDA
cores, which is what a memory-bound GEMV wants) and `nested_gemm` (tl.dot on BLOCK_M × BLOCK_N tiles, the weight
tile cast to x's dtype, float32 accumulation). On a GPU x is float16/bfloat16; in the interpreter (TRITON_INTERPRET=1,
CPU tensors) float32 works too, which the tests use to separate the layout (exact) from the accumulation order.

Triton is imported on first use (the `kernels` extra); the interpreter is chosen by triton itself from
TRITON_INTERPRET when triton is first imported, so set it before anything imports triton.
"""

from __future__ import annotations

import importlib
import os
from enum import Enum

import torch

from ..errors import UserError
from .bitplanes import NestedLayout

GEMV_MAX_ROWS = 8  # rows of x up to which Kernel.AUTO takes the GEMV kernel


class NestedKernel(str, Enum):
    AUTO = "auto"
    GEMV = "gemv"
    GEMM = "gemm"


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _kernels():
    """(triton, gemv, gemm). Triton picks interpreter or compiler when a function is decorated (TRITON_INTERPRET at
    import), so _triton_src is re-imported when that choice no longer matches the environment; triton.language's own
    helpers are decorated when triton is first imported, so TRITON_INTERPRET must be set before that (tests/conftest)."""
    try:
        import triton
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        raise UserError("the nested GPU kernels need Triton: pip install 'matgptq[kernels]'") from None

    from . import _triton_src

    fns = (_triton_src._weight_tile, _triton_src.gemv, _triton_src.gemm)
    if any(isinstance(f, InterpretedFunction) != interpreting() for f in fns):
        importlib.reload(_triton_src)
    return triton, _triton_src.gemv, _triton_src.gemm


def nested_matmul(x: torch.Tensor, layout: NestedLayout, bits: int, kernel: NestedKernel = NestedKernel.AUTO,
                  block_n: int = 64, block_k: int = 64, block_m: int = 16) -> torch.Tensor:  # fmt: skip
    """x [..., K] → x Ŵ_rᵀ [..., N] through the Triton kernels (CUDA tensors, or any under TRITON_INTERPRET=1)."""
    layout.check(bits)
    if not x.is_cuda and not interpreting():
        raise UserError("the nested Triton kernels need a CUDA GPU (this tensor is on "
                        f"{x.device}); on CPU load with packed=True (the int4 CPU path) or set TRITON_INTERPRET=1 "
                        "to run them in Triton's (slow) interpreter")  # fmt: skip
    if x.shape[-1] != layout.in_features:
        raise UserError(f"the input has {x.shape[-1]} features, the layer {layout.in_features}")
    triton, gemv, gemm = _kernels()
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if layout.perm is not None:
        x2 = x2.index_select(1, layout.perm.to(x2.device))
    x2 = x2.contiguous()
    m, k, n = x2.shape[0], layout.in_features, layout.out_features
    dev = x2.device
    planes, zeros = layout.planes.to(dev), layout.zeros.to(dev)
    scales = layout.scale(bits).to(dev)
    y = torch.empty(m, n, dtype=x.dtype, device=dev)
    kernel = NestedKernel(kernel)
    if kernel == NestedKernel.AUTO:
        kernel = NestedKernel.GEMV if m <= GEMV_MAX_ROWS else NestedKernel.GEMM
    common = dict(BITS=bits, C=layout.master_bits, GS=layout.group_size)
    if kernel == NestedKernel.GEMV:
        gemv[(triton.cdiv(n, block_n), m)](x2, planes, scales, zeros, y, k, n, planes.shape[1], BLOCK_N=block_n,
                                            BLOCK_K=block_k, **common)  # fmt: skip
    else:
        grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
        gemm[grid](x2, planes, scales, zeros, y, m, k, n, planes.shape[1], BLOCK_M=block_m, BLOCK_N=block_n,
                   BLOCK_K=block_k, IEEE=x2.dtype == torch.float32, **common)  # fmt: skip
    return y.view(*shape[:-1], n)
