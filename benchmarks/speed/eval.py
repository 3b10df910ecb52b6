"""Benchmark (not a test): `matgptq eval --kl-to` before and after the streamed teacher, one run.

Runs the same command with the code of a baseline revision (default: the commit before "Stream perplexity and KL",
which held the reference's log-probabilities for every token in memory) and with this checkout, once for one width
and once for several widths of one parent, each in its own child process (wall, CPU user+sys and peak RSS from
os.wait4, started from a small launcher: benchmarks/_harness/: run_measured). Prints the measurements side by side
with the ratios, and the perplexity and KL each version computed (the streamed KL is exact: it must agree with the
all-at-once one to float32 rounding of the summation, ~1e-6 relative).

    python -m benchmarks.speed.eval CHECKPOINT --kl-to MODEL_DIR --text FILE [--text-range 0:0.5] [--seqlen 512]
        [--max-tokens 40000] [--widths 4 --widths 3,4,6,8] [--baseline REV] [--threads 2] [--json FILE]

CHECKPOINT must be a parent (or any checkpoint `--bits` can slice) for the several-widths run. With --json FILE the
measurements go to FILE and the page rendered from them alone beside it (FILE with .md; the recorded run is
docs/results/bench_eval.{json,md}, re-rendered by `python -m benchmarks.render_docs`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks._harness import ROOT, header, load_json, run_measured, write_page

BASELINE = "e9c446c"  # the parent of 7d9f977 "Stream perplexity and KL"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="matgptq checkpoint or parent to evaluate")
    p.add_argument("--kl-to", required=True, help="the unquantized reference model directory")
    p.add_argument("--text", required=True, help="evaluation text file")
    p.add_argument("--text-range", default="0:0.5", help="character range START:END of --text")
    p.add_argument("--seqlen", type=int, default=512, help="tokens per window")
    p.add_argument("--max-tokens", type=int, default=40000, help="evaluated tokens")
    p.add_argument("--batch-size", type=int, default=4, help="windows per forward pass, the same for both versions")
    p.add_argument("--widths", action="append", help="a --bits value per run (repeatable; default: 4, then 3,4,6,8)")
    p.add_argument("--baseline", default=BASELINE, help="git revision of the code to compare against")
    p.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of every run")
    p.add_argument("--json", help="write the measurements here")
    a = p.parse_args()
    widths = a.widths or ["4", "3,4,6,8"]
    with tempfile.TemporaryDirectory(prefix="bench-eval-") as tmp:
        base_tree = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base_tree), a.baseline], check=True
        )
        try:
            runs = [
                (version, src, w)
                for w in widths
                for version, src in (("baseline " + a.baseline, base_tree / "src"), ("this checkout", ROOT / "src"))
            ]
            results = [measure(*run, a, Path(tmp) / f"run{i}.json") for i, run in enumerate(runs)]
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)], check=False)
    data = {"args": vars(a), "load_average": os.getloadavg()[0], "results": results}
    print(tables(data))
    if a.json:
        Path(a.json).write_text(json.dumps(data, indent=2))
        write_page(Path(a.json).with_suffix(".md"), page(load_json(Path(a.json))))


def page(data: dict) -> str:
    """docs/results/bench_eval.md from its JSON."""
    return "\n".join(
        [
            header("benchmarks/speed/eval.py", "bench_eval.json"),
            "# `matgptq eval --kl-to`: the streamed teacher against the all-at-once baseline",
            "",
            tables(data),
        ]
    )


def tables(data: dict) -> str:
    """The run's settings, one row per (code, --bits) run, and the ratios now / baseline."""
    a, results = data["args"], data["results"]
    load = f", load average {data['load_average']:.2f}" if "load_average" in data else ""
    lines = [
        f"{a['checkpoint']} vs {a['kl_to']}: {a['max_tokens']} tokens of {a['text']} [{a['text_range']}], "
        f"seqlen {a['seqlen']}, batch {a['batch_size']}, {a['threads']} threads{load}",
        "",
        "| code | --bits | wall s | CPU s | peak RSS GB | per width: ppl / KL |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        scores = "; ".join(f"{s['bits']}: {s['ppl']:.4f} / {s['kl']:.6f}" for s in r["scores"])
        lines.append(
            f"| {r['version']} | {r['widths']} | {r['wall']:.0f} | {r['cpu']:.0f} | {r['rss_gb']:.2f} | {scores} |"
        )
    lines += [
        "",
        "| --bits | wall: now / baseline | CPU: now / baseline | peak RSS: now / baseline | max rel. KL difference |",
        "|---|---|---|---|---|",
    ]
    for old, new in zip(results[::2], results[1::2]):
        dkl = max(abs(n["kl"] - o["kl"]) / o["kl"] for o, n in zip(old["scores"], new["scores"]))
        lines.append(
            f"| {new['widths']} | {new['wall'] / old['wall']:.2f} | {new['cpu'] / old['cpu']:.2f} | "
            f"{new['rss_gb'] / old['rss_gb']:.3f} | {dkl:.1e} |"
        )
    return "\n".join(lines) + "\n"


def measure(version: str, src: Path, widths: str, a: argparse.Namespace, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "matgptq",
        "eval",
        a.checkpoint,
        "--bits",
        widths,
        "--kl-to",
        a.kl_to,
        "--text",
        a.text,
        "--text-range",
        a.text_range,
        "--seqlen",
        str(a.seqlen),
        "--max-tokens",
        str(a.max_tokens),
        "--batch-size",
        str(a.batch_size),
        "--json",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": str(a.threads)}
    usage = run_measured(cmd, env, out.with_suffix(".log"))
    if not usage["ok"]:  # the child's last line (matgptq's own one-line error, or the exception) names the problem
        lines = [ln for ln in out.with_suffix(".log").read_text(errors="replace").splitlines() if ln.strip()]
        sys.exit(f"bench_eval: {version}, --bits {widths} failed: {lines[-1] if lines else 'no output'}")
    print(
        f"  {version}, --bits {widths}: wall {usage['wall']:.0f} s, CPU {usage['cpu']:.0f} s, "
        f"peak RSS {usage['rss_gb']:.2f} GB",
        flush=True,
    )
    return {"version": version, "widths": widths, **usage, "scores": json.loads(out.read_text())["results"]}


if __name__ == "__main__":
    main()
