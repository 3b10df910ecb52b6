"""One quantization with GPTQ on token ids from a file, in a child process of its own: GPTQModel, llm-compressor or
matgptq's own Python entry points (the `matgptq` rows of benchmarks/speed/pipeline.py, with their stage seconds).
Run by the bench venv's python (smollm2.peer_command):

    .venv-bench/bin/python -m benchmarks._harness.peers TOOL MODEL_DIR --ids IDS.safetensors --out-model DIR
        --bits B --group-size G --report REPORT.json

TOOL: gptqmodel, gptqmodel-fp32, llmcompressor, or matgptq[-bf16|-348|-348-bf16] (speed/pipeline.py's docstring says
what each is); REPORT gets {stage: seconds} (matgptq's) or {}.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def worker(tool: str, model_dir: str, ids_file: str, out: str, bits: int, group_size: int) -> dict:
    import torch
    from safetensors.torch import load_file

    ids = load_file(ids_file)["ids"]
    if tool.startswith("matgptq"):
        return matgptq_worker(tool, model_dir, ids, out, bits, group_size)
    if tool in ("gptqmodel", "gptqmodel-fp32"):
        from gptqmodel import GPTQModel, QuantizeConfig

        qcfg = QuantizeConfig(bits=bits, group_size=group_size, sym=True, desc_act=False)
        model = GPTQModel.load(model_dir, qcfg, **({"dtype": torch.float32} if tool.endswith("fp32") else {}))
        model.quantize([{"input_ids": r.tolist(), "attention_mask": [1] * len(r)} for r in ids])
        model.save(out)
        return {}
    if tool == "llmcompressor":
        from datasets import Dataset
        from llmcompressor import oneshot
        from llmcompressor.modifiers.quantization import GPTQModifier
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
        data = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist()})
        weights = {"num_bits": bits, "type": "int", "symmetric": True, "strategy": "group", "group_size": group_size}
        ragged = any(m.in_features % group_size for m in model.modules() if isinstance(m, torch.nn.Linear))
        # a group size that does not divide every layer's columns (SmolLM2's 576 at g128): llm-compressor's own way
        # out, named in its error message; it quantizes the ragged last group, but compressed-tensors cannot pack
        # it, so the fake-quantized weights are saved dense (they are exactly the dequantized codes)
        recipe = GPTQModifier(
            config_groups={"g": {"targets": ["Linear"], "weights": weights}},
            ignore=["lm_head"],
            bypass_divisibility_checks=ragged,
        )
        oneshot(model=model, dataset=data, recipe=recipe, max_seq_length=ids.shape[1], num_calibration_samples=len(ids))
        model.save_pretrained(out, save_compressed=not ragged)
        AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
        return {}
    raise SystemExit(f"unknown tool {tool}")


def matgptq_worker(tool: str, model_dir: str, ids, out: str, bits: int, group_size: int) -> dict:
    import torch

    from matgptq.api import make_config, unquantized_tensors
    from matgptq.formats import save_checkpoint
    from matgptq.models import load_fp_model
    from matgptq.quantization.pipeline import quantize_model
    from matgptq.quantization.run import calibration_dtypes

    cfg = (
        make_config("matgptq", (3, 4, 8), group_size=group_size)
        if "348" in tool
        else make_config("gptq", bits, group_size=group_size)
    )
    t0 = time.perf_counter()
    dtype = "bfloat16" if tool.endswith("bf16") else "auto"  # auto: what `quantize --dtype auto` computes in
    dtypes = calibration_dtypes(Path(model_dir), dtype, torch.device("cpu"), cfg.method)
    model = load_fp_model(model_dir, dtypes.load)
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    layers, reports, times = quantize_model(model, ids, cfg, progress=False, passes_dtype=dtypes.passes)
    t_quant = time.perf_counter() - t0
    t0 = time.perf_counter()
    meta = {"quantization": cfg.to_json(), "model_type": model.config.model_type, "report": []}
    save_checkpoint(out, model.config.to_dict(), unquantized_tensors(model, layers), layers, meta, model_dir, True)
    t_save = time.perf_counter() - t0
    accounted = times.forward + times.hessian + times.solver + times.report
    return {
        "load": t_load,
        "first-block inputs + other": t_quant - accounted,
        "block forwards": times.forward,
        "Hessians": times.hessian,
        "solver": times.solver,
        "error report": times.report,
        "save": t_save,
        "block runs": times.forward_passes,
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tool")
    p.add_argument("model")
    p.add_argument("--ids", required=True)
    p.add_argument("--out-model", required=True)
    p.add_argument("--bits", type=int, required=True)
    p.add_argument("--group-size", type=int, required=True)
    p.add_argument("--report", required=True)
    a = p.parse_args()
    Path(a.report).write_text(json.dumps(worker(a.tool, a.model, a.ids, a.out_model, a.bits, a.group_size)))


if __name__ == "__main__":
    main()
