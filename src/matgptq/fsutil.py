"""Files on disk: atomic outputs (written into a temporary sibling and renamed into place only when complete), a full
disk as one line naming the path and the space needed, and the tokenizer files every written checkpoint carries
along."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import glob
import os
import re
import shutil
import socket
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import UserError

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "generation_config.json",
)


NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # full disk, quota, file-size limit (RLIMIT_FSIZE)
# safetensors' writer (Rust) reports the OS error in its message only; numpy's `tofile` (gguf-py's writer) reports a
# short write as "N requested and M written", without the error number
_NO_SPACE_TEXT = re.compile(r"No space left on device|Disk quota exceeded|File too large|\d+ requested and \d+ written")


def out_of_space(e: BaseException) -> bool:
    """Whether `e` says the filesystem (or a quota, or a file-size limit) had no room for a write."""
    if isinstance(e, OSError) and e.errno in NO_SPACE:
        return True
    return isinstance(e, Exception) and _NO_SPACE_TEXT.search(str(e)) is not None


def _mb(n: int) -> str:
    return f"{n} bytes" if n < 10_000 else f"{n / 1e3:.0f} kB" if n < 10_000_000 else f"{n / 1e6:.0f} MB"


def _free(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def tree_bytes(path: Path) -> int:
    """Bytes of a file, or of every file under a directory (0 if it is not there)."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def no_space(
    path: Path, written: int, needed: int | None = None, then: str = "run the same command again"
) -> UserError:
    """The one line for a write of `path` that found no room after `written` bytes (`needed`: its whole size, when
    known)."""
    need = (
        f"it needs about {_mb(needed)}"
        if needed
        else f"it needs more than the {_mb(written)} written"
        if written
        else "it found no room at all"
    )
    return UserError(
        f"no space left on the device writing {path} ({need}, {_mb(_free(path))} free there); nothing "
        f"was left of it: free space there (or write elsewhere) and {then}"
    )


def check_space(path: Path, needed: int) -> None:
    """Refuse before writing `needed` bytes at `path` where its filesystem has less free space."""
    free = _free(path)
    if needed > free:
        raise UserError(
            f"writing {path} needs about {_mb(needed)} and its filesystem has {_mb(free)} free; free "
            "space there or choose another output path"
        )


def check_output(path: str | Path, overwrite: bool) -> Path:
    """Fail early (before any work) if `path` exists and may not be replaced."""
    p = Path(path)
    if p.exists() and not overwrite:
        raise UserError(f"{p} already exists; pass --overwrite to replace it or choose another output path")
    return p


