"""SASS statistics of Triton kernels compiled for a Hopper GPU (sm_90) on any machine, GPU or not (a test helper).

Triton's wheel carries ptxas and cuobjdump, so `triton.compile` of an ASTSource for GPUTarget("cuda", 90, 32) yields
the cubin a GPU would run, and cuobjdump its machine code. `compile_all` does that for many kernels in one child
process (TRITON_INTERPRET=0: the tests' own process runs Triton's interpreter, tests/conftest.py) and returns, per
kernel, JSON-able counts of its hottest loop by instruction class, its registers and its local memory (`stats`).

A spec names the kernel ("module:function"), its runtime arguments' Triton types, its constexprs, the arguments the
JIT would specialise as multiples of 16 (pointers from torch allocations, sizes divisible by 16; without the hint the
SASS has bounds arithmetic the GPU never runs) and the compile options (num_warps, num_stages, ...).
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# SASS opcodes (before the first dot) by the work they do. int: integer arithmetic, logic, shifts, compares (Hopper's
# integer pipe runs at half the FP32 rate; IMAD, which may issue to the FMA pipe, is counted here too); fp: float
# arithmetic; mem: loads and stores; mma: tensor cores. Anything else (MOV, BRA, BAR, S2R, ...) counts in the total only.
CLASSES = {
    "int": {"IADD3", "IMAD", "LEA", "LOP3", "SHF", "SHL", "SHR", "ISETP", "SEL", "PRMT", "SGXT", "BMSK", "IMNMX"}
    | {"IABS", "VIADD", "VIMNMX", "I2F", "F2I"},
    "fp": {"FADD", "FFMA", "FMUL", "FSEL", "FMNMX", "FSETP", "HADD2", "HFMA2", "HMUL2", "F2FP", "DADD", "DFMA", "DMUL"},
    "mem": {"LDG", "STG", "LDS", "STS", "LDSM", "LDGSTS", "ATOMG", "RED", "LDC", "LDL", "STL"},
    "mma": {"HMMA", "HGMMA", "IMMA"},
}
PIPELINED = ("LDGSTS", "UTMALDG")  # asynchronous global → shared copies (cp.async, TMA): a software pipeline's loads
_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)(?:\.[A-Z0-9_.]+)?\s*([^;]*);")


def compile_all(specs: dict[str, dict], timeout: float = 600) -> dict[str, dict]:
    """{name: spec} → {name: stats} (module doc, `stats`), every kernel compiled in one child process."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "tests.kernels.sass"],
        input=json.dumps(specs),
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"compiling for sm_90 failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def instructions(sass: str) -> list[tuple[int, str, str]]:
    """(address, opcode, operands) of every instruction in cuobjdump -sass output."""
    return [(int(m[1], 16), m[2], m[3]) for m in map(_LINE.match, sass.splitlines()) if m]


def hot_loop(ins: list[tuple[int, str, str]]) -> list[str]:
    """Opcodes of the widest loop (the backward branch spanning the most instructions), or of the whole kernel when
    it has no loop."""
    spans = []
    for addr, op, operands in ins:
        target = re.search(r"0x([0-9a-f]+)", operands)
        if op == "BRA" and target and int(target[1], 16) < addr:
            spans.append((int(target[1], 16), addr))
    lo, hi = max(spans, key=lambda s: s[1] - s[0]) if spans else (0, ins[-1][0])
    return [op for addr, op, _ in ins if lo <= addr <= hi]


def stats(dump: str, threads: int) -> dict:
    """The hottest loop's instruction count, its counts by class (CLASSES) and of pipelined loads; the kernel's
    registers per thread, local memory (stack frame and spills, bytes), local loads and stores, threads per block."""
    ins = instructions(dump)
    loop = collections.Counter(hot_loop(ins))
    everywhere = collections.Counter(op for _, op, _ in ins)
    usage = {k: int(v) for k, v in re.findall(r"\b(REG|STACK|LOCAL):(\d+)", dump)}
    out = {"loop": sum(loop.values()), **{k: sum(loop[o] for o in ops) for k, ops in CLASSES.items()}}
    out["pipelined"] = sum(loop[o] for o in PIPELINED)
    out["registers"], out["threads"] = usage["REG"], threads
    out["local_bytes"] = usage["STACK"] + usage["LOCAL"]
    out["spill_ops"] = everywhere["LDL"] + everywhere["STL"]
    out["ops"] = dict(loop.most_common())
    return out


def _compile(spec: dict):
    """The sm_90 CompiledKernel of one spec (child process only: imports Triton with TRITON_INTERPRET=0)."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, name = spec["fn"].split(":")
    fn = getattr(importlib.import_module(module), name)
    names = fn.arg_names  # the kernel's parameter order, which the signature must follow
    signature = {a: "constexpr" if a in spec["constexprs"] else spec["signature"][a] for a in names}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in spec.get("divisible", ())}
    source = ASTSource(fn=fn, signature=signature, constexprs=spec["constexprs"], attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=spec.get("options", {}))


def _cuobjdump(cubin: bytes) -> str:
    """The resource usage and SASS of a cubin, by the cuobjdump Triton's wheel carries."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        return subprocess.run(
            [str(tool), "-res-usage", "-sass", str(path)], capture_output=True, text=True, check=True
        ).stdout


def main() -> None:
    """Child process: specs as JSON on stdin, {name: stats} as one JSON line on stdout."""
    out = {}
    for name, spec in json.load(sys.stdin).items():
        kernel = _compile(spec)
        out[name] = stats(_cuobjdump(kernel.asm["cubin"]), 32 * kernel.metadata.num_warps)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
