"""GGUF on disk (docs/formats.md §3): the type names (types, the format's constants), the quantized blocks byte for
byte (blocks), llama.cpp's own Q6_K quantizer (quantize), which block type holds a quantized weight with its codes
kept (tensors), fused experts as 3-D tensors (experts), llama.cpp's tensor names per architecture (arch), the model's
metadata (metadata, metadata_arch) and tokenizer (vocab), the file written and read back through gguf-py (writer), and
a damaged or hostile file read safely (reader). What to export, and the report: exporters/gguf/."""

from .arch import ARCHITECTURES, llama_qk_permutation
from .blocks import QK_K
from .tensors import auto_type, embed_type_for, encode_layer, float_encode, requantize, tensor_bits
from .types import EMBED_TYPES, FILE_TYPES, FLOAT_TYPES, QTYPES, BlockType, KQuantType, gguf_module
from .writer import read_gguf_weights, write_gguf

__all__ = [
    "ARCHITECTURES",
    "llama_qk_permutation",
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
    "read_gguf_weights",
    "write_gguf",
]
