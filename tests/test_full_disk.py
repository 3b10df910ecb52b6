"""A full disk: every writer (parent and its resume state, slice, GPTQ, compressed-tensors, GGUF, mix, eval JSON) on a
filesystem that fills up mid-write gives one line naming the path and the space needed, exit 2, no partial output
(and, with --overwrite, the previous output intact); `--resume` completes once space is freed.

The filesystem is a small tmpfs this test mounts (as root); where mounting is not allowed (or with
MATGPTQ_TEST_NO_MOUNT=1), a file-size limit (RLIMIT_FSIZE, which makes a write past it fail with EFBIG) on a child
process stands in for it."""

from __future__ import annotations

import contextlib
import io
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from matgptq.cli import main
from tests.conftest import STORIES, TINYSTORIES

PAGE = 4096  # tmpfs counts whole pages


class SmallDisk:
    """A directory whose filesystem holds `limit` bytes (tmpfs), or whose writers may not write a file past `limit`
    bytes (RLIMIT_FSIZE in a child process)."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "disk"
        self.dir.mkdir()
        self.tmpfs = (
            not os.environ.get("MATGPTQ_TEST_NO_MOUNT")
            and subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={PAGE}", "tmpfs", str(self.dir)], capture_output=True
            ).returncode
            == 0
        )
        self.limit: int | None = None

    def set_limit(self, n: int | None) -> None:
        """At most `n` bytes from now on (None: room enough); what is there stays."""
        self.limit = n
        if self.tmpfs:
            size = "1g" if n is None else str(max(PAGE, -(-n // PAGE) * PAGE))
            subprocess.run(["mount", "-o", f"remount,size={size}", str(self.dir)], check=True)

    def run(self, args: list[str]) -> tuple[int, str]:
        """`matgptq ARGS` under the limit: (exit status, stderr)."""
        if self.tmpfs or self.limit is None:
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                return main(args), err.getvalue()
        limit = self.limit

        def fsize_limit() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        p = subprocess.run(
            [sys.executable, "-m", "matgptq", *args],
            capture_output=True,
            text=True,
            timeout=600,
            preexec_fn=fsize_limit,
        )
        return p.returncode, p.stderr

    def close(self) -> None:
        if self.tmpfs:  # lazily: a failed test's traceback may still hold a file open there
            subprocess.run(["umount", "--lazy", str(self.dir)], check=True)


@pytest.fixture
def disk(tmp_path):
    d = SmallDisk(tmp_path)
    yield d
    d.close()


def tensors(directory: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(directory.glob("*.safetensors"))}


def full_disk_refusal(disk: SmallDisk, args: list[str], out: Path) -> str:
    """Run `args` under the limit: exit 2, one line naming the space, nothing at `out`, no temporary sibling."""
    rc, err = disk.run(args)
    lines = [x for x in re.split(r"[\r\n]", err) if "matgptq: error" in x]  # the progress bars aside
    assert rc == 2 and len(lines) == 1, err
    assert "matgptq: error:" in lines[0] and ("no space left" in lines[0] or "needs about" in lines[0]), err
    assert str(out) in lines[0] or out.name in lines[0] or ".resume" in lines[0], err
    assert not out.exists()
    assert not [p for p in out.parent.glob(f".{out.name}.tmp*")], "a temporary output was left"
    return lines[0]


QUANTIZE = [
    "quantize",
    str(STORIES),
    "--method",
    "gptq",
    "--bits",
    "4",
    "--calib",
    str(TINYSTORIES),
    "--calib-range",
    "0.6:0.7",
    "--nsamples",
    "8",
    "--seqlen",
    "64",
    "--quiet",
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run, on a disk with room: what every resumed run must equal byte for byte."""
    out = tmp_path_factory.mktemp("ref") / "q"
    assert main([*QUANTIZE, "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("where", ["in-the-resume-state", "in-the-checkpoint"])
def test_quantize_stops_in_one_line_and_resumes_to_the_same_bytes(disk, reference, where):
    """Room for a tenth of the checkpoint (the resume state's first files fill it), or for the resume state but not
    the assembled checkpoint beside it (a tmpfs of one and a half checkpoints; a file-size limit of nine tenths of
    it, which each block's file keeps under); then room enough and --resume."""
    size = sum(len(b) for b in tensors(reference).values())
    out = disk.dir / "q"
    disk.set_limit(int(size * (0.1 if where == "in-the-resume-state" else 1.5 if disk.tmpfs else 0.9)))
    full_disk_refusal(disk, [*QUANTIZE, "--out", str(out)], out)
    disk.set_limit(None)
    assert disk.run([*QUANTIZE, "--out", str(out), "--resume"])[0] == 0
    assert tensors(out) == tensors(reference)


@pytest.mark.parametrize("kind", ["slice", "gptq_v2", "compressed-tensors", "gguf"])
def test_writers_leave_nothing_and_keep_the_previous_output(disk, reference, kind):
    """Each writer into half the room its output takes: refused, nothing left; with room for one output but not
    two (an --overwrite writes the new one beside the old), the old output stays whole."""
    out = disk.dir / ("out.gguf" if kind == "gguf" else "out")
    args = (
        ["slice", str(reference), "--bits", "4"]
        if kind == "slice"
        # a GPTQ checkpoint slices at its width
        else ["export", str(reference), "--format", kind]
    )
    args = [*args, "--out", str(out)]
    disk.set_limit(None)
    assert disk.run(args)[0] == 0
    size = sum(f.stat().st_size for f in ([out] if out.is_file() else out.rglob("*")) if f.is_file())
    before = out.read_bytes() if out.is_file() else tensors(out)
    disk.set_limit(size // 2 if not disk.tmpfs else int(size * 1.5))
    rc, err = disk.run([*args, "--overwrite"])
    assert rc == 2 and len([x for x in re.split(r"[\r\n]", err) if "matgptq: error" in x]) == 1 and str(out) in err, err
    assert (out.read_bytes() if out.is_file() else tensors(out)) == before
    assert not [p for p in out.parent.glob(f".{out.name}.*")], "a temporary output was left"
    fresh = disk.dir / ("fresh.gguf" if kind == "gguf" else "fresh")
    full_disk_refusal(disk, [*args[:-1], str(fresh)], fresh)


@pytest.fixture(scope="module")
def parent(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("parent") / "p"
    args = [a if a != "gptq" else "matgptq" for a in QUANTIZE]
    assert main([*args[: args.index("--bits") + 1], "2,4", *args[args.index("--bits") + 2 :], "--out", str(out)]) == 0
    return out


def test_eval_json_and_search_mixes(disk, parent):
    """The small writers: eval's JSON report, and the search's files (its tables, then its mixes), into a full
    disk (a tmpfs already full; else a limit of 64 bytes per file)."""
    disk.set_limit(None)
    (disk.dir / "filler").write_bytes(b"\0" * (PAGE if disk.tmpfs else 0))
    disk.set_limit(PAGE if disk.tmpfs else 64)
    report = disk.dir / "eval.json"
    full_disk_refusal(
        disk,
        [
            "eval",
            str(parent),
            "--bits",
            "4",
            "--text",
            str(TINYSTORIES),
            "--text-range",
            "0:0.01",
            "--seqlen",
            "64",
            "--json",
            str(report),
        ],
        report,
    )
    mixes = disk.dir / "mixes"
    rc, err = disk.run(
        [
            "search",
            str(parent),
            "--budget",
            "3.0",
            "--out",
            str(mixes),
            "--calib",
            str(TINYSTORIES),
            "--calib-range",
            "0.6:0.7",
            "--levels",
            "2,4",
            "--generations",
            "0",
            "--seqlen",
            "64",
            "--sensitivity-tokens",
            "126",
            "--quiet",
        ]
    )
    assert rc == 2 and len([x for x in re.split(r"[\r\n]", err) if "matgptq: error" in x]) == 1, err
    assert "no space left" in err or "needs about" in err, err
    assert not list(mixes.glob("mix-*.json")) if mixes.exists() else True
