"""Atomic outputs under concurrency: two processes writing the same path end with one complete output, never a mix.

Each writer fills its temporary output with files that all carry its own id, then both wait at a barrier placed just
before the commit, so the two renames race for real. Checked over many rounds, for directories and single files, with
and without --overwrite: exactly one writer's files are at the path (all of them, nothing of the other), no temporary
or moved-aside sibling is left behind, and a writer that lost got a UserError (never another exception).
"""

import multiprocessing as mp
import os
import socket
import stat
import subprocess
import sys

import pytest

from matgptq.errors import UserError
from matgptq.formats import read_checkpoint
from matgptq.fsutil import atomic_output, clear_stale_in
from tests.conftest import STORIES, TINYSTORIES

ROUNDS = 12
FILES = ("a.txt", "b.txt", "c.txt")


def _writer(out, ident, directory, overwrite, barrier, results):
    try:
        with atomic_output(out, overwrite=overwrite, directory=directory) as tmp:
            if directory:
                tmp.mkdir(exist_ok=True)
                for name in FILES:
                    (tmp / name).write_text(ident * 1000)
            else:
                tmp.write_text(ident * 3000)
            barrier.wait(timeout=30)
        results.put((ident, "ok"))
    except UserError as e:
        results.put((ident, f"UserError: {e}"))
    except BaseException as e:  # noqa: BLE001 — the property under test: nothing else may escape
        results.put((ident, f"{type(e).__name__}: {e}"))


def _race(out, directory, overwrite):
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(out, ident, directory, overwrite, barrier, results)) for ident in "XY"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return dict(results.get(timeout=5) for _ in procs)


@pytest.mark.parametrize("directory", [True, False], ids=["directory", "file"])
@pytest.mark.parametrize("overwrite", [False, True], ids=["no-overwrite", "overwrite"])
def test_two_writers_one_complete_output(tmp_path, directory, overwrite):
    for i in range(ROUNDS):
        out = tmp_path / f"round{i}" / "out"
        outcome = _race(out, directory, overwrite)
        assert all(v == "ok" or v.startswith("UserError: ") for v in outcome.values()), outcome
        assert any(v == "ok" for v in outcome.values()), outcome
        texts = [(out / name).read_text() for name in FILES] if directory else [out.read_text()]
        owner = texts[0][0]
        assert all(t == owner * len(t) for t in texts) and owner in outcome, "a mix of both writers"
        if not overwrite:  # the loser reports it; with --overwrite a file rename may legitimately win twice
            assert sorted(outcome.values()).count("ok") == 1, outcome
            assert outcome[owner] == "ok"
        assert sorted(p.name for p in out.parent.iterdir()) == ["out"], "temporary or moved-aside output left"


def test_two_cli_slices_to_one_out(tmp_path):
    """The same property through the real command: two `matgptq slice` runs started together on one --out."""
    import matgptq

    parent = tmp_path / "parent"
    matgptq.quantize(
        STORIES, parent, calib=TINYSTORIES, method="matgptq", bits=(3, 8), nsamples=2, seqlen=32, progress=False
    )
    out = tmp_path / "slice"
    cmd = [sys.executable, "-m", "matgptq", "slice", str(parent), "--bits", "3", "--out", str(out)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(120), p.stderr.read()) for p in procs]
    assert sorted(code for code, _ in results) == [0, 2], results  # a late one is refused: "already exists"
    for code, err in results:
        assert code == 0 or (err.startswith("matgptq: error: ") and err.count("\n") == 1), err
    ckpt = read_checkpoint(out)
    assert {q.bits for q in ckpt.layers.values()} == {3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parent", "slice"]


@pytest.fixture
def umask():
    """Set the process umask for one test; the old one is put back after."""
    old = os.umask(0o022)
    os.umask(old)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def _modes(root):
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


@pytest.mark.parametrize(
    "mask,dir_mode,file_mode",
    [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600), (0o002, 0o775, 0o664)],
    ids=["umask022", "umask077", "umask002"],
)
def test_outputs_get_the_usual_modes(tmp_path, umask, mask, dir_mode, file_mode):
    """Not mkdtemp's 0700, nor a writer's 0600 (safetensors creates its files so): what open() and mkdir() give under
    the umask, for a directory output (and what is in it) and a single-file output."""
    umask(mask)
    with atomic_output(tmp_path / "ckpt") as tmp:
        (tmp / "sub").mkdir(mode=0o700)
        for f in (tmp / "model.safetensors", tmp / "sub" / "x.json"):
            os.close(os.open(f, os.O_CREAT | os.O_WRONLY, 0o600))
        (tmp / "tokenizer.json").write_text("{}")
        (tmp / "tokenizer.json").chmod(0o444)  # copied with copy2 from a read-only source
    assert _modes(tmp_path / "ckpt") == {
        ".": dir_mode,
        "sub": dir_mode,
        "model.safetensors": file_mode,
        "sub/x.json": file_mode,
        "tokenizer.json": file_mode,
    }
    with atomic_output(tmp_path / "m.gguf", directory=False) as f:
        os.close(os.open(f, os.O_CREAT | os.O_WRONLY, 0o600))
    assert stat.S_IMODE((tmp_path / "m.gguf").stat().st_mode) == file_mode


