"""Every Triton kernel of the package compiled for a Hopper GPU (sm_90) on this machine, GPU or not: Triton's own
compiler and the ptxas its wheel carries, in a child process with TRITON_INTERPRET=0 (the interpreter, which the other
kernel tests use on a CPU, accepts code the compiler refuses, e.g. a float64 div_rn). And the premise of the column
kernels' bit-for-bit claim (kernels/gptq_column.py): no multiply-add contraction, IEEE divisions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_peer

require_peer("triton")

ROOT = Path(__file__).resolve().parents[2]
CHILD = r"""
import json, re
from triton import compile
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from matgptq.kernels import _column_src as cs, _triton_src as ts

TARGET = GPUTarget("cuda", 90, 32)
words = dict(C=8, GS=128, CARRY=True, WORDS=True, BLOCK_N=32, BLOCK_K=1024)
nested = {"x": "*fp16", "planes": "*i32", "scales": "*fp16", "zeros": "*u8", "y": "*fp16", "M": "i32", "K": "i32",
          "N": "i32", "K32": "i32"}
column = {"w": "*fp32", "scale": "*fp32", "zero": "*fp32", "diag": "*fp32"}
cases = {
    "column_step": (cs.column_step, {**column, "codes": "*fp32", "err": "*fp32", "N": "i32"},
                    dict(MAXQ=15.0, BLOCK=1024)),
    "per_width_step": (cs.per_width_step, {**column, "cells": "*fp64", "lam": "*fp64", "table": "*i32",
                                           "codes": "*fp32", "err": "*fp32", "N": "i32", "NCELLS": "i32",
                                           "CSTRIDE": "i32"}, dict(T=3, BLOCK=1024)),
    "gemv 4-bit hoist split": (ts.gemv, nested, dict(BITS=4, LB=4, LANES=0x11111111, SPLIT_K=2, INPLACE=True,
                                                     EVEN=True, HOIST=True, **words)),
    "gemv 7-bit": (ts.gemv, nested, dict(BITS=7, LB=8, LANES=0x01010101, SPLIT_K=1, INPLACE=True, EVEN=False,
                                         HOIST=False, **words)),
    "gemm 4-bit hoist": (ts.gemm, nested, dict(BITS=4, LB=4, LANES=0x11111111, BLOCK_M=16, IEEE=False, HOIST=True,
                                               **{**words, "BLOCK_N": 64, "BLOCK_K": 512})),
}
out = {}
for name, (fn, sig, const) in cases.items():
    sig = {**sig, **{k: "constexpr" for k in const}}
    fp = name.startswith(("column", "per_width"))
    k = compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=TARGET,
                options={"enable_fp_fusion": False} if fp else {})
    ptx = k.asm["ptx"]
    out[name] = {"cubin": len(k.asm["cubin"]), "fma": len(re.findall(r"\bfma\.", ptx)),
                 "div_full": len(re.findall(r"\bdiv\.(full|approx)", ptx)),
                 "div_rn_f64": len(re.findall(r"\bdiv\.rn\.f64", ptx))}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled() -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 and "ptxas" in done.stderr and "not found" in done.stderr.lower():
        pytest.skip("Triton's wheel carries no ptxas here")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_kernel_compiles_for_hopper(compiled):
    assert set(compiled) == {
        "column_step",
        "per_width_step",
        "gemv 4-bit hoist split",
        "gemv 7-bit",
        "gemm 4-bit hoist",
    }
    assert all(c["cubin"] > 0 for c in compiled.values()), compiled


def test_column_kernels_round_every_operation_on_its_own(compiled):
    for name in ("column_step", "per_width_step"):
        assert compiled[name]["fma"] == 0 and compiled[name]["div_full"] == 0, compiled[name]
    assert compiled["per_width_step"]["div_rn_f64"] > 0  # u = w / s + z in float64, IEEE-rounded
