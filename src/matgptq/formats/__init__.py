"""Bytes on disk, each external format in its own folder with its constants, packing, reader and writer: GPTQ
(gptq/), compressed-tensors pack-quantized (compressed_tensors/) and GGUF (gguf/). matgptq's own: the parent or
slice (parent, its codes' bit stream in bitstream, its checksums in checksums, written block by block by staged and
streamed), the integer weight and the quantized model every reader returns (quantized), the slicing rule (slicing)
and the per-layer width spec (mix). What to export, and the reports: exporters/."""

from .compressed_tensors import read_ct_checkpoint
from .gptq import SUPPORTED_BITS, pack_cols, pack_rows, read_gptq_checkpoint, to_v1_words, trivial_g_idx
from .parent import is_checkpoint, read_checkpoint, save_checkpoint, write_slice
from .quantized import Checkpoint, QuantizedWeight
from .slicing import position_table

__all__ = [
    "Checkpoint",
    "is_checkpoint",
    "read_checkpoint",
    "save_checkpoint",
    "write_slice",
    "QuantizedWeight",
    "position_table",
    "read_gptq_checkpoint",
    "trivial_g_idx",
    "SUPPORTED_BITS",
    "pack_cols",
    "pack_rows",
    "to_v1_words",
    "read_ct_checkpoint",
]
