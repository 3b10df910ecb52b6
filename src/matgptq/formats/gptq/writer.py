"""GPTQ checkpoints (v1 "gptq" and v2 "gptq_v2") written from matgptq weights: each layer's four tensors, the
quantization config and the directory. The layout (tensors per layer, padding of odd shapes, zero-point conventions)
is described in docs/formats.md §2 and read back by reader.py; exporters/gptq.py chooses what to write.

Slice → GPTQ (docs/formats.md §2.8): an r-bit slice of a c-bit parent is W = s·(S·2^d − z_c), d = c − r (`shift`), so

    GPTQ scale = s · 2^d    (exact in float16 unless it overflows)      GPTQ zero = z_c / 2^d    (must be an integer)

Symmetric slices are always exact (z_c = 2^(c−1) → 2^(r−1)); an asymmetric slice whose zero is not divisible is
refused, never rounded. v1 is written only when lossless: symmetric weights (§2.5: an asymmetric zero of 0 cannot be
stored as z − 1, and GPTQModel refuses asymmetric v1 not made by itself).
Config (§2.6–2.7): the same dict in config.json["quantization_config"] and quantize_config.json, with both
`checkpoint_format` and `format`; a per-layer mix uses the most common width as `bits` plus GPTQModel `dynamic`
overrides {"+:^<escaped name>$": {"bits": r}} (one rule for a fused group at one width: `dynamic_rules`), which
GPTQModel and vLLM honour and transformers/optimum ignore.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from ..._version import __version__
from ...errors import UserError
from ...fsutil import atomic_output, copy_tokenizer_files
from ..quantized import QuantizedWeight
from .constants import CONFIG_FILES, SUPPORTED_BITS, WEIGHTS_FILE
from .packing import pack_cols, pack_rows, to_v1_words

FusedGroup = tuple[str, tuple[str, ...]]  # (the module a fused group's layers share, the layers: models/fused.py)


def gptq_layer(name: str, q: QuantizedWeight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes [N, K], fp16 scales [N, G], integer zeros [N, G]) of the plain r-bit GPTQ layer equal to `q`."""
    d = q.shift
    scales = q.scales.float() * float(1 << d)
    if not torch.isfinite(scales.half()).all():
        raise UserError(f"{name}: scale·2^{d} overflows float16 for the {q.bits}-bit slice; export a wider slice")
    zeros = q.zeros.to(torch.int32)
    if (zeros % (1 << d)).any():
        bad = int((zeros % (1 << d) != 0).sum())
        raise UserError(
            f"{name}: {bad} asymmetric zero point(s) of the {q.master_bits}-bit parent are not multiples of 2^{d}, so "
            f"the {q.bits}-bit slice has a fractional GPTQ zero; export {q.master_bits} bits, use a symmetric parent "
            "(--sym), or export GGUF (Q4_1/Q5_1 hold an offset)"
        )
    return q.codes.numpy(), scales.half().numpy(), (zeros >> d).numpy()


def layer_tensors(name: str, q: QuantizedWeight, v1: bool) -> tuple[dict[str, torch.Tensor], bool, bool]:
    """The four GPTQ tensors of one layer, whether its zeros are the symmetric 2^(r−1), and whether it was padded."""
    r = q.bits
    if r not in SUPPORTED_BITS:
        raise UserError(
            f"GPTQ has no packing for {r}-bit weights ({name}); export 2, 3, 4 or 8 bits, or use --format gguf"
        )
    codes, scales, zeros = gptq_layer(name, q)
    n, k = codes.shape
    if r == 3 and (n % 32 or k % 32):
        raise UserError(
            f"{name} has {n} output × {k} input features; 3-bit GPTQ packs blocks of 32 values across 3 words, so both "
            "must be multiples of 32 (no GPTQ loader reads a partial 3-bit block, and GPTQModel cannot write one); "
            "export 2, 4 or 8 bits (padded as GPTQModel does), or use --format gguf"
        )
    sym = bool((zeros == 1 << (r - 1)).all())
    if v1 and not sym:
        raise UserError(
            f"{name} has asymmetric zero points, which GPTQ v1 cannot store losslessly (a zero of 0 becomes −1, and "
            "GPTQModel refuses asymmetric v1 checkpoints it did not make); use --format gptq_v2"
        )
    qzeros = pack_cols(zeros.T, r, pad=True)
    tensors = {"qweight": pack_rows(codes.T, r, pad=True), "qzeros": to_v1_words(qzeros, r) if v1 else qzeros}
    tensors = {key: torch.from_numpy(np.ascontiguousarray(v)) for key, v in tensors.items()}
    tensors["scales"] = torch.from_numpy(np.ascontiguousarray(scales.T))
    tensors["g_idx"] = q.g_idx.to(torch.int32).contiguous()
    return tensors, sym, (k * r) % 32 != 0 or (n * r) % 32 != 0


