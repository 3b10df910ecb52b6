"""llama.cpp's converter as the oracle of the GGUF architecture tests (test_gguf_arch*.py): where `make interop` puts
it (the `converter` fixture in conftest.py finds it), and the check that our F32 export is the file it writes for the same model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from matgptq.exporters.gguf import export_gguf

CONVERTER = Path(sys.prefix) / "llama.cpp" / "convert_hf_to_gguf.py"
# runs llama.cpp's converter with its vocabulary step skipped (the models borrow a tokenizer it would not read)
_RUN_CONVERTER = """
import runpy, sys
conv = sys.argv[1]
sys.path.insert(0, conv)
sys.argv = [conv + "/convert_hf_to_gguf.py", *sys.argv[2:]]
import conversion
_get = conversion.get_model_class
def _without_vocab(name, mmproj=False):
    cls = _get(name, mmproj)
    cls.set_vocab = lambda self: None
    return cls
conversion.get_model_class = _without_vocab
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _fields(gguf, path: Path) -> dict:
    reader = gguf.GGUFReader(str(path))
    skip = ("tokenizer.", "general.", "GGUF.", "matgptq.")
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith(skip)}


def assert_same_file_as_converter(gguf, converter: Path, model: Path, tmp_path: Path) -> None:
    """The converter's F32 file of `model` and our export of it: same architecture, model metadata, tensor names,
    types and bit-identical data (`gguf`: the gguf-py module the caller imported or skipped on)."""
    theirs, ours = tmp_path / "theirs.gguf", tmp_path / "ours.gguf"
    env = {**os.environ, "PYTHONPATH": ""}
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            _RUN_CONVERTER,
            str(converter.parent),
            str(model),
            "--outtype",
            "f32",
            "--outfile",
            str(theirs),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    export_gguf(model, ours)
    a, b = gguf.GGUFReader(str(theirs)), gguf.GGUFReader(str(ours))
    assert a.fields["general.architecture"].contents() == b.fields["general.architecture"].contents()
    assert _fields(gguf, theirs) == _fields(gguf, ours)
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    assert sorted(ta) == sorted(tb)
    for name, t in ta.items():
        assert t.tensor_type == tb[name].tensor_type, name
        np.testing.assert_array_equal(np.asarray(t.data), np.asarray(tb[name].data), err_msg=name)
