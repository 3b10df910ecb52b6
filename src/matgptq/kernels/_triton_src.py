"""The Triton source of the nested kernels (imported by triton_nested.py on first use, so that importing matgptq
never needs Triton). The arithmetic is documented in triton_nested.py and bitplanes.py."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _weight_tile(
    planes,
    scales,
    zeros,
    offs_k,
    offs_n,
    K,
    N,
    K32,
    BITS: tl.constexpr,
    C: tl.constexpr,
    GS: tl.constexpr,
    CARRY: tl.constexpr,
):
    """The float32 weight tile [BLOCK_K, BLOCK_N] of width BITS, any group size (triton_nested.py, generic path)."""
    mask = (offs_k[:, None] < K) & (offs_n[None, :] < N)
    word = (offs_k // 32)[:, None] * N + offs_n[None, :]
    bit = (offs_k % 32)[:, None]
    top = tl.zeros(word.shape, dtype=tl.int32)
    for p in tl.static_range(BITS):
        top = (top << 1) | ((tl.load(planes + p * K32 * N + word, mask=mask, other=0) >> bit) & 1)
    if CARRY and BITS < C:
        top = top + ((tl.load(planes + BITS * K32 * N + word, mask=mask, other=0) >> bit) & 1)
        top = tl.minimum(top, (1 << BITS) - 1)
    g = (offs_k // GS)[:, None] * N + offs_n[None, :]
    s = tl.load(scales + g, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(zeros + g, mask=mask, other=0).to(tl.float32)
    return s * (top.to(tl.float32) * (1 << (C - BITS)) - z)


@triton.jit
def _ld(ptr, mask):
    """tl.load, masked (0 where masked off) unless mask is None (the kernels' EVEN case: every load in bounds)."""
    if mask is None:
        return tl.load(ptr)
    else:
        return tl.load(ptr, mask=mask, other=0)


@triton.jit
def _word_masks(planes, word, mask, K32, N, BITS: tl.constexpr, C: tl.constexpr, CARRY: tl.constexpr):
    """The carry plane's words with the saturated columns cleared (triton_nested.py), [BLOCK_W, BLOCK_N] int32."""
    sat = tl.full(word.shape, -1, dtype=tl.int32)
    for p in tl.static_range(BITS):
        sat = sat & _ld(planes + p * K32 * N + word, mask)
    carry = tl.zeros(word.shape, dtype=tl.int32)
    if CARRY and BITS < C:
        carry = _ld(planes + BITS * K32 * N + word, mask) & ~sat
    return carry


@triton.jit
def _lanes(planes, word, mask, carry, b, K32, N, BITS: tl.constexpr, LANES: tl.constexpr):
    """S of the columns 32w + LB·j + b in lane j of each int32 of [BLOCK_W, BLOCK_N] (Horner over the planes)."""
    s = tl.zeros(word.shape, dtype=tl.int32)
    for p in tl.static_range(BITS):
        s = (s << 1) | ((_ld(planes + p * K32 * N + word, mask) >> b) & LANES)
    return s + ((carry >> b) & LANES)


@triton.jit
def _all_lanes(
    planes,
    word,
    mask,
    K32,
    N,
    BITS: tl.constexpr,
    C: tl.constexpr,
    CARRY: tl.constexpr,
    LB: tl.constexpr,
    LANES: tl.constexpr,
):
    """`_lanes` for every b < LB at once (unused ones zero), each plane and the carry plane loaded once: the planes'
    loop outside, the LB Horner accumulators inside (HOIST), the saturation mask built from the same words."""
    s0 = tl.zeros(word.shape, dtype=tl.int32)
    s1, s2, s3, s4, s5, s6, s7 = s0, s0, s0, s0, s0, s0, s0
    sat = tl.full(word.shape, -1, dtype=tl.int32)
    for p in tl.static_range(BITS):
        v = _ld(planes + p * K32 * N + word, mask)
        sat = sat & v
        s0 = (s0 << 1) | (v & LANES)
        s1 = (s1 << 1) | ((v >> 1) & LANES)
        s2 = (s2 << 1) | ((v >> 2) & LANES)
        s3 = (s3 << 1) | ((v >> 3) & LANES)
        if LB == 8:
            s4 = (s4 << 1) | ((v >> 4) & LANES)
            s5 = (s5 << 1) | ((v >> 5) & LANES)
            s6 = (s6 << 1) | ((v >> 6) & LANES)
            s7 = (s7 << 1) | ((v >> 7) & LANES)
    if CARRY and BITS < C:
        c = _ld(planes + BITS * K32 * N + word, mask) & ~sat
        s0 += c & LANES
        s1 += (c >> 1) & LANES
        s2 += (c >> 2) & LANES
        s3 += (c >> 3) & LANES
        if LB == 8:
            s4 += (c >> 4) & LANES
            s5 += (c >> 5) & LANES
            s6 += (c >> 6) & LANES
            s7 += (c >> 7) & LANES
    return s0, s1, s2, s3, s4, s5, s6, s7


@triton.jit
def _pick(b: tl.constexpr, s0, s1, s2, s3, s4, s5, s6, s7):
    """s_b of `_all_lanes`' accumulators (b a compile-time constant)."""
    s = s0
    if b == 1:
        s = s1
    if b == 2:
        s = s2
    if b == 3:
        s = s3
    if b == 4:
        s = s4
    if b == 5:
        s = s5
    if b == 6:
        s = s6
    if b == 7:
        s = s7
    return s


@triton.jit
def _lane_float(s, j: tl.constexpr, LB: tl.constexpr):
    """Lane j of s as float32 (the float 2^23 + lane is the bit pattern 0x4B000000 | lane: exact)."""
    v = ((s >> (LB * j)) & ((1 << LB) - 1)) | 0x4B000000
    return v.to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _lane_at(s, hi, j: tl.constexpr, LB: tl.constexpr):
    """Lane j of s as float32 times 2^o, o its offset in its half-word (hi = s >> 16 holds the upper lanes): the lane
    is masked where it lies, never shifted down, and 2^23 + lane·2^o (o + LB ≤ 16 < 23) is again the bit pattern
    0x4B000000 | (lane << o): exact. The caller scales x by 2^−o instead (exact: a power of two)."""
    if LB * j < 16:
        v = (s & (((1 << LB) - 1) << (LB * j))) | 0x4B000000
    else:
        v = (hi & (((1 << LB) - 1) << ((LB * j) % 16))) | 0x4B000000
    return v.to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def gemv(
    x,
    planes,
    scales,
    zeros,
    y,
    M,
    K,
    N,
    K32,
    BITS: tl.constexpr,
    C: tl.constexpr,
    GS: tl.constexpr,
    CARRY: tl.constexpr,
    WORDS: tl.constexpr,
    LB: tl.constexpr,
    LANES: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INPLACE: tl.constexpr,
    EVEN: tl.constexpr,
    HOIST: tl.constexpr,
):
    """One row m of x against BLOCK_N outputs; the word path keeps every tensor [BLOCK_K / 32, BLOCK_N]. INPLACE:
    lanes decoded where they lie (_lane_at), x pre-scaled per lane; EVEN: K32 a multiple of BLOCK_K / 32, N of
    BLOCK_N and x padded to K32·32 columns, so no load needs a mask; HOIST: each plane word loaded once
    (_all_lanes)."""
    pid_n, m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(pid_k * BLOCK_K, K, SPLIT_K * BLOCK_K):
        if WORDS:  # per word: Σ_k x·s·(S·2^h − z) = s·(2^h·Σ_k x·S − z·Σ_k x) (triton_nested.py)
            offs_w = k0 // 32 + tl.arange(0, BLOCK_K // 32)
            if EVEN:
                mask = None
            else:
                mask = (offs_w[:, None] < K32) & (offs_n[None, :] < N)
            word = offs_w[:, None] * N + offs_n[None, :]
            if HOIST:
                s0, s1, s2, s3, s4, s5, s6, s7 = _all_lanes(planes, word, mask, K32, N, BITS, C, CARRY, LB, LANES)
            else:
                carry = _word_masks(planes, word, mask, K32, N, BITS, C, CARRY)
            part = tl.zeros(word.shape, dtype=tl.float32)
            xs = tl.zeros((BLOCK_K // 32,), dtype=tl.float32)
            for b in tl.static_range(LB):
                if HOIST:
                    s = _pick(b, s0, s1, s2, s3, s4, s5, s6, s7)
                else:
                    s = _lanes(planes, word, mask, carry, b, K32, N, BITS, LANES)
                hi = s >> 16
                for j in tl.static_range(32 // LB):
                    cols = offs_w * 32 + LB * j + b
                    if EVEN:
                        xv = tl.load(x + m * K32 * 32 + cols).to(tl.float32)
                    else:
                        xv = tl.load(x + m * K + cols, mask=cols < K, other=0.0).to(tl.float32)
                    xs += xv
                    if INPLACE:
                        part += (xv * (1.0 / (1 << ((LB * j) % 16))))[:, None] * _lane_at(s, hi, j, LB)
                    else:
                        part += xv[:, None] * _lane_float(s, j, LB)
            g = (offs_w * 32 // GS)[:, None] * N + offs_n[None, :]
            sc = _ld(scales + g, mask).to(tl.float32)
            z = _ld(zeros + g, mask).to(tl.float32)
            acc += tl.sum(sc * (part * (1 << (C - BITS)) - z * xs[:, None]), axis=0)
        else:
            offs_k = k0 + tl.arange(0, BLOCK_K)
            xv = tl.load(x + m * K + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
            w = _weight_tile(planes, scales, zeros, offs_k, offs_n, K, N, K32, BITS, C, GS, CARRY)
            acc += tl.sum(xv[:, None] * w, axis=0)
    if SPLIT_K == 1:
        tl.store(y + m * N + offs_n, acc.to(y.dtype.element_ty), mask=offs_n < N)
    else:  # y is a zeroed float32 buffer
        tl.atomic_add(y + m * N + offs_n, acc, mask=offs_n < N)


@triton.jit
def gemm(
    x,
    planes,
    scales,
    zeros,
    y,
    M,
    K,
    N,
    K32,
    BITS: tl.constexpr,
    C: tl.constexpr,
    GS: tl.constexpr,
    CARRY: tl.constexpr,
    WORDS: tl.constexpr,
    LB: tl.constexpr,
    LANES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IEEE: tl.constexpr,
    HOIST: tl.constexpr,
):
    """BLOCK_M rows against BLOCK_N outputs; the word path makes one product per lane (j, b): x's columns
    32w + LB·j + b [BLOCK_M, BLOCK_K / 32] times that lane's weights [BLOCK_K / 32, BLOCK_N] (BLOCK_K ≥ 512). (Joining
    the 32 lanes' tiles into one [BLOCK_K, BLOCK_N] product per block, x gathered to match, was slower:
    docs/decisions/code-constants.md.)"""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if WORDS:
            offs_w = k0 // 32 + tl.arange(0, BLOCK_K // 32)
            mask = (offs_w[:, None] < K32) & (offs_n[None, :] < N)
            word = offs_w[:, None] * N + offs_n[None, :]
            if HOIST:
                s0, s1, s2, s3, s4, s5, s6, s7 = _all_lanes(planes, word, mask, K32, N, BITS, C, CARRY, LB, LANES)
            else:
                carry = _word_masks(planes, word, mask, K32, N, BITS, C, CARRY)
            g = (offs_w * 32 // GS)[:, None] * N + offs_n[None, :]
            sc = tl.load(scales + g, mask=mask, other=0.0).to(tl.float32)
            z = tl.load(zeros + g, mask=mask, other=0).to(tl.float32)
            for b in tl.static_range(LB):
                if HOIST:
                    s = _pick(b, s0, s1, s2, s3, s4, s5, s6, s7)
                else:
                    s = _lanes(planes, word, mask, carry, b, K32, N, BITS, LANES)
                for j in tl.static_range(32 // LB):
                    cols = offs_w * 32 + LB * j + b
                    xt = tl.load(
                        x + offs_m[:, None] * K + cols[None, :],
                        mask=(offs_m[:, None] < M) & (cols[None, :] < K),
                        other=0.0,
                    )
                    w = sc * (_lane_float(s, j, LB) * (1 << (C - BITS)) - z)
                    acc = _dot(acc, xt, w, IEEE)
        else:
            cols = k0 + tl.arange(0, BLOCK_K)
            xt = tl.load(
                x + offs_m[:, None] * K + cols[None, :], mask=(offs_m[:, None] < M) & (cols[None, :] < K), other=0.0
            )
            acc = _dot(acc, xt, _weight_tile(planes, scales, zeros, cols, offs_n, K, N, K32, BITS, C, GS, CARRY), IEEE)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(y + offs_m[:, None] * N + offs_n[None, :], acc.to(y.dtype.element_ty), mask=mask)


@triton.jit
def _dot(acc, xt, w, IEEE: tl.constexpr):
    """acc + xt · w, w cast to x's dtype (float32 products exact in the interpreter's tests: IEEE)."""
    if IEEE:
        acc += tl.dot(xt, w.to(xt.dtype), input_precision="ieee")
    else:
        acc += tl.dot(xt, w.to(xt.dtype))
    return acc
