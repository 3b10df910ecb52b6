"""Serve one matgptq parent with vLLM's "matgptq" quantization method (integrations/vllm.py) at several widths, one
engine after the other in this one process, and write what it computed as JSON: run by
tests/integrations/test_vllm_plugin.py with .venv-vllm's python (`make vllm-test`).

    python tests/integrations/vllm_plugin_child.py SPEC.json OUT.json

SPEC: {"parent": directory, "prompts": [[token id, ...], ...], "max_tokens": n, "max_model_len": m,
"cases": {name: bits}, "parents": {name: directory}} (a case's own parent; optional), bits being what hf_overrides' quantization_config gets (a width, a mix file's path or a
{layer: bits} mix) or null for none (the stored widths). OUT: {"plugin": how this fresh interpreter saw the plugin,
"cases": {name: result}}, a result as vllm_child.py's (prompt_logprobs and greedy tokens, or "refused").

Before any engine starts, "plugin" records whether `import matgptq` imported vLLM (it must not) and whether vLLM's
own `load_general_plugins()` registered "matgptq" from the installed entry point (this process never calls
`register` itself). VLLM_ENABLE_V1_MULTIPROCESSING=0 as in vllm_child.py: engines after the first start in seconds.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.pop("TRITON_INTERPRET", None)

from vllm_child import refusal  # noqa: E402 — this folder is sys.path[0] when run as a script


def plugin_seen() -> dict:
    """How a fresh interpreter sees the plugin: vLLM not imported by matgptq; registered by vLLM's entry points."""
    import matgptq  # noqa: F401

    imported_vllm = any(m == "vllm" or m.startswith("vllm.") for m in sys.modules)
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
    from vllm.plugins import load_general_plugins

    before = "matgptq" in QUANTIZATION_METHODS
    load_general_plugins()
    return {
        "matgptq_imports_vllm": imported_vllm,
        "registered_before": before,
        "registered_by_entry_point": "matgptq" in QUANTIZATION_METHODS,
    }


def serve(parent: str, bits, spec: dict) -> dict:
    from vllm import LLM, SamplingParams

    overrides = {} if bits is None else {"quantization_config": {"quant_method": "matgptq", "bits": bits}}
    try:
        llm = LLM(
            model=parent,
            quantization="matgptq",
            hf_overrides=overrides,
            enforce_eager=True,
            max_model_len=spec["max_model_len"],
            seed=0,
        )
    except Exception as error:  # noqa: BLE001 - every refusal is recorded, whichever exception vLLM raises
        return {"refused": refusal(error)}
    prompts = spec["prompts"]
    params = SamplingParams(max_tokens=spec["max_tokens"], temperature=0.0, prompt_logprobs=0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    result = {"dtype": str(llm.llm_engine.model_config.dtype), "prompt_logprobs": [], "greedy": []}
    for prompt, out in zip(prompts, outputs):
        logprobs = out.prompt_logprobs[1:]  # the first token has none
        result["prompt_logprobs"].append([lp[t].logprob for lp, t in zip(logprobs, prompt[1:])])
        result["greedy"].append(list(out.outputs[0].token_ids))
    del llm, outputs
    gc.collect()
    return result


def main(spec_path: str, out_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    out = {"plugin": plugin_seen(), "cases": {}}
    for name, bits in spec["cases"].items():
        out["cases"][name] = serve(spec.get("parents", {}).get(name, spec["parent"]), bits, spec)
    Path(out_path).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":  # vLLM may spawn processes that re-import this file
    sys.exit(main(*sys.argv[1:]))
