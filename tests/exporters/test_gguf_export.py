"""GGUF export checked with gguf-py only: every tensor read back by GGUFReader + gguf.quants.dequantize (and the Q/K
RoPE permutation undone) equals matgptq's dequantized weight — bit for bit where the report says exact, within the
reported error elsewhere (docs/formats.md §3).

This module: the legacy types (Q4_0/Q5_0/Q8_0, Q4_1/Q5_1) — symmetric slices and per-layer mixes written exactly,
asymmetric and act-order checkpoints and odd shapes (exact types where they hold the codes, else a re-quantized
Q8_0 within its bound), and the sources that write exact legacy types (a GPTQ export, weighted grids, `--target
gguf`). K-quants and the scale lattice: test_gguf_export_kquants.py; embeddings, metadata, tokenizer, refusals and
the CLI: test_gguf_export_metadata.py. The fixtures `models` and `parent` are in conftest.py, the read-back check in
gguf_helpers.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from matgptq.errors import UserError  # noqa: E402
from matgptq.exporters.gguf import GGUFExportWarning, export_gguf  # noqa: E402
from matgptq.formats.parent import read_checkpoint  # noqa: E402
from tests.conftest import quick_quantize  # noqa: E402
from tests.exporters.gguf_helpers import _check_readback, _reference  # noqa: E402

# --- symmetric slices: exact legacy types -------------------------------------------------------------------------

AUTO_SYM = {2: "Q4_0", 3: "Q4_0", 4: "Q4_0", 5: "Q5_0", 6: "Q8_0", 7: "Q8_0", 8: "Q8_0"}


@pytest.mark.parametrize("bits", sorted(AUTO_SYM))
def test_symmetric_slices_are_bit_exact(parent, tmp_path, bits):
    rep = export_gguf(parent, tmp_path / "m.gguf", bits=bits)
    layer_types = {t.ggml_type for t in rep.tensors if t.bits is not None}
    assert layer_types == {AUTO_SYM[bits]}
    assert rep.exact and rep.max_abs_err == 0.0 and not rep.warnings
    assert {t.ggml_type for t in rep.tensors if t.bits is None} == {"F32"}
    _check_readback(tmp_path / "m.gguf", _reference(parent, bits), rep)


@pytest.mark.parametrize(
    "qtype,widths", [("q4_0", (2, 3, 4)), ("q5_0", (2, 4, 5)), ("q8_0", (2, 4, 6, 8)), ("q4_1", (3, 4)), ("q5_1", (5,))]
)
def test_explicit_legacy_types_exact_for_symmetric(parent, tmp_path, qtype, widths):
    for b in widths:
        rep = export_gguf(parent, tmp_path / f"{b}.gguf", bits=b, qtype=qtype)
        assert {t.ggml_type for t in rep.tensors if t.bits is not None} == {qtype.upper()}
        assert rep.exact, rep.table()  # sym: m = −d·2^(r−1) is exact in fp16
        _check_readback(tmp_path / f"{b}.gguf", _reference(parent, b), rep)


def test_q4_0_nibbles_and_scale(parent, tmp_path):
    """The bytes themselves: d = 16·s (slice of an 8-bit parent), nibble j = code j, nibble j+16 = code j+16."""
    export_gguf(parent, tmp_path / "m.gguf", bits=4)
    ck = read_checkpoint(parent)
    name = "model.layers.0.mlp.up_proj"
    q = ck.layers[name].slice(4)
    t = next(t for t in gguf.GGUFReader(str(tmp_path / "m.gguf")).tensors if t.name == "blk.0.ffn_up.weight")
    raw = np.asarray(t.data).reshape(q.shape[0], -1, 18)
    d = raw[..., :2].copy().view(np.float16)[..., 0]
    np.testing.assert_array_equal(d, (q.scales.float() * 16).half().numpy()[:, : d.shape[1]])
    qs = raw[..., 2:]
    codes = q.codes.numpy().reshape(q.shape[0], -1, 32)
    np.testing.assert_array_equal(qs & 15, codes[..., :16])
    np.testing.assert_array_equal(qs >> 4, codes[..., 16:])


@pytest.mark.parametrize("qtype,bits", [("q4_0", 4), ("q4_0", 3), ("q5_0", 5), ("q8_0", 8), ("q3_k", 3), ("q6_k", 6)])
def test_offset_types_mirror_blocks(qtype, bits):
    """Blocks whose grid sits the other way round (zero 2^(b−1) − 1, e.g. [−7s, 8s]: llama.cpp's own Q4_0 grid
    with the largest weight at +8s) or with negative scales are stored exactly with d = −s and mirrored codes."""
    from matgptq.formats.gguf.tensors import QTYPES, _encode_codes
    from matgptq.formats.quantized import QuantizedWeight

    rng = np.random.default_rng(bits)
    n, k, g = 8, 256, 16 if qtype.endswith("_k") else 32
    half = 1 << (bits - 1)
    scales = torch.from_numpy(rng.uniform(0.01, 0.1, (n, k // 256)).astype(np.float16)).repeat_interleave(256 // g, 1)
    scales[::2] *= -1  # negative scales on even rows
    zeros = torch.full(scales.shape, half, dtype=torch.uint8)
    zeros[1::2, ::2] = half - 1  # mirrored grid on odd rows, every other group
    q = QuantizedWeight(
        codes=torch.from_numpy(rng.integers(0, 2 * half, (n, k)).astype(np.uint8)),
        scales=scales,
        zeros=zeros,
        g_idx=torch.arange(k, dtype=torch.int32) // g,
        bits=bits,
    )
    data, err = _encode_codes(q, QTYPES[qtype])
    back = gguf.quants.dequantize(data, QTYPES[qtype].ggml).reshape(n, k)
    ref = q.dequantize(torch.float32).numpy()
    if qtype.endswith("_k"):  # sub-scales ±s in one super-block: on the K-quant grid, reported error
        assert np.abs(back - ref).max() == pytest.approx(err, rel=1e-6, abs=1e-12)
    else:
        assert err == 0.0
        np.testing.assert_array_equal(back, ref)


def test_bits_config_mix(parent, tmp_path):
    mix = {
        "*": 4,
        "model.layers.0.mlp.down_proj": 8,
        "model.layers.1.self_attn.q_proj": 3,
        "model.layers.1.self_attn.k_proj": 5,
        "model.layers.0.mlp.gate_proj": 6,
    }
    (tmp_path / "mix.json").write_text(json.dumps(mix))
    rep = export_gguf(parent, tmp_path / "m.gguf", bits_config=tmp_path / "mix.json")
    types = {t.source: (t.bits, t.ggml_type) for t in rep.tensors}
    assert types["model.layers.0.mlp.down_proj.weight"] == (8, "Q8_0")
    assert types["model.layers.1.self_attn.q_proj.weight"] == (3, "Q4_0")
    assert types["model.layers.1.self_attn.k_proj.weight"] == (5, "Q5_0")
    assert types["model.layers.0.mlp.gate_proj.weight"] == (6, "Q8_0")
    assert types["model.layers.1.mlp.up_proj.weight"] == (4, "Q4_0")
    assert rep.exact and rep.file_type == "q4_0"
    _check_readback(tmp_path / "m.gguf", _reference(parent, mix), rep)
    meta = gguf.GGUFReader(str(tmp_path / "m.gguf")).fields
    assert json.loads(meta["matgptq.layer_bits"].contents())["model.layers.1.self_attn.q_proj"] == 3
    assert meta["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q4_0


def test_width_mix_gptq_checkpoint(models, tmp_path):
    """quantize --bits-config: a GPTQ checkpoint whose layers have their own widths exports with each layer in its
    own type, and gguf-py reads back exactly the checkpoint's weights."""
    mix = {"*": 4, "model.layers.0.mlp.down_proj": 8, "model.layers.1.self_attn.k_proj": 5}
    ck = quick_quantize(models["small"], tmp_path / "mix", bits_config=mix, group_size=32)
    assert {n: q.bits for n, q in read_checkpoint(ck).layers.items()} == {
        n: mix.get(n, 4) for n in read_checkpoint(ck).layers
    }
    rep = export_gguf(ck, tmp_path / "m.gguf")
    types = {t.source: (t.bits, t.ggml_type) for t in rep.tensors}
    assert types["model.layers.0.mlp.down_proj.weight"] == (8, "Q8_0")
    assert types["model.layers.1.self_attn.k_proj.weight"] == (5, "Q5_0")
    assert types["model.layers.1.mlp.up_proj.weight"] == (4, "Q4_0")
    assert rep.exact
    _check_readback(tmp_path / "m.gguf", _reference(ck, None), rep)


