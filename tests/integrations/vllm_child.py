"""Serve model directories with vLLM on the CPU, one after the other in this one process, and write what it computed
as JSON: run by tests/integrations/test_vllm.py with .venv-vllm's python (`make vllm-test`).

    python tests/integrations/vllm_child.py SPEC.json OUT.json

SPEC: {"prompts": [[token id, ...], ...], "max_tokens": n, "max_model_len": m, "models": {name: directory}}.
OUT: {name: result}, where a served model's result is {"dtype", "prompt_logprobs": per prompt the log-probability
vLLM gives each actual token after the first, "greedy": per prompt its n greedy tokens}, one vLLM refuses to start is
{"refused": the exception's type and message, and where it was raised when the message is empty (a bare assert)}, and
one that starts but fails to generate is {"error": the same}.

VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps the engine core in this process, so no worker is spawned and each model after
the first starts in seconds; the child is still a process of its own because vLLM configures torch, threads and
logging process-wide. All prompts of a model go in one generate() call.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache: the prompts are a few hundred tokens
os.environ.pop("TRITON_INTERPRET", None)  # the test suite's Triton interpreter is not vLLM's business


def refusal(error: BaseException) -> str:
    """One line naming a refusal: type and message, plus the raising frame when the message is empty."""
    message = " ".join(str(error).split())
    if not message:
        frame = traceback.extract_tb(error.__traceback__)[-1]
        message = f"at {Path(frame.filename).name}:{frame.lineno} ({frame.name}: {frame.line})"
    return f"{type(error).__name__}: {message}"


def serve(path: str, spec: dict) -> dict:
    from vllm import LLM, SamplingParams

    try:
        llm = LLM(model=path, enforce_eager=True, max_model_len=spec["max_model_len"], seed=0)
    except Exception as error:  # noqa: BLE001 - every refusal is recorded, whichever exception vLLM raises
        return {"refused": refusal(error)}
    prompts = spec["prompts"]
    params = SamplingParams(max_tokens=spec["max_tokens"], temperature=0.0, prompt_logprobs=0, ignore_eos=True)
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    except Exception as error:  # noqa: BLE001 - recorded; the test fails on it with this text
        del llm
        gc.collect()
        return {"error": refusal(error)}
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
    results = {name: serve(path, spec) for name, path in spec["models"].items()}
    Path(out_path).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":  # vLLM may spawn processes that re-import this file
    sys.exit(main(*sys.argv[1:]))
