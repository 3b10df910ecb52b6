"""Speed of the search's fitness on a real parent: seconds per EvoPress generation (default settings, from the uniform
mix at the budget) for float32 and bfloat16 scoring, with and without the prefix cache, in one run, plus how far the
bfloat16 fitness is from float32's on the same candidates (issue #10 item 4; fitness.py).

Every configuration runs the same generations from the same seed (the first generation also builds the window terms
of the windows it draws, as a real search does). The agreement check scores the uniform mix and `--children` of its
mutations on 8 windows in both dtypes: the spread of the float32 scores, the spread of the differences, and the
Spearman correlation of the two rankings; and, for scale, how much the uniform mix's float32 KL moves between
8-window draws (what the search sees when a stage draws fresh windows).

    python -m research.bench_search PARENT --calib ../shared/data/wikitext-2-raw/wiki.test.joined.txt \\
        --calib-range 0.5:1 [--budget 3.0] [--generations 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

from matgptq.cli.argtypes import fraction_range as _range
from matgptq.execution import format_table
from matgptq.evaluation.teacher import Teacher
from matgptq.formats import read_checkpoint
from matgptq.models import eval_windows, load_tokenizer, read_text, tokenize
from matgptq.runtime import load
from matgptq.allocation import BudgetKind, CostModel, EvoConfig
from matgptq.allocation.evopress import evolve
from matgptq.allocation.fitness import Fitness
from matgptq.allocation.mutation import mutate


def _ranks(x: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(x)).astype(float)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("parent", help="a matgptq parent (quantize --method matgptq)")
    p.add_argument("--calib", required=True, help="calibration text")
    p.add_argument("--calib-range", type=_range, default=(0.0, 1.0), help="character range START:END of --calib")
    p.add_argument("--budget", default="3.0", help="code bits per weight; the search starts from the uniform mix")
    p.add_argument("--generations", type=int, default=2, help="generations timed per configuration")
    p.add_argument("--children", type=int, default=12, help="mutations scored in both dtypes for the agreement")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    ckpt = read_checkpoint(a.parent)
    levels = tuple(range(2, max(q.master_bits for q in ckpt.layers.values()) + 1))
    cost = CostModel.from_checkpoint(ckpt, levels)
    budget = Fraction(a.budget)
    ids = tokenize(load_tokenizer(a.parent), read_text(Path(a.calib), a.calib_range))
    calib = eval_windows(ids, 256, 65 * 256)  # the default pool: 16,384 scored tokens in windows of 256
    if calib.shape[0] < 65:
        p.error(f"--calib gives {calib.shape[0]} windows of 256 tokens; the default pool needs 65")
    teacher = Teacher(load(ckpt.meta["source_model"], packed=False), calib, 8)
    model = load(a.parent, bits=levels[-1], packed=False)
    uniform = max(r for r in levels if cost.fits(tuple(r for _ in cost.names), budget, BudgetKind.CODE))
    start = tuple(uniform for _ in cost.names)
    rows, tmp = [], Path(tempfile.mkdtemp())
    for dtype in (torch.float32, torch.bfloat16):
        for cached in (True, False):
            f = Fitness(model, teacher, calib, cost.names, compute_dtype=dtype)
            t0 = time.perf_counter()
            st = evolve(f, levels, cost.table(BudgetKind.CODE), cost.limit(budget, BudgetKind.CODE), start,
                        EvoConfig(generations=a.generations, prefix_cache=cached), tmp / f"{dtype}-{cached}.json", {})  # fmt: skip
            seconds = time.perf_counter() - t0
            rows.append([str(dtype).removeprefix("torch."), "yes" if cached else "no", a.generations,
                         round(seconds / a.generations, 1), round(st.evaluations / seconds, 3),
                         round(st.tokens / seconds), round(st.history[-1]["kl"], 5)])  # fmt: skip
            print(rows[-1], flush=True)
    base = rows[0][3]
    for r in rows:
        r.insert(4, f"{base / r[3]:.2f}x")
    print(format_table(["scoring", "prefix cache", "generations", "s / generation", "speed-up", "evaluations / s",
                        "tokens / s", "last generation's KL"], rows))  # fmt: skip

    index = {r: i for i, r in enumerate(levels)}
    rng = np.random.Generator(np.random.PCG64(1))
    parent = tuple(index[r] for r in start)
    kids = [mutate(parent, cost.table(BudgetKind.CODE), cost.limit(budget, BudgetKind.CODE), rng, 3)
            for _ in range(a.children)]  # fmt: skip
    mixes = [start] + [tuple(levels[i] for i in k) for k in kids if k is not None]
    windows = tuple(range(40, 48))
    scores = {dtype: [Fitness(model, teacher, calib, cost.names, compute_dtype=dtype).kl(m, windows) for m in mixes]
              for dtype in (torch.float32, torch.bfloat16)}  # fmt: skip
    x, y = np.array(scores[torch.float32]), np.array(scores[torch.bfloat16])
    rho = float(np.corrcoef(_ranks(x), _ranks(y))[0, 1])
    exact = Fitness(model, teacher, calib, cost.names)
    draws = np.array([exact.kl(start, tuple(range(w, w + 8))) for w in range(0, 64, 8)])
    print(f"\nagreement on {len(mixes)} mixes (the uniform {uniform}-bit mix and its mutations), windows 40-47: "
          f"float32 KL {x.mean():.4f}, spread (std) {x.std():.4f}; bfloat16 − float32: mean {(y - x).mean():+.5f}, "
          f"std {(y - x).std():.5f}; Spearman {rho:.3f}")  # fmt: skip
    print(f"window sampling: the uniform mix's float32 KL on the 8 disjoint 8-window draws 0-7, …, 56-63: std "
          f"{draws.std():.4f} (mean {draws.mean():.4f})")  # fmt: skip
    teacher.close()


if __name__ == "__main__":
    main()
