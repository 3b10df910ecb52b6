"""Reading files other people made (JSON, safetensors), which may be damaged or hostile: every failure becomes one
`UserError` naming the file and what to do, never a parser's exception.

safetensors parses its JSON header and checks that the tensors' byte ranges tile the file exactly ("incomplete
metadata", "invalid header length", ...); it never unpickles. These helpers turn its errors into one line, and check
that what was read is what the caller expects (present, dtype, shape) before anything uses it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from .errors import UserError

_PARSE_ERRORS = (SafetensorError, ValueError, TypeError, RuntimeError, OverflowError, OSError, UnicodeDecodeError)


def read_json(path: str | Path, fix: str = "re-create it") -> dict:
    """A JSON object from a UTF-8 file."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{p} is missing; {fix}") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:  # json.JSONDecodeError is a ValueError
        raise UserError(f"{p} is not readable JSON ({str(e)[:200]}); {fix}") from None
    if not isinstance(data, dict):
        raise UserError(f"{p} holds a JSON {type(data).__name__}, not an object; {fix}")
    return data


def _damaged(path: Path, err: BaseException, fix: str) -> UserError:
    reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    return UserError(f"{path} is not a complete safetensors file ({reason}); {fix}")


def read_tensors(
    path: str | Path, fix: str = "re-create or re-download it", keep: Callable[[str], bool] | None = None
) -> dict[str, torch.Tensor]:
    """All tensors of one safetensors file, or only those whose name `keep` accepts (the others are not read)."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p} is missing; {fix}")
    try:
        if keep is None:
            return load_file(str(p))
        with safe_open(str(p), "pt") as f:
            return {k: f.get_tensor(k) for k in f.keys() if keep(k)}
    except _PARSE_ERRORS as e:
        raise _damaged(p, e, fix) from None


def read_header(path: str | Path, fix: str = "re-create or re-download it") -> dict[str, tuple[str, tuple[int, ...]]]:
    """{name: (safetensors dtype, shape)} from the header alone, after safetensors' own consistency checks."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p} is missing; {fix}")
    try:
        with safe_open(str(p), "pt") as f:
            return {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()}
    except _PARSE_ERRORS as e:
        raise _damaged(p, e, fix) from None


def read_sharded(
    index: str | Path, fix: str = "re-create or re-download it", keep: Callable[[str], bool] | None = None
) -> dict[str, torch.Tensor]:
    """All tensors (or those `keep` accepts) of a sharded safetensors directory: Hugging Face's
    `*.safetensors.index.json`, whose `weight_map` names each tensor's file. Every named file must be a plain
    .safetensors name in the index's directory and hold exactly the tensors mapped to it: a missing, extra or moved
    tensor is damage, never a silent mix of files."""
    p = Path(index)
    weight_map = read_json(p, fix).get("weight_map")
    ok = (
        isinstance(weight_map, dict)
        and weight_map
        and all(isinstance(f, str) and Path(f).name == f and f.endswith(".safetensors") for f in weight_map.values())
    )
    if not ok:
        raise UserError(f"{p}: `weight_map` must map tensor names to .safetensors files in its directory; {fix}")
    out: dict[str, torch.Tensor] = {}
    for name in sorted(set(weight_map.values())):
        tensors = read_tensors(p.parent / name, fix, keep)
        expected = {k for k, f in weight_map.items() if f == name}
        if (set(tensors) if keep is None else set(read_header(p.parent / name, fix))) != expected:
            odd = sorted(set(tensors) ^ expected)[0]
            raise UserError(f"{p.parent / name} does not hold the tensors {p.name} maps to it (e.g. {odd}); {fix}")
        out.update(tensors)
    return out


def read_model_weights(directory: str | Path, fix: str = "re-create or re-download it") -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face model directory: sharded (model.safetensors.index.json, `read_sharded`) or
    its .safetensors files; no safetensors is an error (nothing else is ever read)."""
    p = Path(directory)
    if (p / "model.safetensors.index.json").is_file():
        return read_sharded(p / "model.safetensors.index.json", fix)
    files = sorted(f.name for f in p.glob("*.safetensors"))
    if not files:
        raise UserError(f"{p} has no .safetensors weights; matgptq reads only safetensors (never pickles)")
    return {k: v for f in files for k, v in read_tensors(p / f, fix).items()}


def take(
    raw: dict[str, torch.Tensor],
    key: str,
    dtype: torch.dtype,
    shape: tuple[int | None, ...],
    where: Path,
    optional: bool = False,
) -> torch.Tensor | None:
    """Remove `key` from `raw` and check its dtype and shape (None: any positive size on that axis); a missing tensor
    is an error unless `optional`."""
    t = raw.pop(key, None)
    if t is None:
        if optional:
            return None
        raise UserError(f"{where}: tensor {key} is missing; the checkpoint is incomplete, re-create it")
    fits = t.dim() == len(shape) and all(s == d if s is not None else d > 0 for s, d in zip(shape, t.shape))
    if t.dtype != dtype or not fits:
        raise UserError(
            f"{where}: tensor {key} is {str(t.dtype).removeprefix('torch.')} {list(t.shape)}, expected "
            f"{str(dtype).removeprefix('torch.')} {[d if d is not None else 'any' for d in shape]}; the checkpoint is "
            "damaged, re-create it"
        )
    return t
