"""api.quantize options that no other test covers: the calibration dtype, and that the source model is never written
(the pipeline overwrites weights in place in the model's copy-on-write memory map)."""

import hashlib
import json

import pytest
from safetensors import safe_open

from matgptq.errors import UserError
from tests.conftest import make_tiny_llama, quick_quantize


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_bfloat16_calibration_writes_bfloat16_and_leaves_the_source_untouched(tmp_path):
    src = make_tiny_llama(tmp_path / "m")
    before = {p.name: sha(p) for p in src.iterdir() if p.is_file()}
    out = quick_quantize(src, tmp_path / "q", dtype="bfloat16")
    assert {p.name: sha(p) for p in src.iterdir() if p.is_file()} == before
    meta = json.loads((out / "matgptq.json").read_text())
    assert meta["calibration"]["dtype"] == "bfloat16"
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert str(f.get_slice("model.norm.weight").get_dtype()) in ("BF16", "bfloat16")
    quick_quantize(src, tmp_path / "q32")  # default: the model's own dtype, and the source still untouched
    assert {p.name: sha(p) for p in src.iterdir() if p.is_file()} == before


def test_unknown_dtype_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="--dtype int8 is not one of auto, float32, bfloat16, float16"):
        quick_quantize(make_tiny_llama(tmp_path / "m"), tmp_path / "q", dtype="int8")