def test_a_quantized_checkpoint_is_readable_by_others(tmp_path, umask):
    """Through the real command (safetensors writes 0600, the checkpoint directory is a mkdtemp): umask 027."""
    from matgptq.cli import main

    umask(0o027)
    out = tmp_path / "q"
    assert (
        main(
            [
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
            ]
        )
        == 0
    )
    modes = _modes(out)
    assert modes.pop(".") == 0o750 and "model.safetensors" in modes and set(modes.values()) == {0o640}, modes


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped), so no process on this host has it for now."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_what_a_killed_writer_left_is_cleared_by_the_next(tmp_path):
    """A writer SIGKILLed inside atomic_output leaves its temporary copy, and, killed between an --overwrite's two
    renames, the old output moved aside with the new one not yet in place. The next writer of the same path removes
    the first and puts the second back before deciding anything (so a plain write still refuses the existing output);
    a running writer's files (this process's) and other paths' are left alone."""
    host = socket.gethostname().replace("-", "_")
    dead = _dead_pid()
    out = tmp_path / "out"
    left = tmp_path / f".out.tmp-{dead}@{host}-abc123"
    (left / "sub").mkdir(parents=True)
    aside = tmp_path / f".out.old-{dead}@{host}-0011aa22"
    aside.mkdir()
    (aside / "model.safetensors").write_bytes(b"old")
    running = tmp_path / f".out.tmp-{os.getpid()}@{host}-def456"
    running.mkdir()
    other = [tmp_path / f".out2.tmp-{dead}@{host}-x1", tmp_path / f".out.tmp-{dead}@elsewhere-x2"]
    for p in other:
        p.mkdir()
    with pytest.raises(UserError, match="already exists"):
        with atomic_output(out):
            pass
    assert (out / "model.safetensors").read_bytes() == b"old"  # put back, and kept (no --overwrite)
    assert not left.exists() and not aside.exists() and running.exists() and all(p.exists() for p in other)
    with atomic_output(out, overwrite=True) as tmp:
        (tmp / "model.safetensors").write_bytes(b"new")
    assert (out / "model.safetensors").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", running.name, *(p.name for p in other)])


def test_a_resumed_run_clears_what_a_killed_one_left_in_its_folder(tmp_path):
    """clear_stale_in (what `search --resume` calls on its folder): every dead writer's temporary copy in the folder
    goes, whatever output it was for; a running writer's stays."""
    host = socket.gethostname().replace("-", "_")
    dead = _dead_pid()
    left = [tmp_path / f".mix-2.5.json.tmp-{dead}@{host}-a1", tmp_path / f"..tables.json.tmp-{dead}@{host}-b2"]
    running = tmp_path / f".mix-3.json.tmp-{os.getpid()}@{host}-c3"
    for p in (*left, running):
        p.mkdir()
    (tmp_path / "mix-2.5.json").write_text("{}")
    clear_stale_in(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["mix-2.5.json", running.name])
