"""Loading unquantized Hugging Face models and tokenizers from local directories (no hub access needed)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..errors import UserError


def require_model_dir(path: str | Path) -> Path:
    p = Path(path)
    if not (p / "config.json").is_file():
        raise UserError(f"no model found at {p} (expected a directory with config.json); give a local model directory")
    return p


def load_tokenizer(path: str | Path):
    try:
        return AutoTokenizer.from_pretrained(require_model_dir(path))
    except (OSError, ValueError) as e:
        raise UserError(f"cannot load a tokenizer from {path}: {e}".splitlines()[0]) from None


def load_fp_model(path: str | Path, dtype: torch.dtype | None = None):
    """The unquantized model in eval mode (its own dtype unless `dtype`)."""
    p = require_model_dir(path)
    if not any(p.glob("*.safetensors")):
        raise UserError(f"{p} has no .safetensors weights; this tool loads only safetensors (never pickles)")
    logging.getLogger("transformers.modeling_utils").setLevel(logging.ERROR)
    model = AutoModelForCausalLM.from_pretrained(p, dtype=dtype or "auto", use_safetensors=True)
    return model.eval()
