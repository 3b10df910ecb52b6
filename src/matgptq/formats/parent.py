"""The matgptq checkpoint: one directory holding a parent (all widths) or a standalone slice.

Files: `config.json` (the HF config plus `quantization_config: {"quant_method": "matgptq"}`, so plain transformers
refuses it instead of loading random weights), tokenizer files, `model.safetensors` and `matgptq.json`.
Tensors, per quantized layer `<name>` (the Linear's module path; weights as [out, in]):
  <name>.codes   uint8  [N, ceil(K·bits/8)]  codes as a little-endian bit stream per row (bits = stored width)
  <name>.scales  float16 [N, G]              master scale per output row and group
  <name>.zeros   uint8  [N, G]               master zero point
  <name>.g_idx   int32  [K]                  group of each input column
  <name>.perm    int32  [K]                  act-order processing order (only with act-order)
and every unquantized tensor of the model under its usual name (embeddings, norms, biases, untied lm_head).
`matgptq.json` records the format version, the QuantConfig, the stored width and shift (slices), the slicing rule,
calibration settings and versions — everything needed to reproduce the weights bit-exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..errors import UserError
from ..fsutil import atomic_output, copy_tokenizer_files
from .quantized import QuantizedWeight

FORMAT = "matgptq"
FORMAT_VERSION = 1
META_FILE = "matgptq.json"
WEIGHTS_FILE = "model.safetensors"
SLICING_RULE = "msb_round_half_up_saturating"  # slicing.py


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Row-wise little-endian bit stream of `bits`-bit codes: code k of a row occupies stream bits [k·b, (k+1)·b)."""
    c = codes.numpy().astype(np.uint8)
    if bits == 8:
        return torch.from_numpy(c.copy())
    planes = (c[..., None] >> np.arange(bits, dtype=np.uint8)) & 1
    return torch.from_numpy(np.packbits(planes.reshape(c.shape[0], -1), axis=1, bitorder="little"))


def unpack_bits(packed: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    p = packed.numpy()
    if bits == 8:
        return torch.from_numpy(p[:, :k].copy())
    planes = np.unpackbits(p, axis=1, count=k * bits, bitorder="little").reshape(p.shape[0], k, bits)
    return torch.from_numpy((planes << np.arange(bits, dtype=np.uint8)).sum(-1, dtype=np.uint8))


@dataclass
class Checkpoint:
    meta: dict
    config: dict  # HF config.json without quantization_config
    layers: dict[str, QuantizedWeight]
    tensors: dict[str, torch.Tensor]  # unquantized tensors
    path: Path

    @property
    def stored_bits(self) -> int:
        return max(q.bits for q in self.layers.values())


def save_checkpoint(
    out: str | Path, config: dict, tensors: dict[str, torch.Tensor], layers: dict[str, QuantizedWeight],
    meta: dict, tokenizer_dir: str | Path | None, overwrite: bool = False,
) -> Path:  # fmt: skip
    """Write a checkpoint directory atomically. `tensors` are the unquantized ones."""
    widths = {(q.bits, q.shift) for q in layers.values()}
    if len(widths) != 1:
        raise ValueError(f"a checkpoint stores one width; got {sorted(widths)}")
    bits, shift = widths.pop()
    out_tensors = {k: v.contiguous() for k, v in tensors.items()}
    for name, q in layers.items():
        out_tensors[f"{name}.codes"] = pack_bits(q.codes, bits)
        out_tensors[f"{name}.scales"] = q.scales.to(torch.float16).contiguous()
        out_tensors[f"{name}.zeros"] = q.zeros.to(torch.uint8).contiguous()
        out_tensors[f"{name}.g_idx"] = q.g_idx.to(torch.int32).contiguous()
        if q.perm is not None:
            out_tensors[f"{name}.perm"] = q.perm.to(torch.int32).contiguous()
    full_meta = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "stored_bits": bits, "shift": shift,
        "slicing": SLICING_RULE, **meta,
        "layers": {name: list(q.shape) for name, q in layers.items()},
    }  # fmt: skip
    hf_config = dict(config, quantization_config={"quant_method": FORMAT, "bits": bits})
    with atomic_output(out, overwrite) as tmp:
        save_file(out_tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", "producer": FORMAT})
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2, default=str))
        (tmp / META_FILE).write_text(json.dumps(full_meta, indent=2))
        if tokenizer_dir is not None:
            copy_tokenizer_files(tokenizer_dir, tmp)
    return Path(out)


def is_checkpoint(path: str | Path) -> bool:
    return (Path(path) / META_FILE).is_file()


def read_checkpoint(path: str | Path) -> Checkpoint:
    p = Path(path)
    try:
        meta = json.loads((p / META_FILE).read_text())
        config = json.loads((p / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{p} is not a readable matgptq checkpoint ({e}); quantize the model again") from None
    if meta.get("format") != FORMAT or int(meta.get("format_version", 0)) > FORMAT_VERSION:
        raise UserError(f"{p} holds format {meta.get('format')} v{meta.get('format_version')}; upgrade matgptq")
    config.pop("quantization_config", None)
    raw = load_file(str(p / WEIGHTS_FILE))
    bits, shift = int(meta["stored_bits"]), int(meta["shift"])
    layers = {}
    for name, (n, k) in meta["layers"].items():
        perm = raw.pop(f"{name}.perm", None)
        layers[name] = QuantizedWeight(
            codes=unpack_bits(raw.pop(f"{name}.codes"), bits, k), scales=raw.pop(f"{name}.scales"),
            zeros=raw.pop(f"{name}.zeros"), g_idx=raw.pop(f"{name}.g_idx"), bits=bits, shift=shift,
            perm=None if perm is None else perm.long(),
        )  # fmt: skip
        if layers[name].codes.shape != (n, k):
            raise UserError(f"{p}: layer {name} has shape {tuple(layers[name].codes.shape)}, metadata says {(n, k)}")
    return Checkpoint(meta, config, layers, raw, p)
