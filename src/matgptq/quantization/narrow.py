"""Calibration passes in a narrower dtype than the model's weights: bfloat16 passes of a float32 model.

Each block's passes (Hessians, replays, the next block's inputs) run on a bfloat16 twin of the block, while the
solver reads the block's own float32 weights and each solved layer's dequantized codes are written into both: the
twin computes with them rounded to bfloat16, the block keeps them exactly. The checkpoint is written from the block,
so the tensors left unquantized (norms, biases, `--skip`'s layers, everything outside the blocks) are the model's
float32 values, untouched, and the checkpoint is a float32 one whatever the CPU.

This is the bfloat16 calibration GPTQModel does on a CPU without rounding the weights the solver starts from. The
passes compute what a bfloat16 copy of the model would: the embeddings' outputs and the rotary tables are the model's
float32 values rounded once (`cast_inputs`), as a bfloat16 model rounds them, and every Linear input is a bfloat16
value, so the Hessians take hessian.py's exact bfloat16 product path.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from .passes import Inputs


def twin(block: nn.Module, dtype: torch.dtype | None) -> nn.Module:
    """`block` itself when `dtype` is None or its own, else a copy of it in `dtype` (the passes' block)."""
    own = next(block.parameters()).dtype
    if dtype is None or dtype == own:
        return block
    return copy.deepcopy(block).to(dtype)


def cast_inputs(inputs: Inputs, dtype: torch.dtype | None) -> Inputs:
    """The first block's inputs with every floating tensor (hidden states, position embeddings, a float mask) in
    `dtype`; masks of booleans and position ids stay as they are. A float32 mask's finfo.min (beyond bfloat16's
    range) becomes `dtype`'s, as the model would have built it in that dtype."""
    if dtype is None:
        return inputs
    return [(_cast(hidden, dtype), {k: _cast(v, dtype) for k, v in kwargs.items()}) for hidden, kwargs in inputs]


def _cast(value, dtype: torch.dtype):
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(v, dtype) for v in value)
    if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.dtype == dtype:
        return value
    low = torch.finfo(value.dtype).min
    return value.clamp(min=torch.finfo(dtype).min).to(dtype) if bool((value == low).any()) else value.to(dtype)
