"""The Hugging Face side: resolve a model id or directory (hub), load a model directory and its tokenizer (hf), name
the Linears each architecture quantizes in true-sequential groups (arch), and turn text into calibration and
evaluation windows (text)."""

from .arch import (
    ArchSpec,
    arch_spec,
    get_blocks,
    layer_weight,
    quantized_layer_names,
    set_layer_weight,
    set_weight_matrix,
    weight_keys,
    weight_matrix,
    weight_swapped,
)
from .hf import LOAD_ERRORS, config_dtype, load_fp_model, load_tokenizer, loader_quiet, quiet_loggers, require_model_dir
from .hub import ModelSource, resolve_model
from .text import calibration_windows, eval_windows, file_sha256, read_text, tokenize

__all__ = [
    "ArchSpec",
    "arch_spec",
    "get_blocks",
    "layer_weight",
    "quantized_layer_names",
    "set_layer_weight",
    "set_weight_matrix",
    "weight_keys",
    "weight_matrix",
    "weight_swapped",
    "LOAD_ERRORS",
    "config_dtype",
    "load_fp_model",
    "loader_quiet",
    "quiet_loggers",
    "load_tokenizer",
    "require_model_dir",
    "ModelSource",
    "resolve_model",
    "calibration_windows",
    "eval_windows",
    "file_sha256",
    "read_text",
    "tokenize",
]
