"""Fixtures shared by several modules of tests/exporters, each built once (scope="package"; tests/exporters has no
__init__.py, so pytest keeps them to the end of the session). Each was a module fixture of the one module these were
split from; the modules sharing one only read it and write under their own tmp_path, and every build is seeded
(random models, calibration), so sharing changes nothing the tests compute."""

import os
from pathlib import Path

import pytest
import torch

from tests.conftest import STORIES, make_tiny_llama, quick_quantize, require_peer
from tests.exporters import ct_helpers, gptq_interop_helpers
from tests.exporters.gguf_converter import CONVERTER
from tests.exporters.gptq_helpers import synthetic

# --- GGUF architectures (test_gguf_arch*.py): llama.cpp's converter, the oracle --------------------------------


@pytest.fixture(scope="package")
def converter() -> Path:
    if not CONVERTER.is_file():
        message = f"llama.cpp's converter is not at {CONVERTER}; `make interop` unpacks it"
        if os.environ.get("MATGPTQ_REQUIRE_PEERS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return CONVERTER


# --- GGUF export (test_gguf_export*.py) ------------------------------------------------------------------------------


@pytest.fixture(scope="package")
def models(tmp_path_factory):
    """Tiny random Llamas of the GGUF export tests; "root" is where they and the GGUF parents live."""
    root = tmp_path_factory.mktemp("gguf")
    return {
        "small": make_tiny_llama(root / "small"),  # hidden 64, intermediate 128: legacy 32-blocks only
        "k256": make_tiny_llama(root / "k256", hidden=256, intermediate=256, heads=4, kv_heads=2, layers=1),
        "odd": make_tiny_llama(root / "odd", intermediate=80, layers=1),  # down_proj in_features 80: no 32-blocks
        "root": root,
    }


@pytest.fixture(scope="package")
def parent(models):  # MatGPTQ 8-bit symmetric parent, group 32: every width is a slice
    return quick_quantize(models["small"], models["root"] / "parent", method="matgptq", bits="4,8", group_size=32)


# --- GPTQ export (test_gptq_export*.py) ------------------------------------------------------------------------------


@pytest.fixture(scope="package")
def parents(tiny_llama_dir, tmp_path_factory):
    """Synthetic parents: sym 8-bit (sliceable to any width) and asym r-bit (shift 0), each with/without act-order."""
    base = tmp_path_factory.mktemp("gptq_src")
    out = {}
    for ao in (False, True):
        out["sym", ao] = synthetic(base / f"sym{ao}", tiny_llama_dir, True, ao)
        for r in (2, 3, 4, 8):
            out["asym", r, ao] = synthetic(base / f"asym{r}{ao}", tiny_llama_dir, False, ao, master=r, seed=r)
    return out


# --- compressed-tensors (test_compressed_tensors*.py) ----------------------------------------------------------------


@pytest.fixture(scope="package")
def ct_cache(tiny_llama_dir, tmp_path_factory):
    return ct_helpers.Cache(tiny_llama_dir, tmp_path_factory.mktemp("ct"))


# --- GPTQ interop (test_gptq_interop*.py) ----------------------------------------------------------------------------


@pytest.fixture(scope="package")
def gptq_cache(tiny_llama_dir, tmp_path_factory):
    return gptq_interop_helpers.Cache(tiny_llama_dir, tmp_path_factory.mktemp("gptq_interop"))


@pytest.fixture(scope="package")
def gptq_stories(tmp_path_factory):
    """The real stories260K (hidden 64, MLP 172, 5 blocks): one MatGPTQ parent (2, 4, 8), lightly calibrated."""
    return gptq_interop_helpers.Cache(STORIES, tmp_path_factory.mktemp("gptq_stories"), widths=(2, 4, 8), nsamples=4)


@pytest.fixture(scope="module")  # per module, as before: it switches torch._dynamo off for the module's duration
def gptqmodel():
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
    gm = require_peer("gptqmodel")
    # GPTQModel torch.compiles its dequantizer: ~30 s per model on CPU for no numeric change; run it eagerly.
    old, torch._dynamo.config.disable = torch._dynamo.config.disable, True
    yield gm
    torch._dynamo.config.disable = old
