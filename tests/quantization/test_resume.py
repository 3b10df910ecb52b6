"""Resumable quantization: a run killed after some blocks continues with --resume to the checkpoint an uninterrupted
run writes (tensors bit for bit); states from other settings, or left without --resume, are refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import matgptq
from matgptq.cli import main
from matgptq.errors import UserError
from matgptq.quantization.resume import BlockState
from tests.conftest import TINYSTORIES, make_tiny_llama

ARGS = dict(
    calib=TINYSTORIES,
    calib_range=(0.6, 1.0),
    method="matgptq",
    bits=(3, 4, 8),
    nsamples=16,
    seqlen=64,
    group_size=32,
    act_order=True,
    static_groups=False,
    progress=False,
)


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("resume") / "deep", layers=6)


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def _same_checkpoint(a: Path, b: Path) -> None:
    ta, tb = _tensors(a), _tensors(b)
    assert sorted(ta) == sorted(tb)
    for name in ta:
        assert torch.equal(ta[name], tb[name]), name
    ra = [
        {k: v for k, v in r.items() if k != "seconds"} for r in json.loads((a / "matgptq.json").read_text())["report"]
    ]
    rb = [
        {k: v for k, v in r.items() if k != "seconds"} for r in json.loads((b / "matgptq.json").read_text())["report"]
    ]
    assert ra == rb


class _Stop(Exception):
    pass


def test_stopped_run_resumes_to_the_uninterrupted_checkpoint(deep, tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    matgptq.quantize(deep, whole, **ARGS)
    assert not (tmp_path / ".whole.resume").exists()  # removed once the checkpoint is written

    out = tmp_path / "stopped"
    save = BlockState.save

    def stop_after_three(self, done, *args):
        save(self, done, *args)
        if done == 3:
            raise _Stop

    monkeypatch.setattr(BlockState, "save", stop_after_three)
    with pytest.raises(_Stop):
        matgptq.quantize(deep, out, **ARGS)
    monkeypatch.undo()
    assert not out.exists() and json.loads((tmp_path / ".stopped.resume" / "state.json").read_text())["done"] == 3
    with pytest.raises(UserError, match="unfinished run"):  # neither thrown away nor mixed in silently
        matgptq.quantize(deep, out, **ARGS)
    with pytest.raises(UserError, match="other settings"):
        matgptq.quantize(deep, out, **{**ARGS, "bits": (3, 8)}, resume=True)
    matgptq.quantize(deep, out, **ARGS, resume=True)
    _same_checkpoint(whole, out)
    assert not (tmp_path / ".stopped.resume").exists()


def test_a_run_killed_with_sigkill_resumes(deep, tmp_path):
    whole = tmp_path / "whole"
    matgptq.quantize(deep, whole, **ARGS)
    killed = tmp_path / "killed"
    cli = [
        "quantize",
        str(deep),
        "--out",
        str(killed),
        "--calib",
        str(TINYSTORIES),
        "--calib-range",
        "0.6:1",
        "--method",
        "matgptq",
        "--bits",
        "3,4,8",
        "--nsamples",
        "16",
        "--seqlen",
        "64",
        "--group-size",
        "32",
        "--act-order",
        "--no-static-groups",
        "--quiet",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
        "OMP_NUM_THREADS": str(torch.get_num_threads()),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "matgptq", *cli], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    state, done = tmp_path / ".killed.resume" / "state.json", 0
    deadline = time.monotonic() + 300
    while done < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
        try:
            done = json.loads(state.read_text())["done"] if state.exists() else 0
        except (OSError, ValueError):  # replaced while read: read again
            pass
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    assert not killed.exists() and 2 <= json.loads(state.read_text())["done"] < 6
    assert main([*cli, "--resume"]) == 0
    _same_checkpoint(whole, killed)


def _stop_after(monkeypatch, blocks: int):
    save = BlockState.save

    def stop(self, done, *args):
        save(self, done, *args)
        if done == blocks:
            raise _Stop

    monkeypatch.setattr(BlockState, "save", stop)


@pytest.mark.parametrize("first,second", [(False, False), (True, False), (False, True)])
def test_resume_across_streamed_and_in_memory_runs(deep, tmp_path, monkeypatch, first, second):
    """Streaming changes nothing in the result, so a state left by either kind of run (model streamed from its
    files, or loaded whole: its finished layers are written back into the model from the block files) resumes
    under either to the uninterrupted streamed checkpoint."""
    whole = tmp_path / "whole"
    matgptq.quantize(deep, whole, **ARGS)
    out = tmp_path / "out"
    _stop_after(monkeypatch, 2)
    with pytest.raises(_Stop):
        matgptq.quantize(deep, out, stream=first, **ARGS)
    monkeypatch.undo()
    matgptq.quantize(deep, out, stream=second, resume=True, **ARGS)
    _same_checkpoint(whole, out)


def test_a_lost_block_file_is_damage(deep, tmp_path, monkeypatch):
    out = tmp_path / "out"
    _stop_after(monkeypatch, 3)
    with pytest.raises(_Stop):
        matgptq.quantize(deep, out, **ARGS)
    monkeypatch.undo()
    (tmp_path / ".out.resume" / "block-1.safetensors").unlink()
    with pytest.raises(UserError, match="damaged.*block-1"):
        matgptq.quantize(deep, out, resume=True, **ARGS)
    assert not out.exists()


def test_a_width_mix_resumes_in_memory_reading_each_layer_at_its_width(deep, tmp_path, monkeypatch):
    """An in-memory resume writes the finished layers back from the block files, each unpacked at its own width
    (a width mix, quantize --bits-config): the result is the uninterrupted run's, and another mix is refused."""
    mix = {"*": 4, "model.layers.0.self_attn.v_proj": 8, "model.layers.1.mlp.down_proj": 3}
    args = {**ARGS, "method": "gptq", "bits": None, "bits_config": mix, "stream": False}
    whole = tmp_path / "whole"
    matgptq.quantize(deep, whole, **args)
    out = tmp_path / "out"
    _stop_after(monkeypatch, 2)
    with pytest.raises(_Stop):
        matgptq.quantize(deep, out, **args)
    monkeypatch.undo()
    with pytest.raises(UserError, match="other settings"):
        matgptq.quantize(deep, out, **{**args, "bits_config": {**mix, "*": 5}}, resume=True)
    matgptq.quantize(deep, out, resume=True, **args)
    _same_checkpoint(whole, out)


def test_a_state_saved_at_another_batch_size_is_refused(deep, tmp_path, monkeypatch):
    """The saved hidden states are per forward batch: a state from a run with another default batch size (an older
    version's 4,096 tokens) is refused in one line naming the setting, not read as damaged or mixed in."""
    from matgptq.quantization import pipeline

    out = tmp_path / "out"
    monkeypatch.setattr(pipeline, "BATCH_TOKENS", 4 * ARGS["seqlen"])
    _stop_after(monkeypatch, 2)
    with pytest.raises(_Stop):
        matgptq.quantize(deep, out, **ARGS)
    monkeypatch.undo()
    with pytest.raises(UserError, match=r"other settings \(batch_tokens\)"):
        matgptq.quantize(deep, out, resume=True, **ARGS)
    assert not out.exists()
