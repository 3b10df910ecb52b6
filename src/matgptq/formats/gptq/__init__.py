"""GPTQ checkpoints (v1 "gptq" and v2 "gptq_v2", docs/formats.md §2), byte for byte: the widths, labels, file and
tensor names (constants), the int32 packing of codes and zero points (packing), the reader of a checkpoint as a
`Checkpoint` (reader), the writer of a layer's tensors, the config and the directory (writer), and the per-expert
layout of fused mixture-of-experts layers, both ways (experts). What to export: exporters/gptq.py."""

from .constants import MOE_TYPES, SUPPORTED_BITS, V1, V2
from .experts import check_moe, gptq_names, gptq_widths, is_expert, row_parts, split_biases, split_layer
from .packing import pack_cols, pack_rows, to_v1_words, unpack_cols, unpack_rows
from .reader import read_gptq_checkpoint, trivial_g_idx
from .writer import dynamic_rules, gptq_layer, layer_tensors, quantization_config, save_gptq

__all__ = [
    "MOE_TYPES",
    "SUPPORTED_BITS",
    "V1",
    "V2",
    "check_moe",
    "gptq_names",
    "gptq_widths",
    "is_expert",
    "row_parts",
    "split_biases",
    "split_layer",
    "pack_cols",
    "pack_rows",
    "to_v1_words",
    "unpack_cols",
    "unpack_rows",
    "read_gptq_checkpoint",
    "trivial_g_idx",
    "dynamic_rules",
    "gptq_layer",
    "layer_tensors",
    "quantization_config",
    "save_gptq",
]
