"""The search's cost against the model's depth on a GPU (issue #44 item 3): `matgptq search` of issue #44's eight
budgets under one --time-limit on Llama-3.1-8B-shaped random parents of several depths (default 2 and 8 blocks), so
that what a 32-block (8B) search costs is a straight line through measured points rather than a guess.

Per depth, each step a child with a timeout: the random model (benchmarks/gpu/_random_llama.py, drawn on the device), a
MatGPTQ (3, 4, 8) parent of it (`matgptq quantize`, 64 x 512 calibration tokens; how the parent was made does not
change what the search costs), then the search (_search.measure_search_run, the CLI's own clocks). From
each mix file: the teacher's and the one-shot tables' seconds, the widths the tables reached under the deadline
(`sensitivity_levels`), and the evolution's seconds per generation (its history's last clock over its generations).

    python -m benchmarks.gpu.search_scale [--blocks 2,8] [--minutes 1.25] [--out DIR] [--work DIR]

writes gpu_search_scale.json into --out (default: --work) after every depth (a run cut short keeps the depths it
finished) and prints it; its depths go into docs/results/gpu.json by hand, as "search_scale" with a line in its "runs"
(gpu/_report.py renders them). Without CUDA the same code runs on tiny shapes on the CPU (llama-tiny, a few
generations); its seconds mean nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks._harness import write_atomic
from benchmarks.gpu._children import CLI_CHILD
from benchmarks.gpu._quantize import FULL, TINY, _build, _child, _inputs
from benchmarks.gpu._search import measure_search_run

CUDA = torch.cuda.is_available()
LINEARS_PER_BLOCK = 7  # q, k, v, o, gate, up, down


def _parent(work: Path, blocks: int, tiny: bool, timeout_s: float) -> tuple[Path, dict]:
    """A MatGPTQ (3, 4, 8) parent of a random `blocks`-deep model under `work`: its path and what it cost."""
    tok, calib, why = _inputs(tiny)
    if why is not None:
        raise RuntimeError(why)
    device = "cpu" if tiny else "cuda"
    model, build_s, _ = _build(TINY if tiny else FULL, work, tok, device, blocks)
    parent = work / f"parent-{blocks}l"
    cmd = [
        "quantize",
        str(model),
        "--method",
        "matgptq",
        "--bits",
        "3,4,8",
        "--calib",
        str(calib),
        "--calib-range",
        "0:0.3",
        "--nsamples",
        "4" if tiny else "64",
        "--seqlen",
        "32" if tiny else "512",
        "--device",
        device,
        "--out",
        str(parent),
        "--overwrite",
        "--quiet",
    ]
    child = _child(CLI_CHILD, cmd, timeout_s)
    if child["error"]:
        raise RuntimeError(f"quantize: {child['error']}")
    return parent, {"build_s": round(build_s, 2), "quantize_s": round(child["seconds"], 2)}


def _from_mixes(folder: Path) -> list[dict]:
    """Per budget, from its mix file: the widths the tables reached and the evolution's seconds per generation."""
    rows = []
    for path in folder.glob("mix-*.json"):
        mix = json.loads(path.read_text())
        s, history = mix.get("summary", {}), mix.get("history", [])
        gens = len(history)
        rows.append(
            {
                "budget": s.get("budget"),
                "code_bits": s.get("code_bits"),
                "sensitivity_levels": s.get("sensitivity_levels"),
                "generations": gens,
                "evaluations": history[-1]["evaluations"] if gens else 0,
                "s_per_generation": round(history[-1]["seconds"] / gens, 3) if gens else None,
                "tokens_per_generation": round(history[-1]["tokens"] / gens) if gens else None,
            }
        )
    return sorted(rows, key=lambda r: r["code_bits"] or 0.0)


def measure_depth(work: Path, blocks: int, tiny: bool, minutes: float) -> dict:
    """One depth: the parent's cost, the search run's rows (_search.ROW_KEYS) and _from_mixes' rows."""
    res = {"blocks": blocks, "layers": blocks * LINEARS_PER_BLOCK, "ok": False, "error": None}
    t0 = time.perf_counter()
    try:
        parent, made = _parent(work, blocks, tiny, 60.0 if tiny else 120.0)
    except Exception as e:  # noqa: BLE001 - recorded: the next depth still measures
        return {**res, "error": f"{type(e).__name__}: {e}"[-2000:]}
    run = measure_search_run(work / f"d{blocks}", parent, tiny, minutes * 60 + 60, minutes)
    mixes = {r["budget"]: r for r in _from_mixes(work / f"d{blocks}" / "search-run")}
    rows = [{**r, **mixes.get(r["budget"], {})} for r in run["rows"]]
    return {
        **res,
        **made,
        "ok": run["ok"],
        "error": run["error"],
        "search_wall_s": run["wall_s"],
        "time_limit_min": run["time_limit_min"],
        "command": run.get("command"),
        "rows": rows,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", default="2,8", help="comma-separated depths in decoder blocks (default 2,8)")
    ap.add_argument("--minutes", type=float, default=1.25, help="the search's --time-limit at every depth")
    ap.add_argument("--out", type=Path, help="where gpu_search_scale.json goes (the device's $OUT; default --work)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/matgptq-search-scale"), help="scratch folder for models")
    a = ap.parse_args(argv)
    try:
        depths = [int(b) for b in a.blocks.split(",") if b]
    except ValueError:
        ap.error(f"--blocks {a.blocks}: use whole numbers, comma-separated, such as 2,8")
    if not depths or min(depths) < 1 or a.minutes <= 0:
        ap.error("--blocks needs depths of at least 1 block, and --minutes a positive number")
    import transformers

    result = {
        "device": torch.cuda.get_device_name() if CUDA else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "minutes": a.minutes,
        "depths": [],
    }
    a.out = a.out or a.work
    a.work.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    for blocks in depths:
        print(f"gpu_search_scale: {blocks} blocks ...", flush=True)
        result["depths"].append(measure_depth(a.work, blocks, not CUDA, a.minutes))
        write_atomic(a.out / "gpu_search_scale.json", json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    failed = [d["blocks"] for d in result["depths"] if d["error"]]
    if failed:
        print(f"gpu_search_scale: the depths {failed} failed (their errors are in the JSON)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
