"""GGUF export checked with gguf-py only: every tensor read back by GGUFReader + gguf.quants.dequantize (and the Q/K
RoPE permutation undone) equals matgptq's dequantized weight — bit for bit where the report says exact, within the
reported error elsewhere (docs/formats.md §3)."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from matgptq.errors import UserError  # noqa: E402
from matgptq.exporters.gguf import GGUFExportWarning, export_gguf, read_gguf_weights  # noqa: E402
from matgptq.exporters.gguf import llama_qk_permutation  # noqa: E402
from matgptq.formats.parent import read_checkpoint  # noqa: E402

from tests.conftest import STORIES, make_tiny_llama, quick_quantize  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    return {
        "small": make_tiny_llama(root / "small"),  # hidden 64, intermediate 128: legacy 32-blocks only
        "k256": make_tiny_llama(root / "k256", hidden=256, intermediate=256, heads=4, kv_heads=2, layers=1),
        "odd": make_tiny_llama(root / "odd", intermediate=80, layers=1),  # down_proj in_features 80: no 32-blocks
        "root": root,
    }


@pytest.fixture(scope="module")
def parent(models):  # MatGPTQ 8-bit symmetric parent, group 32: every width is a slice
    return quick_quantize(models["small"], models["root"] / "parent", method="matgptq", bits="4,8", group_size=32)


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
    assert set(back) == set(ref) - ({"lm_head.weight"} if "output.weight" not in {t.name for t in rep.tensors}
                                    else set())  # fmt: skip
    by_src = {t.source: t for t in rep.tensors}
    for name, w in back.items():
        t = by_src[name]
        err = float(np.abs(w.astype(np.float64) - ref[name].astype(np.float64)).max())
        assert err == pytest.approx(t.max_abs_err, rel=1e-6, abs=0), name
        if t.exact:
            np.testing.assert_array_equal(w, ref[name], err_msg=name)
    return back


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


@pytest.mark.parametrize("qtype,widths", [("q4_0", (2, 3, 4)), ("q5_0", (2, 4, 5)), ("q8_0", (2, 4, 6, 8)),
                                          ("q4_1", (3, 4)), ("q5_1", (5,))])  # fmt: skip
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
    q = QuantizedWeight(codes=torch.from_numpy(rng.integers(0, 2 * half, (n, k)).astype(np.uint8)), scales=scales,
                        zeros=zeros, g_idx=torch.arange(k, dtype=torch.int32) // g, bits=bits)  # fmt: skip
    data, err = _encode_codes(q, QTYPES[qtype])
    back = gguf.quants.dequantize(data, QTYPES[qtype].ggml).reshape(n, k)
    ref = q.dequantize(torch.float32).numpy()
    if qtype.endswith("_k"):  # sub-scales ±s in one super-block: on the K-quant grid, reported error
        assert np.abs(back - ref).max() == pytest.approx(err, rel=1e-6, abs=1e-12)
    else:
        assert err == 0.0
        np.testing.assert_array_equal(back, ref)


def test_bits_config_mix(parent, tmp_path):
    mix = {"*": 4, "model.layers.0.mlp.down_proj": 8, "model.layers.1.self_attn.q_proj": 3,
           "model.layers.1.self_attn.k_proj": 5, "model.layers.0.mlp.gate_proj": 6}  # fmt: skip
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
        n: mix.get(n, 4) for n in read_checkpoint(ck).layers}
    rep = export_gguf(ck, tmp_path / "m.gguf")
    types = {t.source: (t.bits, t.ggml_type) for t in rep.tensors}
    assert types["model.layers.0.mlp.down_proj.weight"] == (8, "Q8_0")
    assert types["model.layers.1.self_attn.k_proj.weight"] == (5, "Q5_0")
    assert types["model.layers.1.mlp.up_proj.weight"] == (4, "Q4_0")
    assert rep.exact
    _check_readback(tmp_path / "m.gguf", _reference(ck, None), rep)


# --- K-quants -------------------------------------------------------------------------------------------------------


def test_per_channel_k_quants_are_exact(models, tmp_path):
    """Per-channel (one scale per 256 columns): Q2_K/Q3_K/Q6_K with sub-scale 1 hold the codes exactly."""
    ck = quick_quantize(models["k256"], tmp_path / "pc", method="rtn", bits=8, group_size=-1)
    for bits, typ in {2: "Q2_K", 3: "Q3_K", 4: "Q4_0", 5: "Q5_0", 6: "Q6_K", 8: "Q8_0"}.items():
        rep = export_gguf(ck, tmp_path / f"{bits}.gguf", bits=bits)
        assert {t.ggml_type for t in rep.tensors if t.bits is not None} == {typ}, bits
        assert rep.exact
        _check_readback(tmp_path / f"{bits}.gguf", _reference(ck, bits), rep)


@pytest.mark.parametrize("qtype,bits", [("q6_k", 6), ("q6_k", 4), ("q3_k", 3), ("q3_k", 2), ("q2_k", 2)])
def test_grouped_k_quants_keep_codes_and_report_scale_error(models, tmp_path, qtype, bits):
    """Group 16: codes kept, per-16 scales rounded onto the K-quant grid; the reported error is the measured one."""
    ck = tmp_path / "g16"
    quick_quantize(models["k256"], ck, method="rtn", bits=8, group_size=16)
    rep = export_gguf(ck, tmp_path / "m.gguf", bits=bits, qtype=qtype)
    layers = [t for t in rep.tensors if t.bits is not None]
    assert {t.ggml_type for t in layers} == {qtype.upper()} and {t.method for t in layers} == {"codes"}
    ref = _reference(ck, bits)
    _check_readback(tmp_path / "m.gguf", ref, rep)
    q = read_checkpoint(ck).layers
    for t in layers:  # well below half a quantization step of the largest group scale
        step = float(q[t.source[: -len(".weight")]].scales.float().max()) * 2 ** (8 - bits)
        assert 0 < t.max_abs_err < 0.25 * step, (t.name, t.max_abs_err / step)


@pytest.fixture(scope="module")
def lattice_parent(models):  # MatGPTQ parent with scales on Q2_K's lattice (the narrowest), per-width scales too
    return quick_quantize(models["k256"], models["root"] / "lattice", method="matgptq", bits="2,3,4,8", group_size=32,
                          kquant="q2_k")  # fmt: skip


@pytest.mark.parametrize("bits,typ", [(2, "Q2_K"), (3, "Q3_K"), (4, "Q4_0"), (5, "Q5_0"), (6, "Q6_K"), (8, "Q8_0")])
def test_kquant_lattice_slices_take_the_smallest_exact_type(lattice_parent, tmp_path, bits, typ):
    """`quantize --kquant`: with grouped scales, auto now writes 2/3/6-bit slices as Q2_K/Q3_K/Q6_K (2.6/3.4/6.6 bpw
    instead of Q4_0's 4.5 and Q8_0's 8.5), and gguf-py reads back matgptq's weights bit for bit."""
    rep = export_gguf(lattice_parent, tmp_path / "m.gguf", bits=bits)
    assert {t.ggml_type for t in rep.tensors if t.bits is not None} == {typ} and rep.exact
    _check_readback(tmp_path / "m.gguf", _reference(lattice_parent, bits), rep)


