"""Bytes on disk, one module per layout, each with its reader and writer: the matgptq parent or slice (parent), the
integer weight it stores (quantized) and the slicing rule (slicing); GPTQ checkpoints (gptq_checkpoint) and their
int32 packing (gptq_packing); compressed-tensors pack-quantized checkpoints (ct_checkpoint: the reader; the writer is
exporters/compressed_tensors.py); GGUF's types, blocks and which block type holds a quantized weight (gguf/)."""

from .ct_checkpoint import read_ct_checkpoint
from .gptq_checkpoint import read_gptq_checkpoint, trivial_g_idx
from .gptq_packing import SUPPORTED_BITS, pack_cols, pack_rows, to_v1_words
from .parent import Checkpoint, is_checkpoint, read_checkpoint, save_checkpoint, write_slice
from .quantized import QuantizedWeight
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
