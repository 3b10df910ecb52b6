"""`torchrun --nproc-per-node 2 -m matgptq quantize` on CPU (gloo): the checkpoint equals the single-process one.

Tolerance. The two runs differ only in the Hessians' float32 summation order (a sum of per-rank sums instead of one
running sum: relative differences ~1e-7). A code can change only where GPTQ's compensated weight lies within that
distance of a rounding boundary: ~2^b · 1e-7 of the codes at b bits (2.6e-5 at 8), and the error feedback can carry
one such flip along the rest of its row (≤ K codes). On the ~1e5 codes here that bounds the differing codes at a few
rows' worth, < 1%: asserted ≥ 99% equal (measured on this machine: all equal). Everything else (embeddings, norms,
scales' shapes, layer names) must be identical.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import matgptq
from tests.conftest import TINYSTORIES, make_tiny_llama

ARGS = [
    "--calib",
    str(TINYSTORIES),
    "--calib-range",
    "0.6:1",
    "--method",
    "matgptq",
    "--bits",
    "3,4,8",
    "--nsamples",
    "32",
    "--seqlen",
    "64",
    "--group-size",
    "32",
    "--quiet",
]


def torchrun(*args: str, nproc: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "-m",
        "matgptq",
        "quantize",
        *args,
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("dist") / "m", layers=3)


def test_two_gloo_processes_write_the_single_process_checkpoint(model, tmp_path):
    torch.set_num_threads(1)  # the same threads as each torchrun process
    one = tmp_path / "one"
    matgptq.quantize(
        model,
        one,
        calib=TINYSTORIES,
        calib_range=(0.6, 1.0),
        method="matgptq",
        bits=(3, 4, 8),
        nsamples=32,
        seqlen=64,
        group_size=32,
        progress=False,
    )
    two = tmp_path / "two"
    run = torchrun(str(model), "--out", str(two), *ARGS)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("wrote ") == 1  # rank 0 reports and writes, the other rank only computes
    a, b = load_file(str(one / "model.safetensors")), load_file(str(two / "model.safetensors"))
    assert sorted(a) == sorted(b)
    same = total = 0
    for name in a:
        if name.endswith(".codes"):
            same += int((a[name] == b[name]).sum())
            total += a[name].numel()
        elif ".scales" not in name:  # scales (master and per-width) follow the Hessian's sums; the rest is untouched
            assert torch.equal(a[name], b[name]), name
    assert same / total >= 0.99, same / total
    assert matgptq.load(two, bits=4) is not None


def test_more_processes_than_windows_is_one_line(model, tmp_path):
    run = torchrun(
        str(model), "--out", str(tmp_path / "x"), *ARGS[:-5], "--nsamples", "1", "--seqlen", "64", "--quiet", nproc=2
    )
    assert run.returncode != 0
    assert "1 calibration windows for 2 processes" in run.stderr
    assert not (tmp_path / "x").exists()