def test_signed_scales_on_the_q6_k_lattice_export_exactly(models, tmp_path):
    """`--kquant q6_k --signed-scale` (llama.cpp Q4_0's grid, scales of either sign): the 6-bit slice is Q6_K with
    negative int8 sub-scales, the 4-bit slice Q4_0, both read back by gguf-py bit for bit."""
    ck = quick_quantize(models["k256"], tmp_path / "signed", method="matgptq", bits="4,6,8", group_size=32,
                        kquant="q6_k", signed_scale=True)  # fmt: skip
    assert any((q.scales < 0).any() for q in read_checkpoint(ck).layers.values())
    for bits, typ in ((6, "Q6_K"), (4, "Q4_0")):
        rep = export_gguf(ck, tmp_path / f"m{bits}.gguf", bits=bits)
        assert {t.ggml_type for t in rep.tensors if t.bits is not None} == {typ} and rep.exact
        _check_readback(tmp_path / f"m{bits}.gguf", _reference(ck, bits), rep)


def test_kquant_lattice_mix_writes_per_tensor_types(lattice_parent, tmp_path):
    """Issue 12 item 4: a per-layer mix (as `matgptq search` writes it) of a --kquant parent becomes per-tensor GGUF
    types, each layer the smallest exact type of its own width, read back by gguf-py bit for bit."""
    layers = "model.layers.0"
    mix = {"*": 4, f"{layers}.mlp.down_proj": 2, f"{layers}.self_attn.q_proj": 3, f"{layers}.mlp.up_proj": 6,
           f"{layers}.self_attn.v_proj": 8}  # fmt: skip
    (tmp_path / "mix.json").write_text(json.dumps({"bits": mix, "summary": {}}))  # the search's file layout
    rep = export_gguf(lattice_parent, tmp_path / "m.gguf", bits_config=tmp_path / "mix.json")
    types = {t.source: t.ggml_type for t in rep.tensors if t.bits is not None}
    assert types == {f"{layers}.mlp.down_proj.weight": "Q2_K", f"{layers}.self_attn.q_proj.weight": "Q3_K",
                     f"{layers}.mlp.up_proj.weight": "Q6_K", f"{layers}.self_attn.v_proj.weight": "Q8_0",
                     f"{layers}.self_attn.k_proj.weight": "Q4_0", f"{layers}.self_attn.o_proj.weight": "Q4_0",
                     f"{layers}.mlp.gate_proj.weight": "Q4_0"}  # fmt: skip
    assert rep.exact
    _check_readback(tmp_path / "m.gguf", _reference(lattice_parent, mix), rep)


