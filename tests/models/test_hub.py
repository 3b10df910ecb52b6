"""Hugging Face ids (`org/name[@revision]`) wherever a model is taken, resolved through a Hugging Face cache built here
(no network on this machine: HF_HUB_OFFLINE, and every socket connection refused in-process), against the same model
given as a local directory: the same tokens, the same weights, the same scores."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import matgptq
from matgptq.errors import UserError
from matgptq.models import resolve_model
from tests.conftest import STORIES, TINYSTORIES

COMMIT = "6aaced2a" + "0" * 32  # any 40-hex string names a snapshot
REPO = "probe/stories260K"


def add_to_cache(root: Path, repo_id: str, source: Path) -> Path:
    """`source`'s files as the Hugging Face id `repo_id` in the cache layout models--org--name/{refs/main,
    snapshots/<commit>/files} (files as symlinks); returns the snapshot directory."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for f in source.iterdir():
        (snap / f.name).symlink_to(f)
    return snap


def make_cache(root: Path) -> Path:
    """A cache holding stories260K as REPO."""
    add_to_cache(root, REPO, STORIES)
    return root


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """This test's cache, offline, and no socket may connect (what HF_HUB_CACHE/HF_HUB_OFFLINE=1 give a process)."""
    import huggingface_hub.constants as constants

    cache = make_cache(tmp_path / "hub")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    def refuse(*args, **kwargs):
        raise AssertionError(f"network connection attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    return cache


def test_a_local_directory_stays_a_directory(hub_cache):
    src = resolve_model(STORIES)
    assert src.path == STORIES and src.repo_id is None and src.spec == str(STORIES.resolve())


@pytest.mark.parametrize("spec", [REPO, f"{REPO}@main", f"{REPO}@{COMMIT}"])
def test_an_id_resolves_to_its_cached_snapshot(hub_cache, spec):
    src = resolve_model(spec)
    assert src.path == hub_cache / "models--probe--stories260K" / "snapshots" / COMMIT
    assert (src.repo_id, src.revision, src.spec) == (REPO, COMMIT, f"{REPO}@{COMMIT}")
    assert (src.path / "config.json").is_file()


@pytest.mark.parametrize("spec", ["probe/not-cached", "probe/stories260K@v9"])
def test_an_id_not_in_the_cache_is_one_line_with_the_way_out(hub_cache, spec):
    with pytest.raises(UserError) as e:
        resolve_model(spec)
    msg = str(e.value)
    assert "\n" not in msg and spec in msg and "not in the cache" in msg and "hf download" in msg, msg


def test_quantize_eval_and_the_search_reference_take_an_id(hub_cache, tmp_path):
    """quantize records `org/name@commit`; load and the search's reference resolve it; the quantized weights and the
    float model equal those made from the local directory."""
    from matgptq.allocation.inputs import reference_model as _reference
    from matgptq.formats import read_checkpoint

    kw = dict(method="rtn", bits=4, progress=False)
    by_id, _ = matgptq.quantize(REPO, tmp_path / "by-id", **kw)
    by_dir, _ = matgptq.quantize(STORIES, tmp_path / "by-dir", **kw)
    meta = json.loads((by_id / "matgptq.json").read_text())
    assert meta["source_model"] == f"{REPO}@{COMMIT}"
    a, b = read_checkpoint(by_id), read_checkpoint(by_dir)
    assert a.tensors.keys() == b.tensors.keys() and all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
    assert _reference(a, None) == hub_cache / "models--probe--stories260K" / "snapshots" / COMMIT
    fp_id, fp_dir = matgptq.load(REPO), matgptq.load(STORIES)
    x = torch.arange(1, 33).unsqueeze(0)
    assert torch.equal(fp_id(x).logits, fp_dir(x).logits)


def test_the_cli_takes_an_id_from_the_environment(tmp_path):
    """The user's path: HF_HUB_CACHE and HF_HUB_OFFLINE=1 in the environment of a fresh process; `eval` of the model
    by id and by directory print the same perplexity, and an id that is not cached is one line, exit 2."""
    cache = make_cache(tmp_path / "hub")
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    run = lambda model: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "matgptq", "eval", model, "--text", str(TINYSTORIES), "--max-tokens", "2048"],
        capture_output=True,
        text=True,
        env=env,
    )
    by_id, by_dir = run(REPO), run(str(STORIES))
    assert by_id.returncode == 0 and by_dir.returncode == 0, by_id.stderr + by_dir.stderr
    ppl = lambda out: out.strip().splitlines()[-1].split("|")[-2].strip()  # noqa: E731
    assert ppl(by_id.stdout) == ppl(by_dir.stdout)
    missing = run("probe/not-cached")
    assert missing.returncode == 2 and missing.stderr.strip().count("\n") == 0, missing.stderr
    assert missing.stderr.startswith("matgptq: error: probe/not-cached is not a local directory"), missing.stderr


