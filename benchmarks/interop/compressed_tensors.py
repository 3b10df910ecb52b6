"""Comparison (not a test): does our compressed-tensors export have the layout llm-compressor 0.14 writes?

For each scheme, stories260K is quantized twice, round-to-nearest on both sides: by llm-compressor
(QuantizationModifier, data-free) and by matgptq (`quantize --method rtn`, then `export --format compressed-tensors`).
Layers whose 172 columns no group of 32 divides (down_proj) are left out on both sides (llm-compressor refuses
them): `ignore` there, `--skip` here. Compared: the safetensors keys, dtypes and shapes, and
config.json's `quantization_config` key by key (values that legitimately differ are listed, not hidden: targets
["Linear"] vs exact names, the observer llm-compressor used). Weights are not compared: the two RTNs choose
different scales. Then transformers reads both (so the llm-compressor checkpoint is also a sanity check of the
reader in this venv). Needs llm-compressor 0.14, i.e. transformers <= 5.17: run it in .venv-bench (`make bench-venv`):

    PYTHONPATH=src .venv-bench/bin/python -m benchmarks.interop.compressed_tensors [--out docs/results/ct_vs_llmcompressor.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import warnings
from pathlib import Path

import torch
from safetensors import safe_open

from benchmarks._harness import RESULTS, ROOT, header, write_page

STORIES = ROOT.parent / "shared" / "models" / "stories260K"
SCHEMES = [  # (bits, symmetric, group size or -1 = per channel)
    (4, True, 32),
    (3, False, 32),
    (8, True, -1),
    (6, False, -1),
]


def llmcompressor_checkpoint(out: Path, bits: int, sym: bool, group: int) -> Path:
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(STORIES, dtype=torch.float32)
    strategy = dict(strategy="group", group_size=group) if group > 0 else dict(strategy="channel")
    weights = QuantizationArgs(num_bits=bits, type="int", symmetric=sym, **strategy)
    ignore = ["lm_head"] + (["re:.*down_proj$"] if group > 0 and 172 % group else [])
    recipe = QuantizationModifier(
        config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=weights)}, ignore=ignore
    )
    oneshot(model=model, recipe=recipe)
    model.save_pretrained(out, save_compressed=True)
    AutoTokenizer.from_pretrained(STORIES).save_pretrained(out)
    return out


def matgptq_checkpoint(out: Path, bits: int, sym: bool, group: int) -> Path:
    import matgptq
    from matgptq.exporters.compressed_tensors import export_compressed_tensors

    skip = ("down_proj$",) if group > 0 and 172 % group else ()
    parent, _ = matgptq.quantize(
        STORIES,
        out.with_name(out.name + "-parent"),
        method="rtn",
        bits=bits,
        sym=sym,
        group_size=group,
        skip=skip,
        progress=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the reader notes on asymmetric layers (the test file checks them)
        return export_compressed_tensors(parent, out)


def tensors(path: Path) -> dict[str, list]:
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {k: [str(f.get_slice(k).get_dtype()), list(f.get_slice(k).get_shape())] for k in sorted(f.keys())}


def diff_json(a, b, where="") -> list[str]:
    """Every place two JSON values differ: missing keys, different types, different values."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}/{k}: only in llm-compressor" for k in sorted(set(a) - set(b))]
        out += [f"{where}/{k}: only in matgptq" for k in sorted(set(b) - set(a))]
        return out + [d for k in sorted(set(a) & set(b)) for d in diff_json(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff_json(x, y, f"{where}/{i}")]
    return [] if a == b else [f"{where}: llm-compressor {json.dumps(a)} vs matgptq {json.dumps(b)}"]


def normalised(qc: dict) -> dict:
    """The config with group names and targets set aside (compared separately) so the layout diff is readable."""
    qc = json.loads(json.dumps(qc))
    groups = list(qc.pop("config_groups").values())
    for g in groups:
        g.pop("targets")
    qc["config_groups"] = groups
    return qc


def transformers_reads(path: Path) -> bool:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        return bool(torch.isfinite(model(torch.arange(1, 17)[None]).logits).all())


def compare(base: Path, bits: int, sym: bool, group: int) -> dict:
    name = f"{bits}bit-{'sym' if sym else 'asym'}-{'g' + str(group) if group > 0 else 'channel'}"
    theirs = llmcompressor_checkpoint(base / f"llmc-{name}", bits, sym, group)
    ours = matgptq_checkpoint(base / f"matgptq-{name}", bits, sym, group)
    t_theirs, t_ours = tensors(theirs), tensors(ours)
    cfg_theirs, cfg_ours = (json.loads((p / "config.json").read_text()) for p in (theirs, ours))
    qc_theirs, qc_ours = cfg_theirs.pop("quantization_config"), cfg_ours.pop("quantization_config")
    targets = {k: sorted(g["targets"]) for k, g in qc_theirs["config_groups"].items()}
    ours_targets = {k: sorted(g["targets"]) for k, g in qc_ours["config_groups"].items()}
    return {
        "scheme": name,
        "same_tensor_keys": sorted(t_theirs) == sorted(t_ours),
        "only_llmcompressor": sorted(set(t_theirs) - set(t_ours)),
        "only_matgptq": sorted(set(t_ours) - set(t_theirs)),
        "dtype_or_shape_differs": {
            k: {"llmcompressor": t_theirs[k], "matgptq": t_ours[k]}
            for k in sorted(set(t_theirs) & set(t_ours))
            if t_theirs[k] != t_ours[k]
        },
        "tensors_per_layer": {k.rsplit(".", 1)[1]: v for k, v in t_ours.items() if ".layers.0.mlp.up_proj." in k},
        "config_differences": diff_json(normalised(qc_theirs), normalised(qc_ours)),
        "model_config_differences": diff_json(cfg_theirs, cfg_ours),
        "targets": {"llmcompressor": targets, "matgptq": ours_targets},
        "same_ignore": sorted(qc_theirs["ignore"]) == sorted(qc_ours["ignore"]),
        "files": {
            "llmcompressor": sorted(p.name for p in theirs.iterdir()),
            "matgptq": sorted(p.name for p in ours.iterdir()),
        },
        "transformers_reads": {"llmcompressor": transformers_reads(theirs), "matgptq": transformers_reads(ours)},
    }


def page(data: dict) -> str:
    """The results page, from the JSON `main` writes."""
    v = data["versions"]
    lines = [
        header("benchmarks/interop/compressed_tensors.py", "ct_vs_llmcompressor.json"),
        "# compressed-tensors export against llm-compressor's own checkpoints",
        "",
        f"{data['what']}; llm-compressor {v['llmcompressor']}, compressed-tensors {v['compressed_tensors']}, "
        f"transformers {v['transformers']}. Round-to-nearest on both sides (the weights differ: each side chose "
        "its own scales); compared: tensor keys, dtypes and shapes, `quantization_config`, `ignore`, and whether "
        "transformers loads each checkpoint.",
        "",
        "| scheme | same tensor keys | dtype or shape differs | same ignore | quantization_config differs | "
        "transformers reads llm-compressor's / ours |",
        "|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        reads = r["transformers_reads"]
        diffs = "; ".join(r["config_differences"]) or "none"
        lines.append(
            f"| {r['scheme']} | {r['same_tensor_keys']} | {len(r['dtype_or_shape_differs']) or 'none'} | "
            f"{r['same_ignore']} | {diffs} | {reads['llmcompressor']} / {reads['matgptq']} |"
        )
    lines += [
        "",
        'Targets differ by design: llm-compressor writes `["Linear"]`, matgptq the exact module names (one '
        "config group per width for mixes). config.json outside `quantization_config` differs as the parent's "
        "own config.json does (transformers' full dump).",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "ct_vs_llmcompressor.json")
    args = ap.parse_args()
    import compressed_tensors
    import llmcompressor
    import transformers

    import matgptq

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [compare(Path(tmp), *s) for s in SCHEMES]
    result = {
        "what": "compressed-tensors pack-quantized checkpoints of stories260K: llm-compressor RTN vs matgptq export",
        "versions": {
            "llmcompressor": llmcompressor.__version__,
            "compressed_tensors": compressed_tensors.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "matgptq": matgptq.__version__,
            "python": platform.python_version(),
        },
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    write_page(RESULTS / "ct_vs_llmcompressor.md", page(result))
    for r in rows:
        print(
            f"{r['scheme']:>18}: same keys {r['same_tensor_keys']}, "
            f"dtype/shape diffs {len(r['dtype_or_shape_differs'])}"
            f", quantization_config diffs {r['config_differences']}, other config.json diffs "
            f"{r['model_config_differences']}, same ignore {r['same_ignore']}, reads {r['transformers_reads']}"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
