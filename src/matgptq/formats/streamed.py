"""One safetensors file written a group of tensors at a time: assembling a shard holds one block, not the shard.

safetensors' writer (`safetensors.torch.save_file`) takes every tensor of a file at once, so a checkpoint assembled
from its block files held a whole shard (up to 512 MB by default) on top of the quantization's own memory. The
format is small enough to write in pieces (safetensors' README, "Format"):

    8 bytes      N, the header's length, unsigned little-endian
    N bytes      JSON {"__metadata__": {str: str}, name: {"dtype": "F16", "shape": [...], "data_offsets": [b, e]}, ...},
                 padded with spaces to a multiple of 8
    the data     each tensor's bytes, C order, little-endian, at [b, e) of the data; the ranges tile it exactly

Every dtype and shape is known before any tensor is read (the block files' headers), so the header is written first
and each group's tensors are then read, written at their offsets and dropped. The byte ranges are laid out as
safetensors' own writer lays them (WRITE_ORDER), so every tensor starts on a multiple of
its element size (zero-copy readers need that) and the data are byte for byte those of `save_file` on the same
tensors. tests/formats/test_streamed.py reads the files with safetensors and compares them with its writer's.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
ELEMENT_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
# safetensors' own writer orders the data by its Dtype enum, last declared first, then by name (element sizes never
# grow along this order, so every tensor is aligned): the same order makes the same bytes
WRITE_ORDER = ("U64", "I64", "F64", "F32", "U32", "I32", "BF16", "F16", "U16", "I16", "I8", "U8", "BOOL")


class Entry(NamedTuple):
    name: str
    dtype: str  # safetensors' name of the dtype (DTYPES)
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = ELEMENT_BYTES[self.dtype]
        for d in self.shape:
            n *= d
        return n


class Group(NamedTuple):
    """Tensors of one file known by their entries, and how to read them when they are written."""

    entries: list[Entry]
    load: Callable[[], dict[str, torch.Tensor]]


def entries_of(tensors: dict[str, torch.Tensor]) -> list[Entry]:
    return [Entry(k, DTYPES[t.dtype], tuple(t.shape)) for k, t in tensors.items()]


def _header(entries: list[Entry], metadata: dict[str, str]) -> tuple[bytes, dict[str, int]]:
    """The padded header and each tensor's offset in the data (WRITE_ORDER, then name)."""
    offsets, at, body = {}, 0, {"__metadata__": metadata}
    for e in sorted(entries, key=lambda e: (WRITE_ORDER.index(e.dtype), e.name)):
        offsets[e.name] = at
        body[e.name] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [at, at + e.nbytes]}
        at += e.nbytes
    text = json.dumps(body, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, offsets


def write_streamed(path: str | Path, groups: list[Group], metadata: dict[str, str]) -> int:
    """Write the safetensors file `path` holding every group's tensors, one group in memory at a time; the number of
    data bytes. A group whose tensors are not its entries (name, dtype, shape) is a bug: RuntimeError."""
    if sys.byteorder != "little":
        raise RuntimeError("safetensors stores little-endian data; this writer copies native bytes")
    entries = [e for g in groups for e in g.entries]
    if len({e.name for e in entries}) != len(entries):
        raise RuntimeError("a tensor name occurs in two groups of one file")
    head, offsets = _header(entries, metadata)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + sum(e.nbytes for e in entries))
        for group in groups:
            tensors = group.load()
            if {e.name: e for e in entries_of(tensors)} != {e.name: e for e in group.entries}:
                raise RuntimeError(f"the tensors read for {path} are not those its header announced")
            for e in group.entries:
                f.seek(len(head) + offsets[e.name])
                f.write(tensors[e.name].contiguous().reshape(-1).view(torch.uint8).numpy().data)
            del tensors
    return sum(e.nbytes for e in entries)
