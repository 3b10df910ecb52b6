"""--device: names resolved to torch devices; a CUDA device on a machine without one is a one-line error (exit 2)
for quantize, eval and search, before anything is loaded or written."""

from __future__ import annotations

import pytest
import torch

from matgptq.errors import UserError
from matgptq.execution import resolve_device
from tests.conftest import STORIES, TINYSTORIES
from tests.test_cli import run_error

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")


def test_cpu_and_auto_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == resolve_device(None) == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")


@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_cuda_is_refused(monkeypatch, spec):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="needs CUDA"):
        resolve_device(spec)


@pytest.mark.parametrize("spec", ["gpu", "cuda:x", "mps:0", "cuda:-1"])
def test_unknown_names_are_refused(spec):
    with pytest.raises(UserError, match="is not a device"):
        resolve_device(spec)


def test_index_past_the_last_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(UserError, match="has 2 CUDA device"):
        resolve_device("cuda:2")


def test_bare_cuda_under_torchrun_is_the_local_rank(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda", 3)


@no_cuda
def test_cli_device_cuda_without_cuda(tmp_path, capsys):
    """quantize, eval and search: exit 2, one line, nothing written."""
    out = tmp_path / "out"
    quantize = [
        "quantize",
        str(STORIES),
        "--out",
        str(out),
        "--calib",
        str(TINYSTORIES),
        "--nsamples",
        "2",
        "--seqlen",
        "32",
        "--quiet",
        "--device",
        "cuda",
    ]
    assert "needs CUDA" in run_error(quantize, capsys)
    assert "needs CUDA" in run_error(["eval", str(STORIES), "--text", str(TINYSTORIES), "--device", "cuda:0"], capsys)
    search = [
        "search",
        str(tmp_path / "parent"),
        "--budget",
        "3.5",
        "--calib",
        str(TINYSTORIES),
        "--out",
        str(out),
        "--device",
        "cuda",
    ]
    assert "needs CUDA" in run_error(search, capsys)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_auto_score_dtype_is_bfloat16_only_where_native(monkeypatch):
    from matgptq.allocation import ScoreDtype
    from matgptq.execution import native_bfloat16

    cpu = torch.device("cpu")
    for native in (True, False):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
        assert native_bfloat16(cpu) is native
        assert ScoreDtype.AUTO.resolve(cpu) == (torch.bfloat16 if native else torch.float32)
    assert ScoreDtype.FLOAT32.resolve(cpu) == torch.float32 and ScoreDtype.BFLOAT16.resolve(cpu) == torch.bfloat16


def test_auto_compute_dtype_is_float32_only_for_an_emulated_half_dtype(monkeypatch):
    """compute_dtype's table, written out: auto keeps the model's own dtype except a half one the CPU lacks (the CPU
    flags set by hand: AVX512-BF16 or AMX tiles for bfloat16, AMX-FP16 for float16); an explicit choice is kept."""
    from matgptq.execution import compute_dtype, native_half

    cpu, flags = torch.device("cpu"), ("_is_avx512_bf16_supported", "_is_amx_tile_supported", "_is_amx_fp16_supported")
    for on in (*flags, None):
        for name in flags:
            monkeypatch.setattr(torch.cpu, name, lambda name=name: name == on)
        has = {"bfloat16": on in flags[:2], "float16": on == flags[2]}
        for stored in ("bfloat16", "float16"):
            assert native_half(getattr(torch, stored), cpu) is has[stored]
            assert compute_dtype("auto", stored, cpu) == (None if has[stored] else torch.float32)
            assert compute_dtype(stored, stored, cpu) == getattr(torch, stored)
        assert compute_dtype("auto", "float32", cpu) is None and compute_dtype("auto", None, cpu) is None
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert compute_dtype("auto", "bfloat16", torch.device("cuda", 0)) is None  # a GPU computes in the model's own


def test_bfloat16_scoring_on_a_gpu_without_it_is_refused(monkeypatch):
    from matgptq.allocation import ScoreDtype

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    with pytest.raises(UserError, match="has no bfloat16"):
        ScoreDtype.BFLOAT16.resolve(torch.device("cuda", 0))
    assert ScoreDtype.AUTO.resolve(torch.device("cuda", 0)) == torch.float32