# --- Hub failures: one line naming the fix, exit 2, nothing written (#99 item 5) ------------------------------------


def _http_error(status: int, code: str, url: str) -> Exception:
    """The exception huggingface_hub raises for this Hub response (its own hf_raise_for_status builds it)."""
    import httpx2  # huggingface_hub's HTTP client
    from huggingface_hub.utils import hf_raise_for_status

    response = httpx2.Response(status, headers={"X-Error-Code": code}, request=httpx2.Request("GET", url))
    try:
        hf_raise_for_status(response)
    except Exception as e:  # noqa: BLE001 — whatever type it builds is the one under test
        return e
    raise AssertionError(f"hf_raise_for_status accepted {status} {code}")


def _broken_download() -> Exception:
    import httpx2

    # what huggingface_hub's http_get re-raises once its retries of a stream that broke off are spent
    return httpx2.RemoteProtocolError(
        "peer closed connection without sending complete message body (incomplete chunked read)"
    )


API = "https://huggingface.co/api/models"
HUB_FAILURES = {  # id -> (spec, the exception snapshot_download raises (None: the offline cache's own), phrases)
    "not-in-the-offline-cache": ("probe/not-cached", None, ["not in the cache", "hf download"]),
    "revision-does-not-exist": (
        f"{REPO}@v9",
        lambda: _http_error(404, "RevisionNotFound", f"{API}/{REPO}/revision/v9"),
        ["has no revision 'v9'", "give a branch, tag or commit it has"],
    ),
    "gated-without-a-token": (
        "probe/gated",
        lambda: _http_error(403, "GatedRepo", f"{API}/probe/gated/revision/main"),
        ["is gated", "accept its terms at https://huggingface.co/probe/gated", "hf auth login"],
    ),
    "download-interrupted": ("probe/big", _broken_download, ["broke off", "run the command again, which resumes it"]),
    "download-wrong-size": (
        "probe/big",
        lambda: OSError(
            "Consistency check failed: file should be of size 1000 but has size 10 (model.safetensors).\nThis is usually "
            "due to network issues while downloading the file. Please retry with `force_download=True`."
        ),
        ["arrived with the wrong size", "hf download probe/big --force-download"],
    ),
    "hub-unreachable": ("probe/remote", lambda: _connect_error(), ["Hub cannot be reached", "check the network"]),
}


def _connect_error() -> Exception:
    import httpx2

    return httpx2.ConnectError("[Errno 111] Connection refused")


def _fail_with(monkeypatch, make) -> None:
    import huggingface_hub

    def snapshot_download(*args, **kwargs):
        raise make()

    if make is not None:
        monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)


@pytest.mark.parametrize("case", HUB_FAILURES)
def test_a_hub_failure_is_one_line_naming_the_fix(hub_cache, monkeypatch, case):
    spec, make, phrases = HUB_FAILURES[case]
    _fail_with(monkeypatch, make)
    with pytest.raises(UserError) as e:
        resolve_model(spec)
    msg = str(e.value)
    assert "\n" not in msg and all(p in msg for p in phrases), msg


@pytest.mark.parametrize("case", HUB_FAILURES)
def test_a_hub_failure_exits_2_and_writes_nothing(hub_cache, monkeypatch, tmp_path, capsys, record_property, case):
    """`quantize ID --out OUT --resume`: exit 2, one line on stderr, and neither OUT nor its resume state exists."""
    from matgptq.cli import main

    spec, make, phrases = HUB_FAILURES[case]
    _fail_with(monkeypatch, make)
    work = tmp_path / "work"
    work.mkdir()
    code = main(["quantize", spec, "--out", str(work / "out"), "--method", "rtn", "--bits", "4", "--resume"])
    err = capsys.readouterr().err
    record_property("message", err.strip())
    assert code == 2 and err.startswith("matgptq: error: ") and err.count("\n") == 1, err
    assert all(p in err for p in phrases), err
    assert list(work.iterdir()) == [], "something was written"
