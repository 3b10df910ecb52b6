# Two commands on a fresh clone (with ../shared beside it):  make demo   and   make test
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
SHARED  ?= ../shared
MODEL   := $(SHARED)/models/stories260K
TEXT    := $(SHARED)/data/tinystories/tinystories_val_head.txt
PIP     := $(BIN)/pip install -q --disable-pip-version-check -c .ci/constraints.txt

.PHONY: venv demo test interop bench results clean

# torch is installed first and pinned (.ci/constraints.txt): 2.13.0 is a local CPU wheel; any other version
# would pull gigabytes of CUDA wheels.
$(BIN)/matgptq: pyproject.toml .ci/constraints.txt
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

# Peer libraries for the interop tests (GPTQModel, optimum, llama-cpp-python; the last builds llama.cpp once,
# about 10 minutes, then comes from pip's wheel cache).
interop: venv
	GPTQMODEL_CPU_WORKERS=2 CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 \
	    $(PIP) -e ".[dev,interop]"

# llm-compressor 0.14 needs transformers<=5.17 (it downgrades the venv's transformers; the tests pass with both).
bench: interop
	$(PIP) -e ".[bench]"
	GPTQMODEL_CPU_WORKERS=2 TORCHDYNAMO_DISABLE=1 $(BIN)/python scripts/bench_gptq.py
	$(BIN)/python scripts/bench_multibit.py

results: venv
	$(BIN)/python scripts/results.py

clean:
	rm -rf $(VENV) runs .pytest_cache
