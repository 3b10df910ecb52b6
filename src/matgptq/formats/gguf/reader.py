"""Reading a GGUF file that may be damaged or hostile: every count, length, type, shape and offset it declares is
checked against the file before it is used, so damage is one `UserError` naming the file — never a parser's
exception, a loop over a declared count, or an allocation larger than the file.

The layout (ggml's gguf.h, as gguf-py's GGUFReader reads it; all integers little-endian):

    "GGUF" | version u32 (2 or 3) | n_tensors u64 | n_kv u64
    n_kv × (key string | value type u32 | value)      string = length u64 + UTF-8 bytes;
                                                      array = item type u32 + count u64 + items (not arrays)
    n_tensors × (name string | n_dims u32 | ne u64 × n_dims | ggml type u32 | offset u64)
    padding to `general.alignment` (a power of two, default 32), then the data section

Tensor i's bytes are ne[0]·…·ne[n−1] / block × block bytes of its type (gguf-py's GGML_QUANT_SIZES), at its offset
in the data section. As llama.cpp's loader (ggml's gguf.cpp) does, each offset must be where the previous tensor ended,
rounded up to the alignment, so a shape or type changed by damage moves the next offset and is refused; and the data
must end where the file does (after the last tensor, with or without its padding), which catches the last tensor's;
the padding is zeros, as every writer pads, so a tensor shrunk by less than the alignment is caught too.
The tensors' bytes are returned as stored (a read-only view of the file), not dequantized.
"""

from __future__ import annotations

import mmap
import re
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ...errors import UserError
from .types import gguf_module

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 63  # GGML_MAX_NAME − 1: the longest tensor name ggml holds
DEFAULT_ALIGNMENT = 32
# value type -> (struct format, size) of the scalar types; 7 is BOOL (one byte, 0 or 1), 8 STRING, 9 ARRAY
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY, BOOL = 8, 9, 7
FIX = "the GGUF file is damaged or incomplete; re-create or re-download it"


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    type: str  # ggml type name: "F32", "Q8_0", ...
    shape: tuple[int, ...]  # ggml's order: ne[0] (a row's length) first
    offset: int  # where its bytes start in the file
    data: np.ndarray  # uint8, the stored bytes (read-only)


@dataclass
class GGUFFile:
    path: Path
    version: int
    fields: dict[str, object]  # key -> int | float | bool | str, or a list / numpy array of them
    tensors: dict[str, GGUFTensor]  # in file order


