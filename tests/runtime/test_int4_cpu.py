"""The int4 CPU path (runtime/int4_cpu.py, PackedLinear Kernel.INT4) against the dequantized reference
F.linear(x, QuantizedWeight.slice(r).dequantize(bf16)), computed independently in float64 where a bound is needed.

Tolerance of the decode path (derived; u = 2^-8 is bfloat16's unit roundoff, γ_K = K·2^-24 / (1 − K·2^-24) float32's
accumulation bound). Per plane the kernel's scale/zero (sc, ze: exact float32 values, int4_cpu.py) are rounded to
bfloat16 once, so its weight w̃ = (q − 8)·ŝ + ẑ is off the exact w by at most e = u·(|q − 8|·|sc| + |ze|) (summed over
the planes; test_kernel_weight checks the kernel computes w̃ in float32 without a further rounding). The reference's
weight is bf16(w): off by u·|w|. Both sides accumulate in float32 (γ_K·Σ|x|·|w|, with |w| + e for the kernel) and round
their output to bfloat16 (u·|y| each; with two planes each plane's output and their sum are rounded: u·Σ|y_plane|). So

    |y − y_ref| ≤ Σ_k |x_k|·(e_k + u·|w_k|) + 2·γ_K·Σ_k |x_k|·(|w_k| + e_k) + u·(|y| + |y_ref| + Σ_planes |y_plane|),

evaluated per output element in float64 (plus a float64 slack of 1e-12).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import matgptq.runtime.packed as packed
from matgptq.formats import QuantizedWeight
from matgptq.runtime.int4_cpu import LAYOUTS, Layout, build, int4_codes, layout, unpack_int4pack
from matgptq.runtime.packed import PREFILL_ROWS, Kernel, PackedLinear
from tests.conftest import random_parent as parent

ops = torch.ops.aten
U = 2.0**-8


@pytest.mark.parametrize("n,k", [(16, 64), (48, 64), (64, 576), (96, 160), (208, 32)])
def test_unpack_inverts_torchs_layout(n, k):
    assert layout() is not None  # every x86-64 and plain build torch has is one of LAYOUTS
    q = torch.randint(0, 16, (n, k), generator=torch.Generator().manual_seed(n + k), dtype=torch.int32)
    assert torch.equal(unpack_int4pack(ops._convert_weight_to_int4pack_for_cpu(q, 1), n, k), q)


def reference_pack(q: torch.Tensor, lay: Layout) -> torch.Tensor:
    """torch's `weight_to_int4pack_kernel` (aten/src/ATen/native/cpu/int4mm_kernel.cpp) written out byte by byte: per
    block of `lay.block` rows, for each column k, byte k·(rows/2) + j of the block holds (low, high) = rows (j, j +
    block/2) of a full block of a split layout, else rows (2j, 2j + 1)."""
    n, k = q.shape
    out = torch.zeros(n * k // 2, dtype=torch.uint8)
    for b0 in range(0, n, lay.block):
        rows = min(lay.block, n - b0)
        for col in range(k):
            for j in range(rows // 2):
                lo, hi = (j, j + rows // 2) if lay.split and rows == lay.block else (2 * j, 2 * j + 1)
                out[b0 * k // 2 + col * rows // 2 + j] = int(q[b0 + lo, col]) | int(q[b0 + hi, col]) << 4
    return out


@pytest.mark.parametrize("lay", LAYOUTS)
def test_unpack_inverts_every_known_layout(lay):
    """Each layout of torch's builds (AVX-512, AVX2, plain) against the packer above, on any machine."""
    for n, k in [(16, 8), (48, 6), (64, 4), (96, 10), (208, 4)]:
        q = torch.randint(0, 16, (n, k), generator=torch.Generator().manual_seed(n * k), dtype=torch.int32)
        assert torch.equal(unpack_int4pack(reference_pack(q, lay), n, k, lay), q)


def test_the_plain_build_is_found_and_served_exactly():
    """ATEN_CPU_CAPABILITY=default makes torch dispatch to its plain build (another packing than AVX2/AVX-512's):
    `layout` finds it and a packed layer's codes and prefill still equal the reference."""
    code = (
        "import torch, torch.nn.functional as F\n"
        "from matgptq.runtime.int4_cpu import Layout, layout\n"
        "from matgptq.runtime.packed import PREFILL_ROWS, Kernel, PackedLinear\n"
        "from tests.conftest import random_parent\n"
        "assert torch.backends.cpu.get_cpu_capability() == 'DEFAULT' and layout() == Layout(32, False)\n"
        "q = random_parent(80, 384, 64, False).slice(5)\n"
        "layer = PackedLinear(q, None, torch.bfloat16)\n"
        "assert layer.kernel == Kernel.INT4 and torch.equal(layer.codes(), q.codes)\n"
        "x = torch.randn(PREFILL_ROWS, 384).to(torch.bfloat16)\n"
        "assert torch.equal(layer(x), F.linear(x, q.dequantize(torch.bfloat16)))\n"
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]


