"""llama.cpp through its Python binding as gguf_vs_llamacpp.py drives it: per-window logits and the perplexity and KL
they give, the binding's quantizer, its C log redirected to a file, and a GGUF file's tensor types."""

from __future__ import annotations

import ctypes
import math
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


class LlamaCppScorer:
    """Logits of every position of each window from llama.cpp (one context, reset between windows)."""

    def __init__(self, path: Path, seqlen: int, threads: int):
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(path), n_ctx=seqlen, n_batch=seqlen, n_ubatch=seqlen, logits_all=True,
                         n_threads=threads, n_threads_batch=threads, verbose=False)  # fmt: skip

    def logits(self, window: list[int]) -> np.ndarray:
        self.llm.reset()
        self.llm.eval(window)
        return np.array(self.llm.scores[: len(window)], dtype=np.float32)

    def close(self) -> None:
        self.llm.close()


def score_llamacpp(path: Path, windows: torch.Tensor, ref: list[np.ndarray] | None, threads: int):
    """(ppl, KL(ref ‖ this), per-window log-probs) with llama.cpp logits; predicted positions 2..seqlen."""
    sc = LlamaCppScorer(path, windows.shape[1], threads)
    nll, kl, count, out = 0.0, 0.0, 0, []
    try:
        for i, w in enumerate(windows.tolist()):
            lp = log_softmax(sc.logits(w)[:-1])
            tgt = np.asarray(w[1:])
            nll -= lp[np.arange(len(tgt)), tgt].sum()
            if ref is not None:
                p = ref[i]
                kl += (np.exp(p) * (p - lp)).sum()
            else:
                out.append(lp.astype(np.float32))
            count += len(tgt)
    finally:
        sc.close()
    return math.exp(nll / count), (kl / count if ref is not None else 0.0), out


def llama_quantize(src: Path, dst: Path, ftype_name: str, threads: int) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype_name}")
    params.nthread = threads
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({ftype_name}) failed with {rc}")


@contextmanager
def stderr_to(path: Path):
    """Send the C library's stderr (llama.cpp's quantizer log) to a file."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "w") as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def gguf_types(path: Path) -> dict[str, str]:
    import gguf

    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


def type_summary(types: dict[str, str]) -> str:
    groups: dict[str, list[str]] = {}
    for name, typ in types.items():
        if name.endswith("norm.weight"):
            continue
        key = name.split(".")[-2] if name.startswith("blk.") else name.split(".")[0]
        groups.setdefault(typ, [])
        if key not in groups[typ]:
            groups[typ].append(key)
    return "; ".join(f"{t}: {','.join(v)}" for t, v in sorted(groups.items()))
