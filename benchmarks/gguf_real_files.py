"""What benchmarks/gguf_vs_llamacpp_real.py reads back from a GGUF file (with gguf-py): its tensor types and bytes, and
the search budget that fills a preset's bytes."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

from benchmarks.gguf_real_rows import EMBED_BLOCK_BYTES


def tensor_types(path: Path) -> dict:
    """{'ROLE:TYPE': how many tensors} of the weight matrices (norms left out), read back with gguf-py."""
    import gguf

    out: dict[str, int] = {}
    n_params = n_bytes = 0
    for t in gguf.GGUFReader(str(path)).tensors:
        n_params += int(t.n_elements)
        n_bytes += int(t.n_bytes)
        if t.name.endswith("norm.weight"):
            continue
        role = t.name.split(".")[-2] if t.name.startswith("blk.") else t.name.split(".")[0]
        key = f"{role}:{t.tensor_type.name}"
        out[key] = out.get(key, 0) + 1
    return {"types": out, "params": n_params, "tensor_bytes": n_bytes}


def file_info(path: Path) -> dict:
    info = tensor_types(path)
    size = path.stat().st_size
    return {"bytes": size, "bpw": info["tensor_bytes"] * 8 / info["params"], **info}


def search_budget(f32: Path, preset_bytes: int, embed: str, kind: str) -> str:
    """The budget (bits per quantized weight, 4 decimals, rounded down) of `kind` at which a searched mix's file
    holds at most `preset_bytes` of tensors. "gguf" counts the layers' GGUF bytes; "code" counts them exactly too on
    the [4,5,8] parent: at group size 32 each level's type (Q4_0, Q5_0, Q8_0) spends the same 16/32 bits per weight on
    its float16 scales, so a layer of N·K weights at width r takes N·K·(r + 1/2)/8 bytes. The rest of our file is
    fixed: token_embd in `embed` (EMBED_BLOCK_BYTES per 32 weights) and the norms in F32 (from the F32 file)."""
    import gguf

    fixed = quantized = 0
    for t in gguf.GGUFReader(str(f32)).tensors:
        n = int(t.n_elements)
        if t.name.startswith("blk.") and not t.name.endswith("norm.weight"):
            quantized += n
        elif t.name == "token_embd.weight":
            fixed += n * EMBED_BLOCK_BYTES[embed] // 32
        else:
            fixed += 4 * n
    b = Fraction(8 * (preset_bytes - fixed), quantized) - (Fraction(1, 2) if kind == "code" else 0)
    q = math.floor(b * 10**4)
    return f"{q // 10**4}.{q % 10**4:04d}"