def _exact_terms(q: QuantizedWeight):
    """(w, e, plane weights) in float64: the exact slice weight, the bound e of the module doc, each plane's weight."""
    idx = q.g_idx.long()
    s = q.scales.double()[:, idx]
    z = q.zeros.double()[:, idx]
    step = 2.0**q.shift
    c = q.codes.double()
    w = s * (c * step - z)
    if q.bits <= 4:
        return w, U * ((c - 8).abs() * s * step + (s * (8 * step - z)).abs()), [w]
    a, b = torch.div(c, 16, rounding_mode="floor"), c.remainder(16)
    e = U * ((a - 8).abs() * 16 * s * step + (s * (128 * step - z)).abs())
    e = e + U * ((b - 8).abs() * s * step + 8 * s * step)
    return w, e, [s * (16 * a * step - z), s * b * step]


def test_kernel_weight():
    """x = I makes the kernel return its weight: (q − 8)·ŝ + ẑ in float32 from the bf16 pairs, rounded to bf16 once."""
    q = parent(32, 64, 32, False).slice(4)
    planes, sz, gs, perm, _ = build(q.codes, q.scales, q.zeros, q.g_idx, q.bits, q.shift)
    y = ops._weight_int4pack_mm_for_cpu(torch.eye(64, dtype=torch.bfloat16), planes[0], gs, sz[0])
    g = torch.arange(64) // gs
    w = (q.codes.float() - 8) * sz[0][g, :, 0].float().t() + sz[0][g, :, 1].float().t()
    assert torch.equal(y.t(), w.to(torch.bfloat16))


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("group,act_order", [(-1, False), (32, True), (64, False), (128, False), (128, True)])
def test_packed_int4_matches_the_reference(bits, group, act_order):
    # 80 rows: one block of 64 and a tail of 16 (int4_cpu's layout); 576 = 4.5 groups of 128: kernel groups of 64
    n, k = 80, 384 if group != 128 else 576
    q = parent(n, k, group, act_order, seed=bits).slice(bits)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    layer = PackedLinear(q, bias, torch.bfloat16)
    assert layer.kernel == Kernel.INT4
    assert torch.equal(layer.codes(), q.codes)
    assert torch.equal(layer.dequantized_weight(), q.dequantize(torch.bfloat16))
    ref_w = q.dequantize(torch.bfloat16)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, k, generator=gen).to(torch.bfloat16)  # decode path: the kernel
    y, y_ref = layer(x), F.linear(x, ref_w, bias)
    w, e, plane_w = _exact_terms(q)
    xa = x.double().abs()
    gamma = k * 2.0**-24 / (1 - k * 2.0**-24)
    planes_y = sum((x.double() @ p.t()).abs() for p in plane_w) if len(plane_w) == 2 else 0
    bound = xa @ (e + U * w.abs()).t() + 2 * gamma * xa @ (w.abs() + e).t()
    bound = bound + U * (y.double().abs() + y_ref.double().abs() + planes_y) + 1e-12
    assert ((y.double() - y_ref.double()).abs() <= bound).all()
    xp = torch.randn(2, PREFILL_ROWS, k, generator=gen).to(torch.bfloat16)  # prefill: exact
    assert torch.equal(layer(xp), F.linear(xp, ref_w, bias))


def test_unservable_layers_keep_the_bit_stream():
    q = parent(40, 64, 32, False).slice(3)  # N % 16 != 0
    layer = PackedLinear(q, None, torch.bfloat16, Kernel.INT4)
    assert layer.kernel == Kernel.BITSTREAM
    x = torch.randn(2, 64).to(torch.bfloat16)
    assert torch.equal(layer(x), F.linear(x, q.dequantize(torch.bfloat16)))
    assert (
        build(q.codes[:16, :48], q.scales[:16], q.zeros[:16], q.g_idx[:48] * 0 + torch.arange(48) // 24, 3, 5) is None
    )  # groups of 24: no kernel group size fits


def test_codes_read_back_in_original_order():
    q = parent(32, 128, 32, True).slice(8)
    planes, _, _, perm, _ = build(q.codes, q.scales, q.zeros, q.g_idx, q.bits, q.shift)
    assert perm is not None and len(planes) == 2
    assert torch.equal(int4_codes(planes, perm, 32, 128), q.codes.to(torch.int32))


@pytest.mark.parametrize("bits,planes", [(4, 1), (8, 2)])
def test_long_calls_dequantize_at_rows_times_planes(monkeypatch, bits, planes):
    """The kernel serves calls of fewer than PREFILL_ROWS / planes rows (a two-plane layer costs two kernel calls);
    from there on the call dequantizes and equals the reference bit for bit."""
    q = parent(16, 64, 32, False).slice(bits)
    layer = PackedLinear(q, None, torch.bfloat16)
    calls = []
    kernel = packed.int4_matmul
    monkeypatch.setattr(packed, "int4_matmul", lambda *a: calls.append(1) or kernel(*a))
    edge = PREFILL_ROWS // planes
    layer(torch.randn(edge - 1, 64).to(torch.bfloat16))
    assert len(calls) == 1
    x = torch.randn(edge, 64).to(torch.bfloat16)
    assert torch.equal(layer(x), F.linear(x, q.dequantize(torch.bfloat16)))
    assert len(calls) == 1
