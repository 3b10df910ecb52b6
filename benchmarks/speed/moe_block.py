"""Benchmark (issue #43 item 4): the time to quantize a mixture-of-experts block against a dense block with the same
active parameters, on random models as the pinned transformers builds them, in one run.

  moe     qwen3_moe: --experts experts of intermediate width --moe-width, --top-k routed per token
  dense   qwen3 with intermediate width top-k × --moe-width: the same attention and the same parameters per token
Both: hidden --hidden, --blocks blocks, stories260K's tokenizer (vocab 512), random weights (seed 0). Each is
quantized by `matgptq quantize --method gptq --bits 4 --group-size 128` on the same --nsamples × --seqlen TinyStories
windows, one measured child process each (benchmarks/_harness/: wall, CPU and the child's own peak RSS); the
solver's seconds come from the checkpoint's report. Printed: per block, the MoE's time over the dense one's. The MoE
block solves experts × 2 matrices where the dense one solves 2 (its Hessians come from the routed tokens only), so
the ratio shows what the per-expert solve costs beyond the active parameters.

    python -m benchmarks.speed.moe_block [--experts 16] [--top-k 2] [--hidden 512] [--moe-width 256] [--blocks 8]
        [--nsamples 32] [--seqlen 256] [--threads 2] [--json docs/results/bench_moe_block.json]

Writes the JSON and, beside it, its page (FILE with .md; `python -m benchmarks.render_docs` re-renders it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from benchmarks._harness import RESULTS, ROOT, child_env, format_table, header, last_error, run_measured, write_page

SHARED = ROOT.parent / "shared"
STORIES = SHARED / "models" / "stories260K"
TEXT = SHARED / "data" / "tinystories" / "tinystories_val_head.txt"


def build(path: Path, model_type: str, a: argparse.Namespace) -> Path:
    """A random `model_type` model (module docstring) with stories260K's tokenizer, saved as safetensors."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    common = dict(
        vocab_size=512,
        hidden_size=a.hidden,
        num_hidden_layers=a.blocks,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=a.hidden // 8,
        max_position_embeddings=a.seqlen,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    extra = (
        dict(
            num_experts=a.experts,
            num_experts_per_tok=a.top_k,
            moe_intermediate_size=a.moe_width,
            intermediate_size=a.top_k * a.moe_width,
        )
        if model_type == "qwen3_moe"
        else dict(intermediate_size=a.top_k * a.moe_width)
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **common, **extra))
    model.save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(STORIES / name, path / name)
    return path


def quantize(model: Path, out: Path, a: argparse.Namespace) -> dict:
    """One measured `matgptq quantize` of `model`: wall, CPU, peak RSS, the solver's seconds, the layer count."""
    import sys

    cmd = [
        sys.executable,
        "-m",
        "matgptq",
        "quantize",
        str(model),
        "--out",
        str(out),
        "--method",
        "gptq",
        "--bits",
        "4",
        "--group-size",
        "128",
        "--calib",
        str(TEXT),
        "--calib-range",
        "0.6:1",
        "--nsamples",
        str(a.nsamples),
        "--seqlen",
        str(a.seqlen),
        "--seed",
        "0",
        "--quiet",
    ]
    log = out.with_suffix(".log")
    usage = run_measured(cmd, child_env(a.threads), log)
    if not usage["ok"]:
        raise SystemExit(f"bench_moe_block: error: quantizing {model.name} failed: {last_error(log)}")
    report = json.loads((out / "matgptq.json").read_text())["report"]
    return {**usage, "solver": sum(r["seconds"] for r in report), "layers": len(report)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, default=16, help="experts per MoE block")
    ap.add_argument("--top-k", type=int, default=2, help="experts routed per token")
    ap.add_argument("--hidden", type=int, default=512, help="hidden size of both models")
    ap.add_argument("--moe-width", type=int, default=256, help="intermediate width of one expert")
    ap.add_argument("--blocks", type=int, default=8, help="decoder blocks of both models")
    ap.add_argument("--nsamples", type=int, default=32, help="calibration windows")
    ap.add_argument("--seqlen", type=int, default=256, help="tokens per calibration window")
    ap.add_argument("--threads", type=int, default=2, help="threads of each quantization")
    ap.add_argument("--json", default=str(RESULTS / "bench_moe_block.json"), help="the measurements (its page beside)")
    a = ap.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, model_type in (("dense", "qwen3"), ("moe", "qwen3_moe")):
            model = build(Path(tmp) / kind, model_type, a)
            rows[kind] = quantize(model, Path(tmp) / f"{kind}-q", a)
    import os

    data = {"args": {k: v for k, v in vars(a).items() if k != "json"}, "load_average": os.getloadavg()[0], "rows": rows}
    Path(a.json).write_text(json.dumps(data, indent=1))
    write_page(Path(a.json).with_suffix(".md"), page(data))
    print(page(data))


def page(data: dict) -> str:
    """The page of bench_moe_block.json: per block, each model's cost and the MoE's over the dense one's."""
    a, rows = data["args"], data["rows"]
    d, m = rows["dense"], rows["moe"]
    blocks = a["blocks"]
    table = [
        [
            k,
            r["layers"],
            f"{r['wall'] / blocks:.2f}",
            f"{r['cpu'] / blocks:.2f}",
            f"{r['solver'] / blocks:.2f}",
            f"{r['rss_gb']:.2f}",
        ]
        for k, r in rows.items()
    ]
    return "\n".join(
        [
            header("benchmarks/speed/moe_block.py", "bench_moe_block.json"),
            "# Quantizing a mixture-of-experts block against a dense block of the same active parameters",
            "",
            "```",
            __doc__.strip(),
            "```",
            "",
            f"qwen3_moe: {a['experts']} experts of width {a['moe_width']}, top-{a['top_k']}; qwen3: intermediate width "
            f"{a['top_k'] * a['moe_width']}; hidden {a['hidden']}, {blocks} blocks; {a['nsamples']} x {a['seqlen']} "
            f"calibration tokens; {a['threads']} threads; load average {data['load_average']:.2f} at the end.",
            "",
            format_table(
                ["model", "quantized layers", "wall s / block", "CPU s / block", "solver s / block", "peak RSS GB"],
                table,
            ),
            "",
            f"MoE / dense per block: wall {m['wall'] / d['wall']:.2f}x, CPU {m['cpu'] / d['cpu']:.2f}x, solver "
            f"{m['solver'] / d['solver']:.2f}x.",
        ]
    )


if __name__ == "__main__":
    main()
