"""Helpers of the GGUF export tests (tests/exporters/test_gguf_export*.py): matgptq's own view of a checkpoint, and
the check that gguf-py reads a written file back as that view (docs/formats.md §3)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from matgptq.formats.gguf import read_gguf_weights
from matgptq.formats.parent import read_checkpoint


def _reference(ckpt_dir: Path, bits) -> dict[str, np.ndarray]:
    """matgptq's view: dequantized slices for the quantized layers, the stored tensors for the rest."""
    ck = read_checkpoint(ckpt_dir)
    widths = bits if isinstance(bits, dict) else {n: bits or q.bits for n, q in ck.layers.items()}
    ref = {k: v.float().numpy() for k, v in ck.tensors.items()}
    for n, q in ck.layers.items():
        ref[f"{n}.weight"] = q.slice(widths.get(n, widths.get("*"))).dequantize(torch.float32).numpy()
    return ref


def _check_readback(path: Path, ref: dict[str, np.ndarray], rep) -> dict[str, np.ndarray]:
    """The file, read by gguf-py, equals `ref` exactly where the report claims exactness, else within its error."""
    back = read_gguf_weights(path)
    assert set(back) == set(ref) - (
        {"lm_head.weight"} if "output.weight" not in {t.name for t in rep.tensors} else set()
    )
    by_src = {t.source: t for t in rep.tensors}
    for name, w in back.items():
        t = by_src[name]
        err = float(np.abs(w.astype(np.float64) - ref[name].astype(np.float64)).max())
        assert err == pytest.approx(t.max_abs_err, rel=1e-6, abs=0), name
        if t.exact:
            np.testing.assert_array_equal(w, ref[name], err_msg=name)
    return back