@contextmanager
def atomic_output(
    path: str | Path, overwrite: bool = False, directory: bool = True, size: int | None = None
) -> Iterator[Path]:
    """Yield a temporary directory (or file path) to write; on success it replaces `path`, on error it is removed
    (the previous output, with `overwrite`, stays as it was). `size`: about how many bytes will be written, checked
    against the free space first; a write that finds no room is one UserError naming `path` (no_space)."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    clear_stale(final)
    check_output(final, overwrite)
    if size is not None:
        check_space(final, size)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-{_writer()}-", dir=final.parent))
    except OSError as e:
        raise no_space(final, 0, size) if out_of_space(e) else e from None
    try:
        target = tmp if directory else tmp / final.name
        yield target
        if target.exists():
            _usual_modes(target)
        _commit(target, final, overwrite)
    except Exception as e:
        if out_of_space(e):
            raise no_space(final, tree_bytes(tmp), size) from None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# Who writes: the temporary copy and the output moved aside are named `.NAME.tmp-PID@HOST-…` and `.NAME.old-PID@HOST-…`,
# so that the next writer of NAME can tell what a killed writer left (its process gone on this host) from what a
# running one is writing.
def _writer() -> str:
    return f"{os.getpid()}@{_host()}"


def _host() -> str:
    return socket.gethostname().replace("-", "_")


_LEFT = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)@(?P<host>[^-]+)-[^-]+")


def scratch_sibling(final: Path) -> Path:
    """A private path beside `final` for work files, named as atomic_output's temporary copies are (so the next writer
    of `final` clears it if this process is killed)."""
    return final.parent / f".{final.name}.tmp-{_writer()}-{uuid.uuid4().hex[:8]}"


def _running(pid: int) -> bool:
    """Whether process `pid` exists on this host (one of another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clear_stale(final: Path) -> None:
    """Clear what a writer of `final` killed on this host left beside it: its temporary copy is removed, and an output
    it had moved aside (killed between the two renames of an --overwrite) is put back where `final` is missing, so a
    kill loses nothing and leaves nothing behind for long. Another host's or a running process's files stay."""
    for p in final.parent.glob(f".{glob.escape(final.name)}.*-*@*-*"):
        m = _LEFT.fullmatch(p.name)
        if not m or m["name"] != final.name or m["host"] != _host() or _running(int(m["pid"])):
            continue
        if m["kind"] == "old" and not final.exists():
            with contextlib.suppress(FileNotFoundError):  # another process (a torchrun rank) may have done it
                os.rename(p, final)
        else:
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def clear_stale_in(directory: Path) -> None:
    """clear_stale for every output in `directory` beside which a writer left something (a resumed run that keeps
    what it finished writes those outputs no more)."""
    if directory.is_dir():
        for name in sorted({m["name"] for p in directory.iterdir() if (m := _LEFT.fullmatch(p.name))}):
            clear_stale(directory / name)


def replace_file(path: Path, write: Callable[[Path], object], then: str) -> None:
    """`write(tmp)` a temporary sibling of `path`, then rename it onto `path` (a reader sees the old file or the new
    one); a write that finds no room removes the temporary file and is one UserError (no_space, ending with `then`)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except Exception as e:
        if out_of_space(e):
            written = tree_bytes(tmp)
            tmp.unlink(missing_ok=True)
            raise no_space(path, written, then=then) from None
        raise


def _usual_modes(target: Path) -> None:
    """The modes open() and mkdir() give under the user's umask, not mkdtemp's 0700 (or a writer's 0600, as
    safetensors'), so that other users and serving processes can read the output as they read any other file."""
    umask = os.umask(0)  # the only way to read it: set it, and put it back at once
    os.umask(umask)
    if target.is_file():
        os.chmod(target, 0o666 & ~umask)
        return
    for root, _, files in os.walk(target):
        os.chmod(root, 0o777 & ~umask)
        for name in files:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), 0o666 & ~umask)


def _commit(target: Path, final: Path, overwrite: bool) -> None:
    """Move the finished `target` to `final` in one rename, so a reader sees all of it or none of it.

    Another process may write the same path at the same time. Without `overwrite` nothing that appeared meanwhile is
    replaced: a directory is renamed onto `final` (which fails if `final` is a non-empty directory or a file) and a file
    is hard-linked to it (which fails if anything is there). With `overwrite` the old and the new output are swapped in
    one step where the system can (Linux), else the old one is first moved aside (a kill between the two renames
    leaves it aside; clear_stale puts it back); if another writer's output lands in between, the rename fails. Either
    way one complete output stays, never a mix, and the loser gets a UserError.
    """
    lost = UserError(
        f"{final} was written by another process while this one was writing it; it was kept as it is "
        "(run again with --overwrite to replace it, or choose another output path)"
    )
    if not overwrite:
        try:
            if target.is_dir():
                os.rename(target, final)
            else:
                os.link(target, final)
        except OSError:
            raise lost from None
        return
    if _exchange(target, final):  # the old output now lies at `target`, inside the temporary directory
        return
    old = final.parent / f".{final.name}.old-{_writer()}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(final, old)
    except FileNotFoundError:
        old = None
    try:
        os.rename(target, final)
    except OSError:
        raise lost from None
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap `a` and `b` in one step (Linux's renameat2 with RENAME_EXCHANGE), so that a reader of `b` sees the old or
    the new at every instant; False where that is not possible (no such call or flag, `b` missing, a filesystem
    without it), and the caller moves `b` aside first instead."""
    renameat2 = getattr(_libc(), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2  # <fcntl.h>, <linux/fs.h>
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOENT, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(code, os.strerror(code), str(b))


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def copy_tokenizer_files(src: str | Path, dst: str | Path) -> None:
    """Copy the tokenizer (and generation config) files of model directory `src` that exist into `dst`."""
    for name in TOKENIZER_FILES:
        f = Path(src) / name
        if f.is_file():
            shutil.copy2(f, Path(dst) / name)
