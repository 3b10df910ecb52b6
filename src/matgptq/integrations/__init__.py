"""matgptq inside other engines: transformers' `from_pretrained` (transformers.py) and vLLM's quantization plugin
(vllm.py, imported by vLLM's entry point only: `import matgptq` never imports vLLM)."""
