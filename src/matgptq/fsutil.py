"""Files on disk: atomic outputs (written into a temporary sibling and renamed into place only when complete), and the
tokenizer files every written checkpoint carries along."""

from __future__ import annotations

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
        old = None
        if final.exists():
            old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
            final.rename(old)
        target.rename(final)
        if old is not None:
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def copy_tokenizer_files(src: str | Path, dst: str | Path) -> None:
    """Copy the tokenizer (and generation config) files of model directory `src` that exist into `dst`."""
    for name in TOKENIZER_FILES:
        f = Path(src) / name
        if f.is_file():
            shutil.copy2(f, Path(dst) / name)
