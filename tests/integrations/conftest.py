"""The fixture both vLLM modules serve (test_vllm.py, test_vllm_plugin.py), defined once here: a session fixture
imported into a second module is a second definition there, and it ran again (SmolLM2's parent quantized twice,
minutes each on 2 cores)."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smol_parent(tmp_path_factory) -> Path:
    """SmolLM2's MatGPTQ parent (test_vllm.SOURCES["parent"]), quantized once: the slowest source."""
    from tests.conftest import REAL_MODEL
    from tests.integrations.test_vllm import SOURCES, _run_cli  # vLLM's venv only: it imports no vLLM until asked

    out = tmp_path_factory.mktemp("vllm-parent") / "parent"
    _run_cli("quantize", REAL_MODEL, *SOURCES["parent"], "--out", out, "--quiet")
    return out
