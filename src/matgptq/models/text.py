"""Calibration and evaluation text: read a file (or take strings), cut a character range, tokenize, make windows."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from ..errors import UserError


def read_text(path: str | Path, text_range: tuple[float, float] = (0.0, 1.0)) -> str:
    """The characters [start·len, end·len) of a UTF-8 text file."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"text file not found: {p}; give the path of a UTF-8 text file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{p} is not UTF-8 text ({e.reason}); convert it or give another file") from None
    a, b = text_range
    text = text[int(a * len(text)) : int(b * len(text))]
    if not text.strip():
        raise UserError(f"{p} has no text in the range {a}:{b}; give a non-empty file or a wider range")
    return text


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tokenize(tokenizer, texts: str | list[str]) -> torch.Tensor:
    """One long token stream (1-D int64); a list of texts is joined with blank lines, as the data files are."""
    text = texts if isinstance(texts, str) else "\n\n".join(texts)
    return torch.tensor(tokenizer(text)["input_ids"], dtype=torch.int64)


def calibration_windows(tokens: torch.Tensor, nsamples: int, seqlen: int, seed: int) -> torch.Tensor:
    """`nsamples` windows of `seqlen` tokens starting at uniformly random offsets (torch generator seeded with `seed`)."""
    if tokens.numel() < nsamples * seqlen:
        raise UserError(
            f"the calibration text has {tokens.numel():,} tokens, fewer than the {nsamples * seqlen:,} that --nsamples "
            f"{nsamples} × --seqlen {seqlen} ask for; give more text (or a wider --calib-range) or lower "
            "--nsamples/--seqlen"
        )
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, tokens.numel() - seqlen + 1, (nsamples,), generator=gen, device=gen.device)
    return torch.stack([tokens[s : s + seqlen] for s in starts.tolist()])


def eval_windows(tokens: torch.Tensor, seqlen: int, max_tokens: int | None = None) -> torch.Tensor:
    """Non-overlapping windows [n, seqlen] over the first `max_tokens` tokens (a partial last window is dropped)."""
    if max_tokens is not None:
        tokens = tokens[:max_tokens]
    n = tokens.numel() // seqlen
    if n == 0:
        raise UserError(f"the evaluation text has {tokens.numel()} tokens, fewer than one window of {seqlen}")
    return tokens[: n * seqlen].view(n, seqlen)
