"""Byte-level damage recipes for tests/test_fuzz_volume.py: how one file of a source checkpoint is damaged, and the
generators that draw them.

A recipe is JSON: {"reader", "file", "kind", "ops": [[at, cut, put_hex], ...]}: each op replaces `cut` bytes of the
ORIGINAL file at `at` by the bytes `put` (ops never overlap; a truncation at L is [L, size − L, ""]). Structured
edits (a safetensors header's dtype or shape, a JSON value, a GGUF count) are drawn on the parsed file and stored as
the byte splice they amount to, so every recipe replays on bytes alone.
"""

from __future__ import annotations

import json
import math
import random
import struct

# --- recipes -----------------------------------------------------------------------------------------------------


def apply(raw: bytes, ops: list) -> bytes:
    """`raw` with the splices `ops` (positions in `raw`; clipped to its length, so a recipe replays on any file)."""
    out = bytearray(raw)
    for at, cut, put in sorted(ops, key=lambda op: -op[0]):
        at = min(at, len(out))
        out[at : at + cut] = bytes.fromhex(put)
    return bytes(out)


def splice(old: bytes, new: bytes, base: int = 0) -> list:
    """The one op turning `old` into `new` (their common prefix and suffix left out), at offset `base`."""
    pre = 0
    while pre < min(len(old), len(new)) and old[pre] == new[pre]:
        pre += 1
    suf = 0
    while suf < min(len(old), len(new)) - pre and old[-1 - suf] == new[-1 - suf]:
        suf += 1
    return [[base + pre, len(old) - pre - suf, new[pre : len(new) - suf].hex()]] if old != new else []


