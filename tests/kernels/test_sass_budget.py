"""Instruction budgets of the kernel configurations the runtime picks, compiled for a Hopper GPU (sm_90) here, GPU or
not (tests/kernels/sass.py): a change that would slow the GPU fails on the CPU. Correctness is the interpreter's
(test_triton_nested.py, test_gptq_column.py); this file checks only what the machine code costs.

Which configurations. The nested GEMV/GEMM launch is `triton_nested.plan`, a pure function of the layout's shapes, the
width, the rows of x, its dtype and the GPU's multiprocessors (tiles from DEFAULT_TILES): it is called here, so a
changed tile or rule is compiled and budgeted. Its inputs: every width MIN_BITS..MAX_BITS held as a slice (r planes)
or in the parent (c = MAX_BITS planes; width r < c reads plane r as the carry), 1 row (GEMV) and 16 (GEMM), in the
"default" situation (SITUATIONS); each other situation, one change from it, at the widths of VARIANT_WIDTHS (the most
planes per lane width: 4 bits from the parent read 5 planes in 4-bit lanes, 8 bits 8 planes in 8-bit lanes). What
plan passes besides enters the same code as a constant: C (the master width) only as 2^(C−r), GS as the divisor of a
group index, SPLIT_K > 1 as the loop's stride. The column kernels (gptq_column): MAXQ = 2^b − 1 of every width b,
T = 2 up to the number of widths tracks, with gptq_column's BLOCK and OPTIONS.

Budgets (BUDGETS): the hottest loop's instructions and integer-pipe instructions per weight (per row element for the
column kernels; column_step has no loop: the whole kernel) are today's counts plus max(4, 1 % of the count) for
ptxas's scheduling of an unrelated change, divided by the weights a thread handles per iteration and rounded up to
0.01; `blocks` is the resident blocks per multiprocessor today's registers allow (65536 registers / (threads per
block · registers rounded up to the allocation unit of 8)), and the registers must keep it; the loops that pipeline
their global loads (LDGSTS: GEMM's x tiles behind tl.dot) must keep doing so; no kernel may use local memory (spills)
but those of KNOWN_LOCAL.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from tests.conftest import require_peer

require_peer("triton")

from matgptq.kernels import NestedLayout, gptq_column  # noqa: E402
from matgptq.kernels.triton_nested import NestedKernel, plan  # noqa: E402
from matgptq.quantization.config import DEFAULT_GROUP_SIZE, MAX_BITS, MIN_BITS  # noqa: E402
from matgptq.runtime.nested import Resident  # noqa: E402
from tests.kernels.sass import compile_all  # noqa: E402

SMS = 132  # an H100's multiprocessors: auto_split's input
REGISTERS_PER_SM, REGISTER_UNIT = 65536, 8
TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
ROWS = {NestedKernel.GEMV: 1, NestedKernel.GEMM: 16}


@dataclass(frozen=True)
class Situation:
    dtype: torch.dtype = torch.bfloat16  # a Llama checkpoint's own dtype
    k: int = 8192  # in_features; 8192 × 8192: EVEN (no masks), SPLIT_K 1 (256 GEMV programs on 132 SMs)
    n: int = 8192  # out_features
    group_size: int | None = DEFAULT_GROUP_SIZE  # None: one group per row (GS = K)


SITUATIONS = {
    "default": Situation(),
    "masked": Situation(k=11008, n=4096),  # 344 words of K, not a multiple of BLOCK_K's 32: EVEN False
    "per-channel": Situation(k=11008, n=4096, group_size=None),  # GS = 11008: a divisor no power of two
    "split": Situation(k=4096, n=1024),  # 32 GEMV blocks of N: SPLIT_K 4
    "generic": Situation(group_size=48),  # groups not whole words: the generic path
    "fp16": Situation(dtype=torch.float16),
    "fp32": Situation(dtype=torch.float32),  # GEMM: IEEE float32 tl.dot
    "fp32 generic": Situation(dtype=torch.float32, group_size=48),  # the one pair found to interact (KNOWN_LOCAL)
}
VARIANTS = {  # the situations other than "default", per kernel (a GEMM's launch does not depend on K and N)
    NestedKernel.GEMV: ("masked", "per-channel", "split", "generic", "fp16", "fp32"),
    NestedKernel.GEMM: ("generic", "fp16", "fp32", "fp32 generic"),
}
VARIANT_WIDTHS = ((4, Resident.PARENT), (MAX_BITS, Resident.PARENT))


def meta_layout(s: Situation, bits: int, resident: Resident) -> NestedLayout:
    """The layout NestedLinear builds at `bits` from a MAX_BITS-bit parent (runtime/nested.py), shapes only (meta
    tensors): SLICE holds the slice's r planes (the parent's own at r = c), PARENT all c."""
    sliced = resident is Resident.SLICE and bits < MAX_BITS
    planes = torch.empty(bits if sliced else MAX_BITS, -(-s.k // 32), s.n, dtype=torch.int32, device="meta")
    meta = torch.empty(0, device="meta")
    return NestedLayout(planes, {}, meta, s.group_size or s.k, MAX_BITS, s.k, None, sliced)


def nested_spec(kernel: NestedKernel, s: Situation, bits: int, resident: Resident) -> dict:
    """sass.py's spec of the launch plan() makes, specialised as Triton's JIT would: sizes equal to 1 become
    constexprs, sizes divisible by 16 and every pointer (torch allocations) get the divisibility hint."""
    layout = meta_layout(s, bits, resident)
    const = dict(plan(layout, bits, ROWS[kernel], s.dtype, kernel, sms=SMS).constexprs)
    warps = const.pop("num_warps")
    t = TYPES[s.dtype]
    sig = {"x": f"*{t}", "planes": "*i32", "scales": "*fp16", "zeros": "*u8"}
    sig["y"] = "*fp32" if const.get("SPLIT_K", 1) > 1 else f"*{t}"  # split-K adds into a float32 buffer
    sizes = {"M": ROWS[kernel], "K": s.k, "N": s.n, "K32": layout.planes.shape[1]}
    sig.update(dict.fromkeys(sizes, "i32"))
    const.update({a: 1 for a, v in sizes.items() if v == 1})
    divisible = ["x", "planes", "scales", "zeros", "y"] + [a for a, v in sizes.items() if v % 16 == 0]
    fn = f"matgptq.kernels._triton_src:{kernel.value}"
    return dict(fn=fn, signature=sig, constexprs=const, divisible=divisible, options={"num_warps": warps})


def nested_specs() -> dict[str, dict]:
    out = {}
    for kernel in NestedKernel.GEMV, NestedKernel.GEMM:
        cases = [(r, res, "default") for r in range(MIN_BITS, MAX_BITS + 1) for res in Resident]
        cases += [(r, res, v) for r, res in VARIANT_WIDTHS for v in VARIANTS[kernel]]
        for r, res, v in cases:
            if res is Resident.SLICE and r == MAX_BITS:
                continue  # the slice at the master width is the parent
            out[f"{kernel.value} {r}-bit {res.value} {v}"] = nested_spec(kernel, SITUATIONS[v], r, res)
    return out


def column_specs() -> dict[str, dict]:
    """sass.py's specs of gptq_column's launches: column_step at MAXQ = 2^b − 1 of every width, per_width_step at every
    number of tracks (widths) above one; rows (N) and pointers divisible by 16, the cell table's sizes not."""
    f32 = dict.fromkeys(("w", "scale", "zero", "diag", "codes", "err"), "*fp32")
    out = {}
    for b in range(MIN_BITS, MAX_BITS + 1):
        out[f"column_step {b}-bit"] = dict(
            fn="matgptq.kernels._column_src:column_step",
            signature={**f32, "N": "i32"},
            constexprs=dict(MAXQ=float((1 << b) - 1), BLOCK=gptq_column.BLOCK),
            divisible=[*f32, "N"],
            options=gptq_column.OPTIONS,
        )
    tables = {"cells": "*fp64", "lam": "*fp64", "table": "*i32"}
    for t in range(2, MAX_BITS - MIN_BITS + 2):
        out[f"per_width_step {t} tracks"] = dict(
            fn="matgptq.kernels._column_src:per_width_step",
            signature={**f32, **tables, "N": "i32", "NCELLS": "i32", "CSTRIDE": "i32"},
            constexprs=dict(T=t, BLOCK=gptq_column.BLOCK),
            divisible=[*f32, *tables, "N"],
            options=gptq_column.OPTIONS,
        )
    return out