class _Cursor:
    """Reads forward through the file's bytes; anything past the end is damage."""

    def __init__(self, path: Path, buf) -> None:
        self.path, self.buf, self.at = path, buf, 0

    def fail(self, what: str) -> UserError:
        return UserError(f"{self.path}: {what} (at byte {self.at}); {FIX}")

    def take(self, n: int, what: str):
        if n < 0 or n > len(self.buf) - self.at:
            raise self.fail(f"{what} needs {n} bytes, but the file ends {len(self.buf) - self.at} bytes later")
        view = self.buf[self.at : self.at + n]
        self.at += n
        return view

    def scalar(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.scalar("<Q", f"the length of {what}")
        try:
            return bytes(self.take(n, what)).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None


def _value(c: _Cursor, vtype: int, key: str, in_array: bool = False):
    if vtype in SCALARS:
        v = c.scalar(SCALARS[vtype], f"the value of {key}")
        if vtype == BOOL and v not in (0, 1):
            raise c.fail(f"{key} holds the boolean byte {v}, neither 0 nor 1")
        return bool(v) if vtype == BOOL else v
    if vtype == STRING:
        return c.string(f"the value of {key}")
    if vtype != ARRAY or in_array:
        raise c.fail(f"{key} has value type {vtype}, which GGUF does not define{' in an array' if in_array else ''}")
    itype, count = c.scalar("<I", f"the item type of {key}"), c.scalar("<Q", f"the length of {key}")
    if itype in SCALARS and itype != BOOL:  # numbers in one read, bounded by the file
        fmt = SCALARS[itype]
        size = struct.calcsize(fmt)
        if count > (len(c.buf) - c.at) // size:
            raise c.fail(f"{key} declares {count} items, more than the rest of the file holds")
        return np.frombuffer(c.take(count * size, key), dtype=np.dtype(fmt)).copy()
    if count > len(c.buf) - c.at:  # every other item takes at least one byte: the loop is bounded by the file
        raise c.fail(f"{key} declares {count} items, more than the rest of the file holds")
    return [_value(c, itype, key, in_array=True) for _ in range(count)]


def _fields(c: _Cursor, n_kv: int) -> dict[str, object]:
    fields: dict[str, object] = {}
    for _ in range(n_kv):
        key = c.string("a metadata key")
        if key in fields:
            raise c.fail(f"metadata key {key!r:.80} occurs twice")
        shown = key if len(key) <= 80 else key[:80] + "…"  # a damaged key may be as long as the file
        fields[key] = _value(c, c.scalar("<I", f"the value type of {shown}"), shown)
    return fields


def _alignment(c: _Cursor, fields: dict) -> int:
    align = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align & (align - 1):
        raise c.fail(f"general.alignment is {align!r:.40}, not a power of two")
    return align


def _tensor_infos(c: _Cursor, n_tensors: int) -> list[tuple[str, str, tuple[int, ...], int, int]]:
    """(name, type, shape, offset, bytes) of every tensor, each checked on its own."""
    sizes, out, seen = gguf_module().GGML_QUANT_SIZES, [], set()
    types = {int(t): t for t in sizes}
    for _ in range(n_tensors):
        name = c.string("a tensor name")
        n_dims = c.scalar("<I", f"the rank of {name:.80}")
        if name in seen or not name or len(name.encode()) > MAX_NAME:
            raise c.fail(f"tensor name {name!r:.80} is empty, repeated or longer than ggml's {MAX_NAME} bytes")
        if not 1 <= n_dims <= MAX_DIMS:
            raise c.fail(f"tensor {name} has {n_dims} dimensions; ggml holds 1 to {MAX_DIMS}")
        shape = tuple(c.scalar("<Q", f"the shape of {name}") for _ in range(n_dims))
        ggml, offset = c.scalar("<I", f"the type of {name}"), c.scalar("<Q", f"the offset of {name}")
        if ggml not in types:
            raise c.fail(f"tensor {name} has ggml type {ggml}, which gguf-py does not know")
        block, nbytes = sizes[types[ggml]]
        if min(shape) < 1 or shape[0] % block:
            raise c.fail(f"tensor {name} has shape {list(shape)}, not whole {types[ggml].name} blocks of {block}")
        count = int(np.prod(shape, dtype=object))
        seen.add(name)
        out.append((name, types[ggml].name, shape, offset, count // block * nbytes))
    return out


@lru_cache(maxsize=None)
def _names(arch: str) -> re.Pattern | None:
    """The tensor names gguf-py's tables give architecture `arch` (blocks as a captured number); None: unknown."""
    gguf = gguf_module()
    known = next((a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch), None)
    if known is None:
        return None
    bases = [re.escape(gguf.TENSOR_NAMES[t]).replace(r"\{bid\}", r"(\d+)") for t in gguf.MODEL_TENSORS[known]]
    return re.compile("|".join(f"(?:{b})" for b in bases))


def _check_names(c: _Cursor, fields: dict, names: list[str]) -> None:
    """Every tensor is one the file's architecture defines (`<name>.weight` or `.bias`, gguf-py's MODEL_TENSORS),
    in a block below its block_count: a damaged byte of a name would otherwise read as another tensor."""
    arch = fields.get("general.architecture")
    pattern = _names(arch) if isinstance(arch, str) else None
    blocks = fields.get(f"{arch}.block_count")
    if pattern is None or not isinstance(blocks, int) or isinstance(blocks, bool):
        raise c.fail(f"general.architecture {arch!r:.40} is not one gguf-py knows, or it has no block_count")
    for name in names:
        base, _, suffix = name.rpartition(".")
        m = pattern.fullmatch(base)
        block = next((int(b) for b in (m.groups() if m else ()) if b is not None), 0)
        if m is None or suffix not in ("weight", "bias") or block >= blocks:
            raise c.fail(f"tensor {name!r:.80} is not one a {arch} model with {blocks} blocks has")


def _padding(c: _Cursor, lo: int, hi: int, after: str) -> None:
    """The alignment padding [lo, hi) (as much of it as the file holds) is zeros, as every GGUF writer pads: a
    tensor shrunk by damage by less than the alignment leaves its last bytes there, and is refused."""
    if any(bytes(c.buf[lo : min(hi, len(c.buf))])):
        c.at = lo
        raise c.fail(f"the padding after {after} is not zeros")


def _tensors(c: _Cursor, infos: list, align: int) -> dict[str, GGUFTensor]:
    """The tensors at their offsets: each where the previous one ended (aligned), the last ending with the file."""
    data = c.at + (-c.at % align)
    _padding(c, c.at, data, "the header")
    at, tensors = 0, {}
    for name, ggml, shape, offset, nbytes in infos:
        if offset != at:
            raise c.fail(f"tensor {name} is at offset {offset} of the data, expected {at} (after the tensor before)")
        if nbytes > len(c.buf) - data - at:
            raise c.fail(f"tensor {name} ({ggml} {list(shape)}, {nbytes} bytes) runs past the end of the file")
        view = np.frombuffer(c.buf, dtype=np.uint8, count=nbytes, offset=data + at)
        tensors[name] = GGUFTensor(name, ggml, shape, data + at, view)
        _padding(c, data + at + nbytes, data + at + nbytes + (-nbytes % align), f"tensor {name}")
        at += nbytes + (-nbytes % align)
    ends = {data + at, data + at - (-infos[-1][4] % align)} if infos else {c.at, data}
    if len(c.buf) not in ends:
        raise c.fail(f"the data ends at byte {min(ends)}, but the file has {len(c.buf)} bytes")
    return tensors


def read_gguf(path: str | Path) -> GGUFFile:
    """Every metadata field and tensor of the GGUF file `path`, checked (module docstring)."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p} is missing; {FIX}")
    with open(p, "rb") as f:
        size = f.seek(0, 2)
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    c = _Cursor(p, memoryview(buf))
    if bytes(c.buf[:4]) != MAGIC:
        raise UserError(f"{p} is not a GGUF file (it does not start with {MAGIC!r}); {FIX}")
    c.at = len(MAGIC)
    version = c.scalar("<I", "the version")
    if version not in VERSIONS:
        raise c.fail(f"GGUF version {version} (this reader takes {VERSIONS[0]} and {VERSIONS[1]}, little-endian)")
    n_tensors, n_kv = c.scalar("<Q", "the tensor count"), c.scalar("<Q", "the metadata count")
    # a key-value pair takes at least 13 bytes (key length, type, a one-byte value), a tensor's entry at least 33
    # (name length, a one-byte name, rank, one dimension, type, offset)
    if n_kv * 13 + n_tensors * 33 > size - c.at:
        raise c.fail(f"the header declares {n_kv} metadata fields and {n_tensors} tensors, more than the file holds")
    fields = _fields(c, n_kv)
    align = _alignment(c, fields)
    infos = _tensor_infos(c, n_tensors)
    _check_names(c, fields, [info[0] for info in infos])
    return GGUFFile(p, version, fields, _tensors(c, infos, align))
