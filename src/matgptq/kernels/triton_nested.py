"""Triton kernels for the nested bit-plane layout (bitplanes.py): y = x Ŵ_rᵀ for any width r the layout serves.

Both kernels rebuild the weight tile in registers from planes 0..r exactly as NestedLayout.slice_codes / dequantize
do (module doc of bitplanes.py):

    S = min(Σ_{p<r} plane_p · 2^(r−1−p) + plane_r, 2^r − 1),   w = s_r[g, n] · (S · 2^(c−r) − z[g, n]),  g = k // gs

in float32 (exact: an fp16 scale times an integer below 2^9), and read r + 1 bits per weight from memory, never the
other planes (a slice's layout: its r planes, no carry). GEMV (one row of x: one program per BLOCK_N outputs and
K share, a multiply-and-reduce on CUDA cores, which is what a memory-bound GEMV wants) and GEMM (tl.dot on
BLOCK_M × BLOCK_N tiles, the weight tile cast to x's dtype, float32 accumulation). On a GPU x is float16/bfloat16;
in the interpreter (TRITON_INTERPRET=1, CPU tensors) float32 works too, which the tests use to separate the layout
(exact) from the accumulation order.

Where every group is whole words (group size a multiple of 32, `WORDS`), both kernels decode 32 columns per int32
word of each plane at once, in lanes of LB bits (LB = 4 for r ≤ 4, else 8; S < 2^r fits a lane): column 32w + LB·j + b
is bit LB·j + b of word w, i.e. bit 0 of lane j of (word >> b), so for each b the r planes compose S of 32/LB columns
by Horner's rule, s = (s << 1) | ((plane >> b) & 0x1111…), one shift and one mask-or per plane and word. The
saturation needs no per-column branch: the carry plane is first ANDed with the complement of the AND of the r top
planes, which is all ones exactly where the top bits are. The float 2^23 + lane is the bit pattern 0x4B000000 | lane.
GEMV then sums per word

    Σ_{k ∈ word} x_k·s·(S_k·2^h − z) = s·(2^h·Σ_k x_k·S_k − z·Σ_k x_k),   h = c − r,

one scale multiply per word instead of per weight (its rounding: |fl − exact| ≤ γ_{K+8}·Σ_k |x_k|·s·(S_k·2^h + z),
tests/kernels/test_triton_nested.py). Every tensor is [BLOCK_K / 32, BLOCK_N] (one row per word): for each lane
(b, j) the kernels gather x's columns 32w + LB·j + b, GEMV multiplying and adding, GEMM making one tl.dot of those
columns (≥ 16 words, so BLOCK_K ≥ 512) with the lane's scaled weights. (A first version held the block as
[words, LB, lanes, BLOCK_N] tensors and was several times slower: docs/results/gpu.md, its first version.) Other group
sizes take the generic path, one bit per column and plane, with a K block of at most 64.
`split_k` > 1 lets GEMV's programs share K (float32 atomic adds into a zeroed buffer), for few output rows.

Triton is imported on first use (the `kernels` extra); the interpreter is chosen by triton itself from
TRITON_INTERPRET when triton is first imported, so set it before anything imports triton.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

import torch

from ..errors import UserError
from .bitplanes import NestedLayout

# make gpu-check's sweeps: GEMV is the faster at one row and GEMM already at 4 rows (GEMV decodes the weight once per
# row), so GEMV serves one row only (docs/decisions/code-constants.md).
GEMV_MAX_ROWS = 1  # rows of x up to which Kernel.AUTO takes the GEMV kernel (one program per row and BLOCK_N)
GENERIC_BLOCK_K = 64  # the generic path's K block at most (a GEMM tile [512, 32] needed 512 KB of shared memory)


class NestedKernel(str, Enum):
    AUTO = "auto"
    GEMV = "gemv"
    GEMM = "gemm"


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _kernels():
    """(triton, gemv, gemm). Triton picks interpreter or compiler when a function is decorated (TRITON_INTERPRET at
    import), so _triton_src is re-imported when that choice no longer matches the environment; triton.language's own
    helpers are decorated when triton is first imported, so TRITON_INTERPRET must be set before that
    (tests/conftest)."""
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


@dataclass(frozen=True)
class Tiles:
    """Launch parameters of the kernels (block sizes in outputs N, columns K and rows M; K blocks a multiple of 32)."""

    block_n: int = 64
    block_k: int = 64
    block_m: int = 16
    split_k: int = 1  # GEMV: programs sharing K; 0 = from the shape (auto_split)
    num_warps: int = 4
    words: bool = True  # decode whole plane words where the groups allow (module doc); False: the generic path
    inplace: bool = True  # GEMV: decode each lane where it lies in the word, x pre-scaled (module doc)
    hoist: bool = False  # word path: load each plane word once for all LB lane offsets, not once per offset


# The fastest correct candidates of make gpu-check's sweeps at 8192², 4 bits (docs/results/gpu.md, launch parameters;
# docs/decisions/code-constants.md): GEMV's the best on one of the two GPUs measured, GEMM's on both
DEFAULT_TILES = {NestedKernel.GEMV: Tiles(32, 1024, split_k=0, hoist=True), NestedKernel.GEMM: Tiles(64, 512, 16)}


def auto_split(n_blocks: int, k_blocks: int, sms: int) -> int:
    """GEMV's split_k for `n_blocks` output blocks, `k_blocks` K blocks, `sms` multiprocessors: 1 (no zeroed float32
    buffer, no cast) while the output blocks fill at least half the GPU (8192² at BLOCK_N 32: 256 on 132), else
    enough K shares for about one program per multiprocessor, at most one per K block (a 1024 × 4096 k_proj: 4)."""
    if 2 * n_blocks >= sms:
        return 1
    return max(1, min(k_blocks, -(-sms // n_blocks)))


@lru_cache(maxsize=8)
def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


@dataclass(frozen=True)
class Launch:
    """What one call launches: the kernel and its keyword arguments other than tensors and sizes (Triton constexprs
    and num_warps, as `plan` chose them)."""

    kernel: NestedKernel
    constexprs: dict[str, int | bool]


def plan(
    layout: NestedLayout,
    bits: int,
    rows: int,
    dtype: torch.dtype,
    kernel: NestedKernel = NestedKernel.AUTO,
    tiles: Tiles | None = None,
    sms: int = 1,
) -> Launch:
    """The launch nested_matmul makes for `rows` rows of x in `dtype` at width `bits` of `layout` on a GPU of `sms`
    multiprocessors: a pure function of shapes (no tensor is read), so tests/kernels/test_sass_budget.py compiles
    every launch the runtime can pick."""
    kernel = NestedKernel(kernel)
    if kernel == NestedKernel.AUTO:
        kernel = NestedKernel.GEMV if rows <= GEMV_MAX_ROWS else NestedKernel.GEMM
    t = tiles or DEFAULT_TILES[kernel]
    if t.block_k % 32:
        raise UserError(f"block_k must be a multiple of 32 (one plane word), not {t.block_k}")
    # the word path: whole-word groups; GEMM's products need ≥ 16 words (tl.dot's K) per lane
    words = t.words and layout.group_size % 32 == 0 and (kernel == NestedKernel.GEMV or t.block_k >= 512)
    lb = 4 if bits <= 4 else 8
    # the generic path holds a float tile [BLOCK_K, BLOCK_N]: a word path's long K block would overflow shared memory
    block_k = t.block_k if words else min(t.block_k, GENERIC_BLOCK_K)
    common = dict(
        BITS=bits,
        C=layout.master_bits,
        GS=layout.group_size,
        CARRY=layout.carry,
        WORDS=words,
        LB=lb,
        LANES=0x11111111 if lb == 4 else 0x01010101,
        BLOCK_N=t.block_n,
        BLOCK_K=block_k,
        HOIST=t.hoist,
        num_warps=t.num_warps,
    )
    if kernel == NestedKernel.GEMM:
        return Launch(kernel, dict(common, BLOCK_M=t.block_m, IEEE=dtype == torch.float32))
    k32, n = layout.planes.shape[1], layout.out_features
    even = words and k32 % (block_k // 32) == 0 and n % t.block_n == 0  # no load needs a mask (_triton_src)
    split = t.split_k or auto_split(-(-n // t.block_n), -(-32 * k32 // block_k), sms)
    return Launch(kernel, dict(common, SPLIT_K=split, INPLACE=t.inplace, EVEN=even))


def nested_matmul(
    x: torch.Tensor,
    layout: NestedLayout,
    bits: int,
    kernel: NestedKernel = NestedKernel.AUTO,
    tiles: Tiles | None = None,
) -> torch.Tensor:
    """x [..., K] → x Ŵ_rᵀ [..., N] through the Triton kernels (CUDA tensors, or any under TRITON_INTERPRET=1)."""
    layout.check(bits)
    if not x.is_cuda and not interpreting():
        raise UserError(
            "the nested Triton kernels need a CUDA GPU (this tensor is on "
            f"{x.device}); on CPU load with packed=True (the int4 CPU path) or set TRITON_INTERPRET=1 "
            "to run them in Triton's (slow) interpreter"
        )
    if x.shape[-1] != layout.in_features:
        raise UserError(f"the input has {x.shape[-1]} features, the layer {layout.in_features}")
    triton, gemv, gemm = _kernels()
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if layout.perm is not None:
        x2 = x2.index_select(1, layout.perm.to(x2.device))
    x2 = x2.contiguous()
    m, n = x2.shape[0], layout.out_features
    dev = x2.device
    launch = plan(layout, bits, m, x2.dtype, kernel, tiles, _sms(dev))
    c = launch.constexprs
    planes, zeros, scales = layout.planes.to(dev), layout.zeros.to(dev), layout.scale(bits).to(dev)
    if launch.kernel == NestedKernel.GEMV:
        k32 = planes.shape[1]
        if c["EVEN"] and x2.shape[1] != 32 * k32:
            x2 = torch.nn.functional.pad(x2, (0, 32 * k32 - x2.shape[1]))
        split = c["SPLIT_K"]
        y = torch.empty(m, n, dtype=x.dtype, device=dev) if split == 1 else torch.zeros(m, n, device=dev)
        gemv[(triton.cdiv(n, c["BLOCK_N"]), m, split)](x2, planes, scales, zeros, y, m, layout.in_features, n, k32, **c)
        y = y.to(x.dtype)
    else:
        y = torch.empty(m, n, dtype=x.dtype, device=dev)
        grid = (triton.cdiv(m, c["BLOCK_M"]), triton.cdiv(n, c["BLOCK_N"]))
        gemm[grid](x2, planes, scales, zeros, y, m, layout.in_features, n, planes.shape[1], **c)
    return y.view(*shape[:-1], n)