def weights_per_iteration(spec: dict, threads: int) -> float:
    """Weights (row elements for the column kernels) one thread handles per iteration of the hottest loop."""
    c = spec["constexprs"]
    return (c["BLOCK_N"] * c["BLOCK_K"] if "BLOCK_N" in c else c["BLOCK"]) / threads


SPECS = {**nested_specs(), **column_specs()}


@dataclass(frozen=True)
class Budget:
    instructions: float  # hottest loop, per weight, at most
    integer: float  # of those, integer-pipe (sass.CLASSES["int"]), at most
    blocks: int  # resident blocks per multiprocessor the registers must allow
    pipelined: bool = False  # the hottest loop must issue asynchronous global loads (LDGSTS)


B = Budget
# Today's sm_90 compile (Triton and ptxas of the kernels extra). A row: B(instructions, integer, blocks[, pipelined]);
# the comment holds today's hottest-loop instructions and integer instructions, the weights per thread and iteration
# they are divided by, and the registers per thread. instructions, integer: ⌈(count + max(4, 1 % of count)) / weights⌉
# to 0.01 (module doc). blocks: 65536 // (threads · registers rounded up to 8), at most 2048 // threads (Hopper's 64
# warps per multiprocessor): GEMV and GEMM run 128 threads, so 64 registers give 8 blocks, 80 give 6, 128 give 4 and
# 255 give 2. Lower a row when a change saves; raise one only with a GPU measurement that pays for it.
BUDGETS: dict[str, Budget] = {
    "gemv 2-bit slice default": B(5.89, 3.02, 8),  # 1492, 763 / 256; 64
    "gemv 2-bit parent default": B(6.25, 3.35, 6),  # 1583, 848 / 256; 79
    "gemv 3-bit slice default": B(6.09, 3.2, 6),  # 1543, 808 / 256; 79
    "gemv 3-bit parent default": B(6.6, 3.69, 6),  # 1671, 934 / 256; 79
    "gemv 4-bit slice default": B(6.43, 3.52, 7),  # 1627, 890 / 256; 71
    "gemv 4-bit parent default": B(6.79, 3.87, 6),  # 1718, 979 / 256; 80
    "gemv 5-bit slice default": B(8.25, 5.37, 5),  # 2091, 1360 / 256; 96
    "gemv 5-bit parent default": B(9.1, 6.21, 4),  # 2305, 1572 / 256; 121
    "gemv 6-bit slice default": B(9, 6.11, 5),  # 2280, 1547 / 256; 96
    "gemv 6-bit parent default": B(9.67, 6.77, 4),  # 2449, 1714 / 256; 119
    "gemv 7-bit slice default": B(9.69, 6.79, 4),  # 2455, 1720 / 256; 119
    "gemv 7-bit parent default": B(10.57, 7.66, 4),  # 2677, 1940 / 256; 122
    "gemv 8-bit parent default": B(10.41, 7.54, 4),  # 2637, 1908 / 256; 121
    "gemv 4-bit parent masked": B(7.32, 4.31, 7),  # 1854, 1092 / 256; 72
    "gemv 4-bit parent per-channel": B(7.31, 4.31, 7),  # 1852, 1090 / 256; 72
    "gemv 4-bit parent split": B(6.77, 3.85, 5),  # 1713, 974 / 256; 90
    "gemv 4-bit parent generic": B(45.19, 22.38, 9),  # 715, 354 / 16; 56
    "gemv 4-bit parent fp16": B(6.79, 3.74, 6),  # 1718, 947 / 256; 80
    "gemv 4-bit parent fp32": B(6.64, 3.72, 5),  # 1681, 942 / 256; 90
    "gemv 8-bit parent masked": B(10.93, 7.92, 4),  # 2770, 2006 / 256; 126
    "gemv 8-bit parent per-channel": B(10.93, 7.92, 4),  # 2770, 2006 / 256; 126
    "gemv 8-bit parent split": B(10.41, 7.54, 4),  # 2637, 1908 / 256; 120
    "gemv 8-bit parent generic": B(59, 34.07, 9),  # 934, 539 / 16; 56
    "gemv 8-bit parent fp16": B(10.41, 7.41, 4),  # 2637, 1876 / 256; 121
    "gemv 8-bit parent fp32": B(10.29, 7.41, 4),  # 2605, 1876 / 256; 119
    "gemm 2-bit slice default": B(9.97, 4.99, 5, True),  # 2525, 1263 / 256; 96
    "gemm 2-bit parent default": B(10.37, 5.4, 4, True),  # 2626, 1366 / 256; 128
    "gemm 3-bit slice default": B(10.24, 5.31, 4, True),  # 2593, 1343 / 256; 128
    "gemm 3-bit parent default": B(10.7, 5.72, 3, True),  # 2711, 1448 / 256; 133
    "gemm 4-bit slice default": B(10.56, 5.52, 4, True),  # 2675, 1397 / 256; 128
    "gemm 4-bit parent default": B(10.93, 5.87, 4, True),  # 2769, 1486 / 256; 128
    "gemm 5-bit slice default": B(11.64, 6.58, 4, True),  # 2948, 1665 / 256; 128
    "gemm 5-bit parent default": B(12.48, 7.41, 3, True),  # 3162, 1877 / 256; 168
    "gemm 6-bit slice default": B(12.43, 7.31, 3, True),  # 3148, 1852 / 256; 138
    "gemm 6-bit parent default": B(13.1, 7.94, 2, True),  # 3318, 2011 / 256; 173
    "gemm 7-bit slice default": B(13.05, 7.89, 2, True),  # 3306, 1999 / 256; 179
    "gemm 7-bit parent default": B(14.08, 8.88, 2, True),  # 3566, 2249 / 256; 174
    "gemm 8-bit parent default": B(13.68, 8.52, 2, True),  # 3465, 2159 / 256; 255
    "gemm 4-bit parent generic": B(32.13, 22.16, 4, True),  # 1017, 701 / 32; 110
    "gemm 4-bit parent fp16": B(10.93, 5.87, 4, True),  # 2769, 1486 / 256; 128
    "gemm 4-bit parent fp32": B(32.13, 5.67, 2, True),  # 8141, 1436 / 256; 255
    "gemm 4-bit parent fp32 generic": B(56.5, 22.54, 2, True),  # 1790, 713 / 32; 255
    "gemm 8-bit parent generic": B(44.63, 33.04, 4, True),  # 1413, 1046 / 32; 108
    "gemm 8-bit parent fp16": B(13.68, 8.52, 2, True),  # 3465, 2159 / 256; 255
    "gemm 8-bit parent fp32": B(35.06, 8.53, 2, True),  # 8886, 2160 / 256; 255
    "gemm 8-bit parent fp32 generic": B(69.29, 33.69, 2, True),  # 2195, 1067 / 32; 255
    "column_step 2-bit": B(69.75, 10.25, 10),  # 552, 78 / 8; 47
    "column_step 3-bit": B(69.75, 10.25, 10),  # 552, 78 / 8; 47
    "column_step 4-bit": B(69.75, 10.25, 10),  # 552, 78 / 8; 47
    "column_step 5-bit": B(69.75, 10.25, 10),  # 552, 78 / 8; 47
    "column_step 6-bit": B(69.75, 10.25, 10),  # 552, 78 / 8; 47
    "column_step 7-bit": B(69.75, 10.25, 10),  # 552, 78 / 8; 47
    "column_step 8-bit": B(69.75, 10.25, 10),  # 552, 78 / 8; 47
    "per_width_step 2 tracks": B(31.5, 11.38, 3),  # 248, 87 / 8; 152
    "per_width_step 3 tracks": B(34.63, 11.13, 2),  # 273, 85 / 8; 176
    "per_width_step 4 tracks": B(37.13, 11.25, 2),  # 293, 86 / 8; 194
    "per_width_step 5 tracks": B(40.38, 10, 2),  # 319, 76 / 8; 216
    "per_width_step 6 tracks": B(42.75, 12.38, 2),  # 338, 95 / 8; 238
    "per_width_step 7 tracks": B(42.38, 11.25, 2),  # 335, 86 / 8; 249
}
# Local memory (bytes) today, where not 0: IEEE float32 tl.dot on the generic path's float tile (a float32 model on the
# GPU with groups that are not whole words) runs out of registers and spills.
KNOWN_LOCAL: dict[str, int] = {"gemm 4-bit parent fp32 generic": 248, "gemm 8-bit parent fp32 generic": 248}