# --- asymmetric, act-order, odd shapes ------------------------------------------------------------------------------


def test_asymmetric(models, tmp_path):
    g4 = quick_quantize(models["small"], tmp_path / "a4", bits=4, sym=False, group_size=32)
    rep = export_gguf(g4, tmp_path / "a4.gguf")
    layers = [t for t in rep.tensors if t.bits is not None]
    assert {t.ggml_type for t in layers} == {"Q4_1"}
    q = read_checkpoint(g4).layers
    for t in layers:  # only the fp16 rounding of m = −s·z: ≤ 2^-11·|m| ≤ 15·2^-11·s
        s = q[t.source[: -len(".weight")]].scales.float()
        assert t.max_abs_err <= 15 * 2**-11 * float(s.max())
    _check_readback(tmp_path / "a4.gguf", _reference(g4, None), rep)
    exact8 = export_gguf(g4, tmp_path / "a4q8.gguf", qtype="q8_0")  # q − z in [−15, 15]: Q8_0 is exact
    assert exact8.exact
    _check_readback(tmp_path / "a4q8.gguf", _reference(g4, None), exact8)

    g3 = quick_quantize(models["small"], tmp_path / "a3", method="rtn", bits=3, sym=False, group_size=64)
    rep3 = export_gguf(g3, tmp_path / "a3.gguf")  # nibble = q + 8 − z ∈ [1, 15]
    assert {t.ggml_type for t in rep3.tensors if t.bits is not None} == {"Q4_0"} and rep3.exact
    _check_readback(tmp_path / "a3.gguf", _reference(g3, None), rep3)

    par = quick_quantize(models["small"], tmp_path / "ap", method="rtn", bits=8, sym=False, group_size=32)
    rep_s = export_gguf(par, tmp_path / "ap4.gguf", bits=4)  # fractional zero z/16 → Q4_1 with m = −s·z
    assert {t.ggml_type for t in rep_s.tensors if t.bits is not None} == {"Q4_1"}
    _check_readback(tmp_path / "ap4.gguf", _reference(par, 4), rep_s)
    with pytest.raises(UserError, match="Q4_0 cannot hold"):
        export_gguf(par, tmp_path / "x.gguf", bits=4, qtype="q4_0")
    assert not (tmp_path / "x.gguf").exists()
    with pytest.warns(GGUFExportWarning, match="re-quantized"):
        rep6 = export_gguf(par, tmp_path / "ap6.gguf", bits=6)  # no type holds an asymmetric 6-bit slice
    layers6 = [t for t in rep6.tensors if t.bits is not None]
    assert {(t.ggml_type, t.method) for t in layers6} == {("Q8_0", "requantized")}
    _check_readback(tmp_path / "ap6.gguf", _reference(par, 6), rep6)
    assert all(t.rel_err <= 0.57 / 127 for t in layers6)  # half a Q8_0 step + fp16 rounding of d


