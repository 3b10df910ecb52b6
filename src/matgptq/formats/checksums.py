"""Every tensor's checksum (format v4, docs/formats.md §1.10): a flipped byte is refused, naming the tensor.

    checksum(t) = CRC-32 of the ASCII text `DTYPE[d0,d1,...]` followed by t's bytes as stored, as 8 hex digits

CRC-32 is zlib's (the polynomial of zip, PNG and gzip); DTYPE is safetensors' name (`F16`, `U8`, ...) and the bytes
are those of the file's data section (C order, little-endian). The text binds the header's dtype and shape to the
data: a header edit that reinterprets a tensor's bytes (F16 read as BF16, a shape transposed) changes the checksum as
a flipped byte does. CRC-32 detects every error of up to 32 consecutive bits and all but 2^-32 of the others; it
guards against damage (disks, copies, downloads), not against a deliberate forgery.

`matgptq.json` holds `{"checksums": {"algorithm": "crc32", "tensors": {name: "1a2b3c4d", ...}}}` for every tensor of
the checkpoint's safetensors files.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

import torch

from ..errors import UserError
from .streamed import DTYPES

KEY = "checksums"
ALGORITHM = "crc32"
_HEX = re.compile(r"^[0-9a-f]{8}$")
_TRUSTED = ContextVar("matgptq_trusted", default=False)


@contextmanager
def trusted(skip: bool = True) -> Iterator[None]:
    """Within it, readers skip the checksums (`--no-verify`, `verify=False`: a file the user trusts, read once less)."""
    token = _TRUSTED.set(skip)
    try:
        yield
    finally:
        _TRUSTED.reset(token)


def wanted() -> bool:
    """Whether a reader verifies the checksums here (not inside `trusted()`)."""
    return not _TRUSTED.get()


def running(dtype: str, shape: Iterable[int]) -> int:
    """The CRC-32 of a tensor's descriptor, where its bytes' CRC continues (`zlib.crc32(data, running(...))`)."""
    return zlib.crc32(f"{dtype}[{','.join(str(int(d)) for d in shape)}]".encode("ascii"))


def tensor_checksum(t: torch.Tensor) -> str:
    """A tensor of a dtype no writer of ours stores (a damaged header may name one) gets torch's name for it, so its
    checksum differs from any recorded one instead of failing."""
    data = t.contiguous().reshape(-1).view(torch.uint8).numpy()
    return f"{zlib.crc32(data, running(DTYPES.get(t.dtype, str(t.dtype)), t.shape)):08x}"


def table(tensors: dict[str, torch.Tensor]) -> dict:
    """The `checksums` record of a checkpoint holding exactly `tensors`."""
    return record({k: tensor_checksum(t) for k, t in tensors.items()})


def record(sums: dict[str, str]) -> dict:
    """The `checksums` record of {tensor: checksum}."""
    return {"algorithm": ALGORITHM, "tensors": dict(sorted(sums.items()))}


def recorded(where: Path, meta: dict) -> dict[str, str]:
    """{tensor: checksum} of a v4 record, checked for shape (a damaged record is one UserError)."""
    record = meta.get(KEY)
    sums = record.get("tensors") if isinstance(record, dict) else None
    ok = (
        isinstance(record, dict)
        and record.get("algorithm") == ALGORITHM
        and isinstance(sums, dict)
        and sums
        and all(isinstance(v, str) and _HEX.match(v) for v in sums.values())
    )
    if not ok:
        raise UserError(
            f"{where}: `{KEY}` must give every tensor's {ALGORITHM} as 8 hex digits; the checkpoint is "
            "damaged, re-create or re-download it"
        )
    return sums


def verify(where: Path, tensors: dict[str, torch.Tensor], sums: dict[str, str]) -> None:
    """Every tensor read is recorded, with the checksum recorded for it; else one UserError naming the tensor."""
    for name, t in tensors.items():
        if name not in sums:
            raise UserError(
                f"{where}: tensor {name} is not in the checkpoint's checksums; the file is damaged or "
                "was altered, re-create or re-download it"
            )
        if tensor_checksum(t) != sums[name]:
            raise UserError(
                f"{where}: tensor {name} does not match its checksum (the file is damaged); re-create or re-download it"
            )


def complete(where: Path, names: Iterable[str], sums: dict[str, str]) -> None:
    """The files hold exactly the tensors recorded: one missing from them is damage too."""
    missing = sorted(set(sums) - set(names))
    if missing:
        raise UserError(
            f"{where}: tensor {missing[0]} is recorded in the checksums but not in the files; the "
            "checkpoint is incomplete, re-create or re-download it"
        )