@pytest.fixture(scope="module")
def compiled() -> dict:
    try:
        return compile_all(SPECS)
    except RuntimeError as e:
        if "ptxas" in str(e) and "not found" in str(e).lower():
            pytest.skip("Triton's wheel carries no ptxas here")
        raise


def test_every_configuration_has_a_budget():
    assert sorted(set(SPECS) - set(BUDGETS)) == [], "a configuration without a budget: add its row to BUDGETS"
    assert sorted(set(BUDGETS) - set(SPECS)) == [], "a budget of no configuration: remove its row"


@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_budget(compiled, name):
    st, budget = compiled[name], BUDGETS[name]
    per = weights_per_iteration(SPECS[name], st["threads"])
    top = dict(list(st["ops"].items())[:12])
    assert st["loop"] / per <= budget.instructions, f"{st['loop'] / per:.3f} instructions per weight; loop: {top}"
    assert st["int"] / per <= budget.integer, f"{st['int'] / per:.3f} integer instructions per weight; loop: {top}"
    cap = REGISTERS_PER_SM // (st["threads"] * budget.blocks) // REGISTER_UNIT * REGISTER_UNIT
    assert st["registers"] <= cap, (
        f"{st['registers']} registers: {budget.blocks} blocks of {st['threads']} need ≤ {cap}"
    )
    assert st["local_bytes"] <= KNOWN_LOCAL.get(name, 0), f"{st['local_bytes']} bytes of local memory (spills)"
    assert name in KNOWN_LOCAL or st["spill_ops"] == 0, f"{st['spill_ops']} local loads/stores"
    assert st["pipelined"] > 0 or not budget.pipelined, f"no LDGSTS left in the loop: {top}"