def test_act_order(models, tmp_path):
    ck = quick_quantize(models["small"], tmp_path / "ao", bits=4, group_size=32, act_order=True, static_groups=False)
    with pytest.warns(GGUFExportWarning, match="act-order"):
        rep = export_gguf(ck, tmp_path / "ao.gguf")
    layers = [t for t in rep.tensors if t.bits is not None]
    assert {(t.ggml_type, t.method) for t in layers} == {("Q8_0", "requantized")}
    assert not rep.exact and len(rep.warnings) == len(layers)
    _check_readback(tmp_path / "ao.gguf", _reference(ck, None), rep)
    assert max(t.rel_err for t in layers) <= 0.57 / 127

    st = quick_quantize(models["small"], tmp_path / "st", bits=4, group_size=32, act_order=True, static_groups=True)
    rep_st = export_gguf(st, tmp_path / "st.gguf")  # static groups: g_idx = k // 32 → exact Q4_0
    assert {t.ggml_type for t in rep_st.tensors if t.bits is not None} == {"Q4_0"} and rep_st.exact


@pytest.mark.parametrize("group_size", [16, 48])
def test_group_size_not_multiple_of_32(models, tmp_path, group_size):
    """Groups of 16 or 48 columns split Q4_0/Q8_0 blocks (and rows of 64/128 are too short for K-quants): Q8_0."""
    ck = quick_quantize(models["small"], tmp_path / "g", method="rtn", bits=4, group_size=group_size)
    with pytest.warns(GGUFExportWarning, match="not aligned"):
        rep = export_gguf(ck, tmp_path / "m.gguf")
    layers = [t for t in rep.tensors if t.bits is not None]
    assert {(t.ggml_type, t.method) for t in layers} == {("Q8_0", "requantized")}
    assert max(t.rel_err for t in layers) <= 0.57 / 127
    _check_readback(tmp_path / "m.gguf", _reference(ck, None), rep)


