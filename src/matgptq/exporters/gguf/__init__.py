"""GGUF files for llama.cpp: the writer (writer), llama.cpp's tensor names per architecture (arch), the metadata keys
(metadata) and the tokenizer (vocab)."""

from .arch import ARCHITECTURES, llama_qk_permutation
from .writer import GGUFExport, GGUFExportWarning, TensorExport, export_gguf, read_gguf_weights

__all__ = [
    "ARCHITECTURES",
    "llama_qk_permutation",
    "GGUFExport",
    "GGUFExportWarning",
    "TensorExport",
    "export_gguf",
    "read_gguf_weights",
]
