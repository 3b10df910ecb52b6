"""What every checkpoint exporter starts from: the quantized checkpoint to export and each layer's width."""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from ..formats.mix import width_spec
from ..fsutil import check_output
from ..runtime import open_checkpoint, resolve_bits


def quantized_source(src, out, bits: int | None, bits_config, overwrite: bool):
    """(checkpoint, {layer: width}) of the quantized checkpoint `src` at `bits` or the mix `bits_config`, after
    checking, before any work, that `out` may be written; bad input is one UserError."""
    spec = width_spec(bits, bits_config)
    check_output(out, overwrite)
    if not Path(src).is_dir():
        raise UserError(
            f"{src} is not a directory; give a matgptq parent/slice, a GPTQ or a compressed-tensors checkpoint"
        )
    ckpt = open_checkpoint(src)
    if ckpt is None:
        raise UserError(f"{src} is not quantized; quantize it first (matgptq quantize) and export the result")
    return ckpt, resolve_bits(spec, ckpt)