def damaged_bytes(ops: list) -> set[int] | None:
    """Positions of the original whose byte changed, when no op changes the length (else None: bytes moved)."""
    if any(cut != len(put) // 2 for _, cut, put in ops):
        return None
    return {at + i for at, _, put in ops for i in range(len(put) // 2)}


# --- values a damaged field takes ------------------------------------------------------------------------------------

HUGE = [2**31 - 1, 2**31, 2**32, 2**32 + 1, 2**40, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1]
JSON_VALUES = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2,
    3,
    7,
    8,
    9,
    16,
    31,
    33,
    64,
    -(2**63),
    10**30,
    1e308,
    1.5,
    0.0,
    math.nan,
    math.inf,
    "",
    "x",
    "float16",
    "bfloat16",
    "gptq",
    "re:.*",
    [],
    [1],
    [0, 0],
    [-1, 2**40],
    {},
    {"a": 1},
    *HUGE,
]


def _json_paths(obj, prefix=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _json_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:6]):
            yield prefix + (i,)
            yield from _json_paths(v, prefix + (i,))


def _edit_json(rng: random.Random, obj):
    """Replace, delete, re-type or scale one value of `obj` (in place); the edited path."""
    paths = list(_json_paths(obj))
    if not paths:
        return rng.choice(JSON_VALUES)
    path = rng.choice(paths)
    node = obj
    for k in path[:-1]:
        node = node[k]
    old, op = node[path[-1]], rng.random()
    if op < 0.15 and isinstance(node, dict):
        del node[path[-1]]
    elif op < 0.35 and isinstance(old, (int, float)) and not isinstance(old, bool):
        node[path[-1]] = rng.choice([old + 1, old - 1, -old, old * 2, old * 1024, old // 2, float(old) + 0.5])
    elif op < 0.45 and isinstance(old, str):
        node[path[-1]] = old[: rng.randrange(len(old) + 1)] + rng.choice(["", "x", ".", "_1"])
    else:
        node[path[-1]] = rng.choice(JSON_VALUES)
    return obj


# --- generators: (kind, ops) for one file's bytes -------------------------------------------------------------------


def _truncate(rng: random.Random, raw: bytes, edges: list[int]) -> list:
    at = rng.choice(edges + [rng.randrange(len(raw))]) if edges and rng.random() < 0.3 else rng.randrange(len(raw))
    at = max(0, min(at, len(raw) - 1))
    return [[at, len(raw) - at, ""]]


def _flips(rng: random.Random, raw: bytes, lo: int, hi: int) -> list:
    """1 to 3 bytes in [lo, hi) xor-ed with a non-zero mask (single bits twice as often as whole bytes)."""
    ops = {}
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(lo, hi)
        mask = 1 << rng.randrange(8) if rng.random() < 0.67 else rng.randrange(1, 256)
        ops[at] = [at, 1, bytes([raw[at] ^ mask]).hex()]
    return list(ops.values())


def json_damage(rng: random.Random, raw: bytes) -> tuple[str, list]:
    kind = rng.choice(["truncate", "flip", "edit", "edit"])
    if kind == "truncate":
        return kind, _truncate(rng, raw, [])
    if kind == "flip":
        return kind, _flips(rng, raw, 0, len(raw))
    obj = _edit_json(rng, json.loads(raw))
    new = json.dumps(obj, indent=2 if b"\n" in raw else None).encode()  # as written: the splice is the edit alone
    return kind, splice(raw, new)


ST_DTYPES = [
    "F64",
    "F32",
    "F16",
    "BF16",
    "I64",
    "I32",
    "I16",
    "I8",
    "U8",
    "U16",
    "U32",
    "U64",
    "BOOL",
    "F8_E4M3",
    "X9",
    "",
]


def _header(raw: bytes) -> tuple[int, dict]:
    n = struct.unpack("<Q", raw[:8])[0]
    return n, json.loads(raw[8 : 8 + n])


def _shape_edit(rng: random.Random, shape: list):
    options = [
        list(reversed(shape)),
        shape[:-1],
        shape + [1],
        [0],
        [rng.choice(HUGE)],
        [-1],
        ["a"],
        None,
        [s + rng.choice([-1, 1]) for s in shape],
        [math.prod(shape)],
        shape + [rng.choice(HUGE)],
    ]
    return rng.choice(options)


def _header_edit(rng: random.Random, head: dict) -> dict:
    names = [k for k in head if k != "__metadata__"]
    name, entry = (n := rng.choice(names)), head[n]
    op = rng.choice(["retype", "reshape", "offsets", "drop", "rename", "metadata", "add"])
    if op == "retype":
        entry["dtype"] = rng.choice(ST_DTYPES)
    elif op == "reshape":
        entry["shape"] = _shape_edit(rng, entry["shape"])
    elif op == "offsets":
        b, e = entry["data_offsets"]
        huge = rng.choice(HUGE)
        entry["data_offsets"] = rng.choice(
            [[e, b], [b + 1, e + 1], [b, e - 1], [b, huge], [huge, huge + 8], [0, e - b], [-8, e], [b]]
        )
    elif op == "drop":
        del head[name]
    elif op == "rename":
        head[name + rng.choice(["_", ".x", "s"]) if rng.random() < 0.5 else rng.choice(names) + "_"] = head.pop(name)
    elif op == "metadata":
        head["__metadata__"] = rng.choice([None, [], {"format": 1}, {"format": "tf"}, "pt", {}])
    else:
        head[name + ".extra"] = dict(entry)
    return head


def safetensors_damage(rng: random.Random, raw: bytes) -> tuple[str, list]:
    n, head = _header(raw)
    kind = rng.choice(["truncate", "header_flip", "data_flip", "data_flip", "header_edit", "header_edit", "length"])
    if kind == "truncate":
        return kind, _truncate(rng, raw, [8, 8 + n, 8 + n + 1])
    if kind == "header_flip":
        return kind, _flips(rng, raw, 0, 8 + n)
    if kind == "data_flip":
        return kind, _flips(rng, raw, 8 + n, len(raw))
    if kind == "length":
        value = rng.choice(HUGE + [0, 1, n - 1, n + 1, n + 8, n - 8, len(raw), len(raw) - 8])
        return kind, [[0, 8, struct.pack("<Q", value % 2**64).hex()]]
    text = json.dumps(_header_edit(rng, head), separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8 if rng.random() < 0.8 else rng.randrange(3))
    return kind, [[0, 8, struct.pack("<Q", len(text)).hex()], *splice(raw[8 : 8 + n], text, base=8)]


# --- GGUF: every integer field of the header, found by walking it --------------------------------------------------

_GGUF_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_fields(raw: bytes) -> tuple[list[tuple[int, int]], int]:
    """(offset, size) of every count, length, type, dimension, offset and integer value of an undamaged GGUF
    header, and where the header ends."""
    at, out = 4, [(4, 4), (8, 8), (16, 8)]
    n_tensors, n_kv = struct.unpack_from("<QQ", raw, 8)
    at = 24

    def string():
        nonlocal at
        out.append((at, 8))
        at += 8 + struct.unpack_from("<Q", raw, at)[0]

    def value(t):
        nonlocal at
        if t == 8:
            return string()
        if t == 9:
            item, count = struct.unpack_from("<IQ", raw, at)
            out.extend([(at, 4), (at + 4, 8)])
            at += 12
            for _ in range(count):
                value(item)
            return
        if t not in (6, 12):
            out.append((at, _GGUF_SCALAR[t]))
        at += _GGUF_SCALAR[t]

    for _ in range(n_kv):
        string()
        out.append((at, 4))
        at += 4
        value(struct.unpack_from("<I", raw, at - 4)[0])
    for _ in range(n_tensors):
        string()
        n_dims = struct.unpack_from("<I", raw, at)[0]
        out.extend(
            [(at, 4)]
            + [(at + 4 + 8 * i, 8) for i in range(n_dims)]
            + [(at + 4 + 8 * n_dims, 4), (at + 12 + 8 * n_dims, 8)]
        )
        at += 16 + 8 * n_dims
    return out, at


def gguf_damage(rng: random.Random, raw: bytes) -> tuple[str, list]:
    fields, end = gguf_fields(raw)
    kind = rng.choice(["truncate", "header_flip", "data_flip", "field", "field", "field"])
    if kind == "truncate":
        return kind, _truncate(rng, raw, [4, 8, 24, end, end + 1, len(raw) - 1])
    if kind == "header_flip":
        return kind, _flips(rng, raw, 0, end)
    if kind == "data_flip":
        return kind, _flips(rng, raw, end, len(raw))
    at, size = rng.choice(fields)
    old = int.from_bytes(raw[at : at + size], "little")
    top = 2 ** (8 * size)
    value = rng.choice([0, 1, old + 1, old - 1, old * 2, old + 32, top - 1, top // 2, 13, 9, 2**32, len(raw)])
    return kind, [[at, size, (value % top).to_bytes(size, "little").hex()]]
