"""Exports of quantized checkpoints to formats other tools run: GPTQ (v1/v2), compressed-tensors (`pack-quantized`)
and GGUF; `export` picks the writer (`matgptq export` is cli/export.py)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

from ..formats.mix import WidthSpec


class ExportFormat(str, Enum):
    GPTQ_V1 = "gptq_v1"
    GPTQ_V2 = "gptq_v2"
    COMPRESSED_TENSORS = "compressed-tensors"
    GGUF = "gguf"


def export(
    src: str | Path,
    out: str | Path,
    format: ExportFormat | str,
    *,
    bits: int | None = None,
    bits_config: WidthSpec | None = None,
    overwrite: bool = False,
    **gguf_options,
) -> Path:
    """Write the quantized checkpoint `src` (a parent, slice or GPTQ checkpoint; an unquantized model for GGUF) at
    `bits` or the mix `bits_config` as `format` to `out` (a directory, or the .gguf file). `gguf_options`:
    `qtype`, `float_type`, `embed_type` of export_gguf. Which readers run the result: exporters/readers.py."""
    fmt = ExportFormat(format)
    if fmt is ExportFormat.GGUF:
        from .gguf import export_gguf

        return export_gguf(src, out, bits, bits_config, overwrite=overwrite, **gguf_options).path
    if gguf_options:
        raise TypeError(f"options {sorted(gguf_options)} apply to GGUF only")
    if fmt is ExportFormat.COMPRESSED_TENSORS:
        from .compressed_tensors import export_compressed_tensors

        return export_compressed_tensors(src, out, bits, bits_config, overwrite)
    from .gptq import export_gptq

    return export_gptq(src, out, fmt.value, bits, bits_config, overwrite)


__all__ = ["ExportFormat", "export"]
