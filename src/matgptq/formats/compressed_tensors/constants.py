"""compressed-tensors' constants (docs/formats.md §5): the format and method names, the version whose layout is
written, the tensor names of a packed Linear, and what the reader accepts (class names a target matches, dtypes)."""

from __future__ import annotations

import torch

FORMAT = "pack-quantized"
QUANT_METHOD = "compressed-tensors"
CT_VERSION = "0.19.0"  # the layout written: dense packing across int32 words, no g_idx
STRADDLING = (0, 17)  # the `version` field (a file's data) from which 3/5/6/7-bit codes straddle int32 words
PARAMS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx")  # per Linear
WEIGHTS_FILE = "model.safetensors"
LINEAR_CLASSES = ("Linear", "Module")  # what a packed module is (nn.Linear): the class names a target can match
SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# integer tensors (shapes, zero points, g_idx) as compressed-tensors writes them; torch compares no wider unsigned ones
INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
FIX = "the compressed-tensors checkpoint is damaged or incomplete; re-download or re-export it"