@pytest.mark.parametrize("bits,qtype", [(2, "q3_k"), (2, "q4_k"), (3, "q4_k"), (4, "q4_k"), (5, "q5_k"), (6, "q6_k")])
def test_kquant_lattice_holds_every_wider_k_quant(lattice_parent, tmp_path, bits, qtype):
    rep = export_gguf(lattice_parent, tmp_path / "m.gguf", bits=bits, qtype=qtype)
    assert {t.ggml_type for t in rep.tensors if t.bits is not None} == {qtype.upper()} and rep.exact
    _check_readback(tmp_path / "m.gguf", _reference(lattice_parent, bits), rep)


def test_without_the_lattice_grouped_k_quants_are_not_chosen(models, tmp_path):
    ck = quick_quantize(models["k256"], tmp_path / "free", method="gptq", bits=3, group_size=32)
    rep = export_gguf(ck, tmp_path / "m.gguf")
    assert {t.ggml_type for t in rep.tensors if t.bits is not None} == {"Q4_0"} and rep.exact


def test_k_quant_on_short_rows_falls_back_to_exact_legacy(parent, tmp_path):
    with pytest.warns(GGUFExportWarning, match="fallback|not a multiple"):
        warnings.simplefilter("always")
        rep = export_gguf(parent, tmp_path / "m.gguf", bits=3, qtype="q3_k")  # in_features 64/128, not 256
    assert {t.ggml_type for t in rep.tensors if t.bits is not None} == {"Q4_0"} and rep.exact
    assert all("fallback from Q3_K" in t.note for t in rep.tensors if t.bits is not None)


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
    ck = quick_quantize(models["small"], tmp_path / "ao", bits=4, group_size=32, act_order=True)
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


