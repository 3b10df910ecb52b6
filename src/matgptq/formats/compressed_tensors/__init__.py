"""compressed-tensors `pack-quantized` checkpoints (docs/formats.md §5), byte for byte: the format's names, version
and accepted dtypes (constants), the int32 bit-stream packing (packing), the config groups' schemes and which one a
Linear has (scheme), the reader of a checkpoint as a `Checkpoint` (reader), the writer of a layer's tensors, the
config and the directory (writer), and llm-compressor's per-expert layout of fused mixture-of-experts layers
(experts). What to export: exporters/compressed_tensors.py."""

from .constants import CT_VERSION, FORMAT
from .experts import CT_MOE, CtMoE, ct_moe
from .packing import pack_int32, unpack_int32
from .reader import read_ct_checkpoint, read_layer
from .scheme import Scheme, read_schemes, scheme_of
from .writer import CtLayer, Groups, column_block, ct_layer, quantization_config, save_compressed_tensors, weights_args

__all__ = [
    "CT_VERSION",
    "FORMAT",
    "CT_MOE",
    "CtMoE",
    "ct_moe",
    "pack_int32",
    "unpack_int32",
    "read_ct_checkpoint",
    "read_layer",
    "Scheme",
    "read_schemes",
    "scheme_of",
    "CtLayer",
    "Groups",
    "column_block",
    "ct_layer",
    "quantization_config",
    "save_compressed_tensors",
    "weights_args",
]
