"""What every checkpoint exporter starts from: the quantized checkpoint to export and each layer's width."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import UserError
from ..formats.mix import width_spec
from ..fsutil import check_output
from ..runtime import open_checkpoint, resolve_bits


FUSED_EXPERT = re.compile(r"\.experts\.\d+\.gate_up_proj$")  # an expert of a fused 3-D tensor (models/experts.py)


def quantized_source(src, out, bits: int | None, bits_config, overwrite: bool, experts: bool = False):
    """(checkpoint, {layer: width}) of the quantized checkpoint `src` at `bits` or the mix `bits_config`, after
    checking, before any work, that `out` may be written; bad input is one UserError. Fused experts are refused
    unless the exporter maps them (`experts`: GPTQ, formats/gptq_experts.py)."""
    spec = width_spec(bits, bits_config)
    check_output(out, overwrite)
    if not Path(src).is_dir():
        raise UserError(f"{src} is not a directory; give a matgptq parent/slice or a GPTQ checkpoint")
    ckpt = open_checkpoint(src)
    if ckpt is None:
        raise UserError(f"{src} is not quantized; quantize it first (matgptq quantize) and export the result")
    fused = next((n for n in ckpt.layers if FUSED_EXPERT.search(n)), None)
    if fused is not None and not experts:
        raise UserError(f"{src} quantizes fused mixture-of-experts tensors per expert ({fused}); exporting them is "
                        "not supported yet in this format (no compressed-tensors or GGUF reader maps these layers): "
                        "export --format gptq_v1/gptq_v2, or load the checkpoint with matgptq.load")  # fmt: skip
    return ckpt, resolve_bits(spec, ckpt)