def test_embeddings_q8_0(parent, tmp_path):
    rep = export_gguf(parent, tmp_path / "m.gguf", bits=4, embed_type="q8_0")
    emb = {t.name: t for t in rep.tensors}
    assert emb["token_embd.weight"].ggml_type == "Q8_0" and emb["output.weight"].ggml_type == "Q8_0"
    assert emb["token_embd.weight"].method == "requantized" and emb["token_embd.weight"].rel_err < 0.57 / 127
    _check_readback(tmp_path / "m.gguf", _reference(parent, 4), rep)


# Worst-case error of a re-quantized tensor, relative to its max |w| (gguf-py's ports of ggml-quants.c): Q4_0/Q5_0
# take d = (the block's signed extreme) / −2^(b−1), so the opposite extreme clips one code short: error ≤ |d| =
# max|w| / 2^(b−1); Q4_1/Q5_1 take d = (max − min) / (2^b − 1) ≤ 2·max|w| / (2^b − 1) with round-to-nearest: ≤ d/2.
# The factor 1.07 (0.57 for the halves) covers the float16 rounding of d (and m), ≤ 2^-11 relative, times at most
# 2^b codes: 16·2^-11 < 0.07 of a step.
REQUANT_BOUND = {"q4_0": 1.07 / 8, "q5_0": 1.07 / 16, "q4_1": 0.57 * 2 / 15, "q5_1": 0.57 * 2 / 31}


@pytest.mark.parametrize("typ", sorted(REQUANT_BOUND))
def test_embeddings_legacy_types(parent, tmp_path, typ):
    """--embed-type q4_0…q5_1 (llama-quantize's --token-embedding-type): the tensors are written in that type,
    read back by gguf-py within the type's worst-case error, and the quantized layers stay bit-exact."""
    rep = export_gguf(parent, tmp_path / "m.gguf", bits=4, embed_type=typ)
    emb = {t.name: t for t in rep.tensors if t.name in ("token_embd.weight", "output.weight")}
    assert {t.ggml_type for t in emb.values()} == {typ.upper()} and len(emb) == 2
    for t in emb.values():
        assert t.method == "requantized" and 0 < t.rel_err <= REQUANT_BOUND[typ]
    assert all(t.exact for t in rep.tensors if t.bits is not None)
    _check_readback(tmp_path / "m.gguf", _reference(parent, 4), rep)


def test_embeddings_auto_as_llamacpp_presets(parent, models, tmp_path):
    """auto: Q6_K when rows are multiples of 256, else Q8_0 (llama-quant.cpp's rule for the output matrix); the
    printed bits per weight is Σ tensor bytes · 8 / Σ weights, recounted here from the file by gguf-py."""
    k256 = quick_quantize(models["k256"], models["root"] / "k256-q", bits=4, group_size=32)
    for src, bits, want in ((parent, 4, "Q8_0"), (k256, None, "Q6_K")):
        out = tmp_path / f"{want}.gguf"
        rep = export_gguf(src, out, bits=bits, embed_type="auto")
        emb = {t.name: t for t in rep.tensors if t.name in ("token_embd.weight", "output.weight")}
        assert {t.ggml_type for t in emb.values()} == {want} and len(emb) == 2
        _check_readback(out, _reference(src, bits), rep)
        tensors = gguf.GGUFReader(str(out)).tensors
        assert rep.bits_per_weight == pytest.approx(8 * sum(int(t.n_bytes) for t in tensors)
                                                    / sum(int(t.n_elements) for t in tensors), rel=1e-12)  # fmt: skip
    unquantized = export_gguf(models["small"], tmp_path / "f.gguf", embed_type="auto")  # nothing quantized: float
    assert {t.ggml_type for t in unquantized.tensors} == {"F32"}


# --- metadata, tokenizer, permutation -------------------------------------------------------------------------------


