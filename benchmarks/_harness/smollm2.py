"""The SmolLM2-135M-Instruct protocol the benchmarks on the real model share (benchmarks/quality/real_model_table.py's
Table 1, quality/gptq_defaults.py, search/real_model.py, gguf/*, speed/pipeline.py): where the model and the texts
are, the peers' venv, one child that quantizes with a peer, and the scoring of a checkpoint's widths.

  model         the float32 reference `make real-model` writes into $MATGPTQ_CACHE (default ~/.cache/matgptq)
  calibration   the second half (by characters) of WikiText-2 test; perplexity on the first half (never calibrated on)
  peers         GPTQModel and llm-compressor in .venv-bench (`make bench-venv`), driven by benchmarks/_harness/peers.py
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from benchmarks._harness import ROOT

SHARED = ROOT.parent / "shared"
WIKI = SHARED / "data" / "wikitext-2-raw" / "wiki.test.joined.txt"
ZERO_SHOT = SHARED / "data" / "zero-shot"
BENCH_PYTHON = ROOT / ".venv-bench" / "bin" / "python"
DEFAULT_MODEL = Path(os.environ.get("MATGPTQ_CACHE", Path.home() / ".cache" / "matgptq")) / "SmolLM2-135M-Instruct"


def peer_command(
    tool: str, model: str | Path, ids_file: Path, out: Path, bits: int, group_size: int, report: Path
) -> list[str]:
    """The child that quantizes `model` with the peer `tool` (peers.TOOLS) on the token ids in `ids_file` into `out`,
    its stage seconds into `report`, run by the bench venv's python."""
    return [
        str(BENCH_PYTHON),
        "-m",
        "benchmarks._harness.peers",
        tool,
        str(model),
        "--ids",
        str(ids_file),
        "--out-model",
        str(out),
        "--bits",
        str(bits),
        "--group-size",
        str(group_size),
        "--report",
        str(report),
    ]


def evaluate(
    path: Path | str, widths, windows, teacher, specs, limit: int, tokenizer, parent: bool | None = None
) -> dict:
    """Perplexity, KL and zero-shot accuracy (`specs`' tasks, their first `limit` questions) of every width of one
    checkpoint, after one load. `parent`: slice `widths` (widths or mix files) out of it; default: when there are
    several."""
    import torch

    from matgptq.evaluation.perplexity import score
    from matgptq.evaluation.tasks import score_tasks, with_average, wrap_model
    from matgptq.runtime import load, set_bits

    parent = len(widths) > 1 if parent is None else parent  # else the checkpoint as it is
    # float32 whatever the checkpoint stores (bf16-calibrated ones keep bf16 embeddings): every row computes alike
    model = load(path, bits=widths[0] if parent else None, dtype=torch.float32)
    lm = wrap_model(model, tokenizer, 16) if specs else None
    out = {}
    for bits in widths:
        if parent:
            set_bits(model, bits)
        t0 = time.perf_counter()
        sc = score(model, windows, teacher, batch_size=1, progress=True, desc=f"{Path(path).name} {bits}")
        tasks = with_average(score_tasks(lm, specs, limit)) if specs else {}
        out[str(bits)] = {
            "ppl": sc.ppl,
            "kl": sc.kl,
            "tokens": sc.tokens,
            "tasks": tasks,
            "eval_seconds": time.perf_counter() - t0,
        }
    return out