def test_in_features_not_multiple_of_32(models, tmp_path):
    ck = quick_quantize(models["odd"], tmp_path / "odd", method="rtn", bits=4)
    with pytest.warns(GGUFExportWarning, match="not a multiple of 32"):
        rep = export_gguf(ck, tmp_path / "f32.gguf")
    down = next(t for t in rep.tensors if t.name == "blk.0.ffn_down.weight")
    assert (down.ggml_type, down.method, down.exact) == ("F32", "float", True)
    assert {t.ggml_type for t in rep.tensors if t.bits is not None and t is not down} == {"Q4_0"}
    _check_readback(tmp_path / "f32.gguf", _reference(ck, None), rep)
    with pytest.warns(GGUFExportWarning):
        rep16 = export_gguf(ck, tmp_path / "f16.gguf", float_type="f16", qtype="q4_0")
    down16 = next(t for t in rep16.tensors if t.name == "blk.0.ffn_down.weight")
    assert down16.ggml_type == "F16" and down16.rel_err < 2**-10
    assert {t.ggml_type for t in rep16.tensors if t.bits is None} == {"F32", "F16"}  # norms F32, embeddings F16
    _check_readback(tmp_path / "f16.gguf", _reference(ck, None), rep16)


@pytest.mark.filterwarnings("ignore:a per-layer mix is stored")
@pytest.mark.parametrize("fmt", ["gptq_v1", "gptq_v2"])
def test_from_gptq_checkpoint_same_tensors(parent, tmp_path, fmt):
    """A slice exported as a GPTQ checkpoint, read back (runtime.open_checkpoint) and written as GGUF, gives the same
    tensor bytes as the direct GGUF export of the slice: r-bit scale = s·2^(8−r) and zero 2^(r−1) on both paths."""
    from matgptq.exporters.gptq import export_gptq

    mix = {"*": 4, "model.layers.0.mlp.down_proj": 8, "model.layers.1.self_attn.q_proj": 3}
    export_gptq(parent, tmp_path / "gptq", fmt, bits_config=mix)
    via = export_gguf(tmp_path / "gptq", tmp_path / "via.gguf")
    direct = export_gguf(parent, tmp_path / "direct.gguf", bits_config=mix)
    assert via.exact and [(t.name, t.ggml_type) for t in via.tensors] == [(t.name, t.ggml_type) for t in direct.tensors]
    a, b = (gguf.GGUFReader(str(tmp_path / f)).tensors for f in ("via.gguf", "direct.gguf"))
    for x, y in zip(a, b):
        assert x.name == y.name and np.array_equal(np.asarray(x.data), np.asarray(y.data)), x.name


@pytest.mark.parametrize("method,bits", [("gptq", "4"), ("matgptq", "4,5")])
def test_weighted_grid_and_refit_scales_export_exactly(models, tmp_path, method, bits):
    """`--signed-scale --mse --mse-weighted --refit-scales` (the GGUF comparison's "-hw" rows) only change scales:
    Q4_0/Q5_0 still hold exactly the weights matgptq evaluates, for the master and, from a parent, its 4-bit slice."""
    ck = quick_quantize(
        models["small"],
        tmp_path / "ck",
        method=method,
        bits=bits,
        group_size=32,
        signed_scale=True,
        act_order=True,
        static_groups=True,
        mse=True,
        mse_weighted=True,
        refit_scales=True,
    )
    for width in sorted({4, int(bits[-1])}):
        rep = export_gguf(ck, tmp_path / f"{width}.gguf", bits=width if method == "matgptq" else None)
        assert rep.exact and rep.max_abs_err == 0.0, rep.table()
        _check_readback(tmp_path / f"{width}.gguf", _reference(ck, width), rep)


def test_target_gguf_writes_q4_0_exactly(models, tmp_path):
    """`quantize --target gguf` (signed scale, 32-column groups, the GPTQ defaults) then `export --type q4_0`: every
    layer is a bit-exact Q4_0, read back by gguf-py equal to the weights matgptq evaluates."""
    ck = quick_quantize(models["small"], tmp_path / "ck", method="gptq", bits="4", target="gguf")
    rep = export_gguf(ck, tmp_path / "m.gguf", qtype="q4_0")
    assert {t.ggml_type for t in rep.tensors if t.bits is not None} == {"Q4_0"}
    assert rep.exact and rep.max_abs_err == 0.0 and not rep.warnings, rep.table()
    _check_readback(tmp_path / "m.gguf", _reference(ck, 4), rep)