def test_unquantized_model_and_permutation(models, tmp_path):
    """An unquantized model exports as F32; attn_q/attn_k rows are permuted exactly as convert_hf_to_gguf does."""
    from safetensors.torch import load_file

    rep = export_gguf(models["small"], tmp_path / "f32.gguf")
    assert rep.exact and rep.file_type == "f32" and {t.ggml_type for t in rep.tensors} == {"F32"}
    hf = load_file(str(models["small"] / "model.safetensors"))
    raw = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(tmp_path / "f32.gguf")).tensors}
    for kind, heads in (("q", 4), ("k", 2)):
        w = hf[f"model.layers.1.self_attn.{kind}_proj.weight"].numpy()
        hd = 64 // 4
        expect = w.reshape(heads, 2, hd // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)  # LlamaModel.permute
        np.testing.assert_array_equal(raw[f"blk.1.attn_{kind}.weight"], expect)
        np.testing.assert_array_equal(expect[np.argsort(llama_qk_permutation(w.shape[0], heads))], w)
    back = read_gguf_weights(tmp_path / "f32.gguf")
    for k, v in hf.items():
        np.testing.assert_array_equal(back[k], v.numpy(), err_msg=k)


def test_llama_metadata_and_tokenizer(parent, tmp_path):
    export_gguf(parent, tmp_path / "m.gguf", bits=4)
    f = {k: v.contents() for k, v in gguf.GGUFReader(str(tmp_path / "m.gguf")).fields.items()}
    assert f["general.architecture"] == "llama"
    assert (f["llama.context_length"], f["llama.embedding_length"], f["llama.block_count"]) == (256, 64, 2)
    assert (f["llama.feed_forward_length"], f["llama.attention.head_count"], f["llama.attention.head_count_kv"]) == (
        128, 4, 2)  # fmt: skip
    assert f["llama.rope.dimension_count"] == 16 and f["llama.rope.freq_base"] == 10000.0
    assert f["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    assert f["general.quantization_version"] == 2
    tj = json.loads((STORIES / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    assert f["tokenizer.ggml.model"] == "llama"
    assert f["tokenizer.ggml.tokens"] == sorted(vocab, key=vocab.get)
    types, scores = f["tokenizer.ggml.token_type"], f["tokenizer.ggml.scores"]
    assert types[0] == gguf.TokenType.UNKNOWN and types[1] == types[2] == gguf.TokenType.CONTROL
    assert types[vocab["<0x0A>"]] == gguf.TokenType.BYTE and types[vocab["▁the"]] == gguf.TokenType.NORMAL
    assert scores[vocab["▁t"]] == 0.0 and scores[vocab["▁the"]] == -6.0  # −(rank of the first merge making it)
    assert (f["tokenizer.ggml.bos_token_id"], f["tokenizer.ggml.eos_token_id"]) == (1, 2)
    assert f["tokenizer.ggml.unknown_token_id"] == 0
    assert f["tokenizer.ggml.add_bos_token"] is True and f["tokenizer.ggml.add_space_prefix"] is True


def test_stories260k_down_proj(tmp_path):
    """The real model (tied embeddings, head_dim 8, intermediate 172): no output.weight; ffn_down has no blocks."""
    rep = export_gguf(STORIES, tmp_path / "s.gguf")
    names = {t.name for t in rep.tensors}
    assert "output.weight" not in names and "token_embd.weight" in names and len(names) == 2 + 9 * 5
    back = read_gguf_weights(tmp_path / "s.gguf")
    from safetensors.torch import load_file

    for k, v in load_file(str(STORIES / "model.safetensors")).items():
        if k != "lm_head.weight":
            np.testing.assert_array_equal(back[k], v.float().numpy(), err_msg=k)


# --- refusals -------------------------------------------------------------------------------------------------------


def _no_leftovers(d: Path, allowed: set[str]) -> None:
    assert {p.name for p in d.iterdir()} == allowed


def test_refusals(parent, models, tmp_path):
    out = tmp_path / "m.gguf"
    with pytest.raises(UserError, match="Q4_0 cannot hold"):
        export_gguf(parent, out, bits=8, qtype="q4_0")
    with pytest.raises(UserError, match="unknown GGUF type"):
        export_gguf(parent, out, qtype="iq4_xs")
    with pytest.raises(UserError, match="either"):
        export_gguf(parent, out, bits=4, bits_config={"*": 4})
    with pytest.raises(UserError, match="not quantized"):
        export_gguf(models["small"], out, bits=4)
    with pytest.raises(UserError, match="does not exist"):
        export_gguf(tmp_path / "nope", out)
    _no_leftovers(tmp_path, set())
    out.write_bytes(b"keep")
    with pytest.raises(UserError, match="already exists"):
        export_gguf(parent, out, bits=4)
    assert out.read_bytes() == b"keep"
    export_gguf(parent, out, bits=4, overwrite=True)
    assert out.read_bytes()[:4] == b"GGUF"
    _no_leftovers(tmp_path, {"m.gguf"})


def test_unmapped_architecture_refused(parent, tmp_path):
    import shutil

    other = tmp_path / "gpt2"
    shutil.copytree(parent, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["model_type"] = "gpt2"  # quantizable by matgptq, not mapped to llama.cpp's names
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="GGUF export supports the model types llama, mistral, qwen2, qwen3, phi3;"):
        export_gguf(other, tmp_path / "m.gguf", bits=4)
    assert not (tmp_path / "m.gguf").exists()


def test_cli(parent, tmp_path, capsys):
    from matgptq.cli import main

    out = tmp_path / "m.gguf"
    assert main(["export", str(parent), "--format", "gguf", "--bits", "3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rep = export_gguf(parent, tmp_path / "again.gguf", bits=3, embed_type="auto")  # the CLI's defaults
    n, exact, types = len(rep.tensors), sum(t.exact for t in rep.tensors), rep.types()
    worst = max(rep.tensors, key=lambda t: t.max_abs_err)
    assert types["Q8_0"] == 2 and worst.ggml_type == "Q8_0"  # --embed-type auto (hidden 64): embeddings re-quantized
    by_count = ", ".join(f"{c} {t}" for t, c in sorted(types.items(), key=lambda kv: (-kv[1], kv[0])))
    assert text.split("\n") == [  # a summary, not one row per tensor
        f"{n} tensors: {by_count}",
        f"{exact}/{n} tensors bit-exact, max |Δw| {worst.max_abs_err:.3g} ({worst.name}, Q8_0)",
        f"wrote {out} ({out.stat().st_size / 2**20:.2f} MiB, {rep.bits_per_weight:.2f} bits per weight, mostly Q4_0)",
        "readers: runs in llama.cpp (llama-cpp-python 0.3.36); transformers' GGUF reader (dequantized to float)",
        "",
    ]
    assert main(["export", str(parent), "--format", "gguf", "--bits", "3", "--out", str(out), "--overwrite",
                 "--verbose"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    readers = "readers: runs in llama.cpp (llama-cpp-python 0.3.36); transformers' GGUF reader (dequantized to float)"
    assert text.endswith(f"mostly Q4_0)\n{readers}\n") and f"{n} tensors: {by_count}" in text
    rows = [line for line in text.split("\n") if re.match(r"\| (token_embd|blk|output)", line)]
    assert len(rows) == n and re.search(r"token_embd.weight +\| Q8_0", text)
    assert sum(re.search(r"\| (yes|no) +\|", r).group(1) == "yes" for r in rows) == exact
    assert main(["export", str(parent), "--format", "gguf", "--bits", "8", "--type", "q4_0", "--out",
                 str(tmp_path / "x.gguf")]) == 2  # fmt: skip
    assert "Q4_0 cannot hold" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()


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
    ck = quick_quantize(models["small"], tmp_path / "ck", method=method, bits=bits, group_size=32, signed_scale=True,
                        act_order=True, static_groups=True, mse=True, mse_weighted=True, refit_scales=True)  # fmt: skip
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
