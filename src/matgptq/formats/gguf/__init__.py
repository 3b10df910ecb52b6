"""GGUF on disk: the type names (types), the quantized blocks byte for byte (blocks), llama.cpp's own Q6_K quantizer
(quantize) and which block type holds a quantized weight with its codes kept (tensors). The writer of whole files is
export/gguf (it needs a loaded model)."""

from .blocks import QK_K
from .tensors import auto_type, embed_type_for, encode_layer, float_encode, requantize, tensor_bits
from .types import EMBED_TYPES, FILE_TYPES, FLOAT_TYPES, QTYPES, BlockType, KQuantType, gguf_module

__all__ = [
    "QK_K",
    "auto_type",
    "embed_type_for",
    "encode_layer",
    "float_encode",
    "requantize",
    "tensor_bits",
    "EMBED_TYPES",
    "FILE_TYPES",
    "FLOAT_TYPES",
    "QTYPES",
    "BlockType",
    "KQuantType",
    "gguf_module",
]