def quantization_config(
    fmt: str,
    widths: dict[str, int],
    group_size: int,
    desc_act: bool,
    sym: bool,
    solver: dict,
    groups: list[FusedGroup] = (),
) -> dict:
    """The GPTQ config dict (fields every loader reads, docs/formats.md §2.6), with `dynamic` for per-layer mixes
    (`groups`: the fused groups of `dynamic_rules`); `solver`: the solver's settings (damp_percent, ...) as recorded."""
    counts = Counter(widths.values())
    base = max(counts, key=lambda b: (counts[b], b))
    qc = {
        "quant_method": "gptq",
        "method": "gptq",
        "bits": base,
        "group_size": group_size,
        "desc_act": desc_act,
        "sym": sym,
        "lm_head": False,
        "checkpoint_format": fmt,
        "format": fmt,
        "pack_dtype": "int32",
        **solver,
        "meta": {"quantizer": [f"matgptq:{__version__}"], **solver},
    }
    dynamic = dynamic_rules(widths, base, groups)
    if dynamic:
        qc["dynamic"] = dynamic
    return qc


def dynamic_rules(widths: dict[str, int], base: int, groups: list[FusedGroup]) -> dict[str, dict]:
    """GPTQModel `dynamic` overrides for the layers not at `base` bits: `+:^<name>$` per layer, except that a fused
    group (models/fused.py) at one width gets one rule that also matches the name an engine gives the fused layer,
    since vLLM matches the rules against that name: for q/k/v or gate/up, `…self_attn.qkv_proj`, so every name in the
    group's module but the module's other layers, `+:^<module>\\.(?!(?:<other>|…)$)[^.]+$`; for a block's experts,
    the experts module itself (vLLM's fused MoE layer) and each expert's layers, `+:^<module>(?:\\.\\d+\\.[^.]+)?$`."""
    rules, done = {}, set()
    for module, group in groups:
        parents = {n.rpartition(".")[0] for n in group}
        at = {widths.get(n) for n in group}
        if len(group) < 2 or len(at) > 1 or None in at or base in at:
            continue
        if len(parents) > 1:  # a block's experts: <module>.<expert>.<layer>
            if not module or not all(re.fullmatch(rf"{re.escape(module)}\.\d+\.[^.]+", n) for n in group):
                continue
            rules[f"+:^{re.escape(module)}(?:\\.\\d+\\.[^.]+)?$"] = {"bits": at.pop()}
            done.update(group)
            continue
        parent = parents.pop()
        others = sorted(n.rpartition(".")[2] for n in widths if n.rpartition(".")[0] == parent and n not in group)
        avoid = f"(?!(?:{'|'.join(map(re.escape, others))})$)" if others else ""
        rules[f"+:^{re.escape(parent)}\\.{avoid}[^.]+$"] = {"bits": at.pop()}
        done.update(group)
    rules.update({f"+:^{re.escape(n)}$": {"bits": r} for n, r in widths.items() if r != base and n not in done})
    return rules


def save_gptq(
    out: str | Path, tensors: dict[str, torch.Tensor], config: dict, qc: dict, tokenizer_dir: Path, overwrite: bool
) -> Path:
    """The GPTQ directory `out`, written atomically: the tensors, config.json with `qc` as its quantization_config,
    quantize_config.json and the tokenizer files of `tokenizer_dir`."""
    with atomic_output(out, overwrite, size=sum(t.nbytes for t in tensors.values())) as tmp:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", "producer": "matgptq"})
        (tmp / "config.json").write_text(json.dumps(dict(config, quantization_config=qc), indent=2, default=str))
        (tmp / CONFIG_FILES[0]).write_text(json.dumps(qc, indent=2))
        copy_tokenizer_files(tokenizer_dir, tmp)
    return Path(out)
