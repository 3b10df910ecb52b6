"""The Triton source of the nested kernels (imported by triton_nested.py on first use, so that importing matgptq
never needs Triton). The arithmetic is documented in triton_nested.py and bitplanes.py."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _weight_tile(planes, scales, zeros, offs_k, offs_n, K, N, K32,
                 BITS: tl.constexpr, C: tl.constexpr, GS: tl.constexpr):  # fmt: skip
    """The float32 weight tile [BLOCK_K, BLOCK_N] of width BITS (module doc)."""
    mask = (offs_k[:, None] < K) & (offs_n[None, :] < N)
    word = (offs_k // 32)[:, None] * N + offs_n[None, :]
    bit = (offs_k % 32)[:, None]
    top = tl.zeros(word.shape, dtype=tl.int32)
    for p in tl.static_range(BITS):
        top = (top << 1) | ((tl.load(planes + p * K32 * N + word, mask=mask, other=0) >> bit) & 1)
    if BITS < C:
        top = top + ((tl.load(planes + BITS * K32 * N + word, mask=mask, other=0) >> bit) & 1)
        top = tl.minimum(top, (1 << BITS) - 1)
    g = (offs_k // GS)[:, None] * N + offs_n[None, :]
    s = tl.load(scales + g, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(zeros + g, mask=mask, other=0).to(tl.float32)
    return s * (top.to(tl.float32) * (1 << (C - BITS)) - z)


@triton.jit
def gemv(x, planes, scales, zeros, y, K, N, K32, BITS: tl.constexpr, C: tl.constexpr, GS: tl.constexpr,
         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    pid_n, m = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        xv = tl.load(x + m * K + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
        w = _weight_tile(planes, scales, zeros, offs_k, offs_n, K, N, K32, BITS, C, GS)
        acc += tl.sum(xv[:, None] * w, axis=0)
    tl.store(y + m * N + offs_n, acc.to(y.dtype.element_ty), mask=offs_n < N)


@triton.jit
def gemm(x, planes, scales, zeros, y, M, K, N, K32, BITS: tl.constexpr, C: tl.constexpr, GS: tl.constexpr,
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):  # fmt: skip
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        xt = tl.load(x + offs_m[:, None] * K + offs_k[None, :], mask=(offs_m[:, None] < M) & (offs_k[None, :] < K),
                     other=0.0)  # fmt: skip
        w = _weight_tile(planes, scales, zeros, offs_k, offs_n, K, N, K32, BITS, C, GS).to(xt.dtype)
        if IEEE:
            acc += tl.dot(xt, w, input_precision="ieee")
        else:
            acc += tl.dot(xt, w)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(y + offs_m[:, None] * N + offs_n[None, :], acc.to(y.dtype.element_ty), mask=mask)
