"""GGUF export for llama.cpp: what to write and how it measured (export), the report of a written file (report). The
file's bytes (tensor names, blocks, metadata, tokenizer, the writer and its reading back) are formats/gguf/'s."""

from .export import export_gguf
from .report import GGUFExport, GGUFExportWarning, TensorExport

__all__ = ["GGUFExport", "GGUFExportWarning", "TensorExport", "export_gguf"]
