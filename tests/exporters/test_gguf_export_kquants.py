"""GGUF export in K-quants (Q2_K…Q6_K), checked with gguf-py only as in test_gguf_export.py: per-channel codes held
exactly, grouped scales rounded onto the K-quant grid within the reported (measured) error, and `quantize --kquant`
parents whose scales lie on the K-quant lattice written bit-exact in the smallest type of each width (per-tensor
types for a mix); without the lattice, or on rows too short for 256-blocks, the export keeps an exact legacy type."""

from __future__ import annotations

import json
import warnings

import pytest

gguf = pytest.importorskip("gguf")

from matgptq.exporters.gguf import GGUFExportWarning, export_gguf  # noqa: E402
from matgptq.formats.parent import read_checkpoint  # noqa: E402
from tests.conftest import quick_quantize  # noqa: E402
from tests.exporters.gguf_helpers import _check_readback, _reference  # noqa: E402

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
    return quick_quantize(
        models["k256"], models["root"] / "lattice", method="matgptq", bits="2,3,4,8", group_size=32, kquant="q2_k"
    )


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
    ck = quick_quantize(
        models["k256"],
        tmp_path / "signed",
        method="matgptq",
        bits="4,6,8",
        group_size=32,
        kquant="q6_k",
        signed_scale=True,
    )
    assert any((q.scales < 0).any() for q in read_checkpoint(ck).layers.values())
    for bits, typ in ((6, "Q6_K"), (4, "Q4_0")):
        rep = export_gguf(ck, tmp_path / f"m{bits}.gguf", bits=bits)
        assert {t.ggml_type for t in rep.tensors if t.bits is not None} == {typ} and rep.exact
        _check_readback(tmp_path / f"m{bits}.gguf", _reference(ck, bits), rep)


def test_kquant_lattice_mix_writes_per_tensor_types(lattice_parent, tmp_path):
    """Issue 12 item 4: a per-layer mix (as `matgptq search` writes it) of a --kquant parent becomes per-tensor GGUF
    types, each layer the smallest exact type of its own width, read back by gguf-py bit for bit."""
    layers = "model.layers.0"
    mix = {
        "*": 4,
        f"{layers}.mlp.down_proj": 2,
        f"{layers}.self_attn.q_proj": 3,
        f"{layers}.mlp.up_proj": 6,
        f"{layers}.self_attn.v_proj": 8,
    }
    (tmp_path / "mix.json").write_text(json.dumps({"bits": mix, "summary": {}}))  # the search's file layout
    rep = export_gguf(lattice_parent, tmp_path / "m.gguf", bits_config=tmp_path / "mix.json")
    types = {t.source: t.ggml_type for t in rep.tensors if t.bits is not None}
    assert types == {
        f"{layers}.mlp.down_proj.weight": "Q2_K",
        f"{layers}.self_attn.q_proj.weight": "Q3_K",
        f"{layers}.mlp.up_proj.weight": "Q6_K",
        f"{layers}.self_attn.v_proj.weight": "Q8_0",
        f"{layers}.self_attn.k_proj.weight": "Q4_0",
        f"{layers}.self_attn.o_proj.weight": "Q4_0",
        f"{layers}.mlp.gate_proj.weight": "Q4_0",
    }
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
