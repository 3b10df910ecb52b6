"""Loading unquantized Hugging Face models and tokenizers from local directories (no hub access needed)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..errors import UserError
from ..untrusted import read_header, read_json


def _strict_config_error() -> tuple[type[Exception], ...]:
    try:  # transformers 5 validates configs as huggingface_hub strict dataclasses
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return ()
    return (StrictDataclassError,)


# What transformers (and torch's module constructors) raise on a damaged config.json or weights they cannot place,
# found by fuzzing (tests/test_damaged_inputs.py): reported as one UserError line naming the directory.
LOAD_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    ValueError,
    LookupError,
    TypeError,
    RuntimeError,
    AttributeError,
    ArithmeticError,
    AssertionError,
    *_strict_config_error(),
)


def require_model_dir(path: str | Path) -> Path:
    p = Path(path)
    if not (p / "config.json").is_file():
        raise UserError(f"no model found at {p} (expected a directory with config.json); give a local model directory")
    return p


def load_tokenizer(path: str | Path):
    p = require_model_dir(path)
    try:
        return AutoTokenizer.from_pretrained(p)
    except Exception as e:  # noqa: BLE001 — the tokenizers library reports a damaged tokenizer.json as bare Exception
        raise UserError(f"cannot load a tokenizer from {path}: {e}".splitlines()[0]) from None


@contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    """The named loggers log errors only while this runs, and as before afterwards."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def loader_quiet():
    """transformers' model loader quiet: its notes on unused or initialised weights, which matgptq's own checks replace,
    and the tensor-parallel plan check it runs whenever its logger is at WARNING or above (a note about layers "not
    sharded" on a model nobody shards)."""
    return quiet_loggers("transformers.modeling_utils", "transformers.distributed.tensor_parallel")


def config_dtype(path: str | Path) -> str | None:
    """config.json's dtype (`dtype`, or transformers 4's `torch_dtype`); None where it names none or cannot be read
    (loading the model then says what is wrong)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return (config.get("dtype") or config.get("torch_dtype")) if isinstance(config, dict) else None


def load_fp_model(path: str | Path, dtype: torch.dtype | None = None):
    """The unquantized model in eval mode (its own dtype unless `dtype`). config.json and every safetensors header
    are validated first, so a damaged download is one UserError naming the file, not a loader traceback."""
    p = require_model_dir(path)
    fix = "the model directory is damaged or incomplete; re-download or re-create it"
    config = read_json(p / "config.json", fix)
    shards = sorted(p.glob("*.safetensors"))
    if not shards:
        raise UserError(f"{p} has no .safetensors weights; this tool loads only safetensors (never pickles)")
    for shard in shards:
        read_header(shard, fix)
    try:
        with loader_quiet():
            model, info = AutoModelForCausalLM.from_pretrained(
                p, dtype=dtype or "auto", use_safetensors=True, output_loading_info=True
            )
    except LOAD_ERRORS as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise UserError(
            f"cannot load the {config.get('model_type', 'unknown')} model in {p} ({first}); {fix}"
        ) from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:  # transformers would leave them randomly initialised
        raise UserError(
            f"{p} has no tensor {missing[0]} (and {len(missing) - 1} more) that its config.json's model "
            "needs: an incomplete download, or a quantized checkpoint whose config.json lost its "
            f"`quantization_config`; {fix}"
        )
    return model.eval()
