"""Files on disk: atomic outputs (written into a temporary sibling and renamed into place only when complete), and the
tokenizer files every written checkpoint carries along."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import UserError

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
    "merges.txt", "added_tokens.json", "chat_template.jinja", "generation_config.json",
)  # fmt: skip


def check_output(path: str | Path, overwrite: bool) -> Path:
    """Fail early (before any work) if `path` exists and may not be replaced."""
    p = Path(path)
    if p.exists() and not overwrite:
        raise UserError(f"{p} already exists; pass --overwrite to replace it or choose another output path")
    return p


@contextmanager
def atomic_output(path: str | Path, overwrite: bool = False, directory: bool = True) -> Iterator[Path]:
    """Yield a temporary directory (or file path) to write; on success it replaces `path`, on error it is removed."""
    final = check_output(path, overwrite)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        target = tmp if directory else tmp / final.name
        yield target
        if target.exists():
            _usual_modes(target)
        _commit(target, final, overwrite)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
    is hard-linked to it (which fails if anything is there). With `overwrite` the old output is first moved aside; if
    another writer's output lands in between, the rename fails. Either way one complete output stays, never a mix,
    and the loser gets a UserError.
    """
    lost = UserError(f"{final} was written by another process while this one was writing it; it was kept as it is "
                     "(run again with --overwrite to replace it, or choose another output path)")  # fmt: skip
    if not overwrite:
        try:
            if target.is_dir():
                os.rename(target, final)
            else:
                os.link(target, final)
        except OSError:
            raise lost from None
        return
    old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
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


def copy_tokenizer_files(src: str | Path, dst: str | Path) -> None:
    """Copy the tokenizer (and generation config) files of model directory `src` that exist into `dst`."""
    for name in TOKENIZER_FILES:
        f = Path(src) / name
        if f.is_file():
            shutil.copy2(f, Path(dst) / name)
