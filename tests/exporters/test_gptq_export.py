"""GPTQ v1/v2 export and import without peer libraries: bit-exact round trips of every width, zero-point kind, format
and act-order (asymmetric v1 refused), the qzeros words and slice scales, the logits of a loaded export, per-layer
mixes (`dynamic` overrides) and the CLI. Padded shapes: test_gptq_export_padded.py; refusals and checkpoints written
by others: test_gptq_export_refusals.py; the synthetic parents (fixture `parents`) are in conftest.py."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import matgptq
from matgptq.cli import main
from matgptq.errors import UserError
from matgptq.exporters.gptq import export_gptq
from matgptq.formats.gptq.packing import unpack_cols
from matgptq.formats.gptq.reader import read_gptq_checkpoint
from matgptq.formats.parent import read_checkpoint
from matgptq.formats.slicing import slice_codes
from tests.exporters.gptq_helpers import GROUP, _logits, _no_output

CALIB = ["Once upon a time there was a little girl who liked to play in the park with her dog. " * 8] * 4


def _source(parents, sym, bits, ao):
    return parents["sym", ao] if sym else parents["asym", bits, ao]


@pytest.mark.parametrize("ao", [False, True], ids=["plain", "act_order"])
@pytest.mark.parametrize("fmt", ["gptq_v1", "gptq_v2"])
@pytest.mark.parametrize("sym", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_round_trip_is_bit_exact(parents, tmp_path, bits, sym, fmt, ao):
    src = _source(parents, sym, bits, ao)
    out = tmp_path / "gptq"
    if fmt == "gptq_v1" and not sym:
        with pytest.raises(UserError, match="gptq_v2"):
            export_gptq(src, out, fmt, bits=bits)
        return _no_output(out)
    export_gptq(src, out, fmt, bits=bits)
    parent, back = read_checkpoint(src), read_gptq_checkpoint(out)
    assert set(back.layers) == set(parent.layers)
    for name, q in parent.layers.items():
        want, got = q.slice(bits), back.layers[name]
        assert sym == bool(q.width_scales)  # sym parents are v2, with a scale set per slice width
        assert got.bits == bits and got.shift == 0
        assert torch.equal(got.codes, slice_codes(q.codes, q.bits, bits))
        assert torch.equal(got.g_idx, q.g_idx)
        assert torch.equal(got.dequantize(), want.dequantize()), name
    for name, t in parent.tensors.items():
        assert torch.equal(back.tensors[name], t)
    cfg = json.loads((out / "config.json").read_text())
    qc = cfg.pop("quantization_config")
    assert qc == json.loads((out / "quantize_config.json").read_text())
    assert back.config == parent.config
    label = "gptq" if fmt == "gptq_v1" else "gptq_v2"
    assert qc["checkpoint_format"] == qc["format"] == label and back.meta["checkpoint_format"] == label
    assert (qc["bits"], qc["group_size"], qc["desc_act"], qc["sym"]) == (bits, GROUP, ao, sym)
    assert qc["quant_method"] == qc["method"] == "gptq" and qc["lm_head"] is False and qc["pack_dtype"] == "int32"
    assert qc["meta"]["quantizer"] == [f"matgptq:{matgptq.__version__}"] and "dynamic" not in qc
    assert {"true_sequential", "static_groups", "damp_percent"} <= set(qc)
    raw = load_file(str(out / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj"  # N = 64, K = 128
    assert raw[f"{name}.qweight"].dtype == torch.int32 and raw[f"{name}.qweight"].shape == (128 * bits // 32, 64)
    assert raw[f"{name}.qzeros"].dtype == torch.int32 and raw[f"{name}.qzeros"].shape == (4, 64 * bits // 32)
    assert raw[f"{name}.scales"].dtype == torch.float16 and raw[f"{name}.scales"].shape == (4, 64)
    assert raw[f"{name}.g_idx"].dtype == torch.int32 and f"{name}.weight" not in raw
    assert (out / "tokenizer.json").is_file()


@pytest.mark.parametrize(
    "bits,v1_word,v2_word", [(2, 0x55555555, 0xAAAAAAAA), (4, 0x77777777, 0x88888888), (8, 0x7F7F7F7F, 0x80808080)]
)
def test_symmetric_qzeros_words(parents, tmp_path, bits, v1_word, v2_word):
    """docs/formats.md §2.4: a symmetric layer stores one constant word (v1 = z − 1, v2 = z)."""
    for fmt, word in (("gptq_v1", v1_word), ("gptq_v2", v2_word)):
        export_gptq(parents["sym", False], tmp_path / fmt, fmt, bits=bits)
        qzeros = load_file(str(tmp_path / fmt / "model.safetensors"))["model.layers.1.self_attn.q_proj.qzeros"]
        assert (qzeros.numpy().view(np.uint32) == word).all()


def test_slice_scale_is_the_widths_scale_times_power_of_two(parents, tmp_path):
    export_gptq(parents["sym", False], tmp_path / "g", "gptq_v2", bits=3)
    raw = load_file(str(tmp_path / "g" / "model.safetensors"))
    q = read_checkpoint(parents["sym", False]).layers["model.layers.0.mlp.up_proj"]
    # the 3-bit slice's own scales (v2 parent), on the 3-bit grid: × 2^(8−3)
    assert torch.equal(raw["model.layers.0.mlp.up_proj.scales"], (q.width_scales[3].float() * 32).half().T)
    z = unpack_cols(raw["model.layers.0.mlp.up_proj.qzeros"].numpy(), 3, 128)
    assert (z == 4).all()


@pytest.fixture(scope="module")
def quantized(tiny_llama_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("gptq_q")
    common = dict(calib=CALIB, nsamples=8, seqlen=64, progress=False)
    sym, _ = matgptq.quantize(
        tiny_llama_dir,
        base / "sym",
        method="matgptq",
        bits=(2, 3, 4, 8),
        group_size=GROUP,
        act_order=True,
        static_groups=False,
        **common,
    )
    asym, _ = matgptq.quantize(tiny_llama_dir, base / "asym", method="gptq", bits=4, sym=False, group_size=-1, **common)
    return {"sym": sym, "asym": asym}


def test_the_default_column_order_exports_with_the_plain_layout(tiny_llama_dir, tmp_path):
    """GPTQ's default, act order with static groups, stores no permutation and g_idx = k // g, so the export says
    desc_act false (every GPTQ kernel's fast path) and reads back to the same weights and logits."""
    src, _ = matgptq.quantize(
        tiny_llama_dir,
        tmp_path / "q",
        method="gptq",
        bits=4,
        group_size=GROUP,
        calib=CALIB,
        nsamples=8,
        seqlen=64,
        progress=False,
    )
    layers = read_checkpoint(src).layers
    for q in layers.values():
        assert q.perm is None and torch.equal(q.g_idx.long(), torch.arange(q.shape[1]) // GROUP)
    out = export_gptq(src, tmp_path / "g", "gptq_v2")
    assert json.loads((out / "quantize_config.json").read_text())["desc_act"] is False
    back = read_gptq_checkpoint(out).layers
    assert all(torch.equal(back[name].dequantize(), q.dequantize()) for name, q in layers.items())
    assert torch.equal(_logits(matgptq.load(out)), _logits(matgptq.load(src)))


@pytest.mark.parametrize(
    "kind,bits,fmt",
    [
        ("sym", 2, "gptq_v1"),
        ("sym", 3, "gptq_v2"),
        ("sym", 4, "gptq_v1"),
        ("sym", 8, "gptq_v2"),
        ("asym", 4, "gptq_v2"),
    ],
)
def test_loaded_export_has_the_logits_of_the_slice(quantized, tmp_path, kind, bits, fmt):
    out = export_gptq(quantized[kind], tmp_path / "g", fmt, bits=bits)
    back = read_gptq_checkpoint(out)
    for name, q in read_checkpoint(quantized[kind]).layers.items():
        assert (kind == "sym") == bool(q.width_scales)  # the default MatGPTQ variant stores per-width scales
        assert torch.equal(back.layers[name].dequantize(), q.slice(bits).dequantize()), name
    assert torch.equal(_logits(matgptq.load(out)), _logits(matgptq.load(quantized[kind], bits=bits)))
    qc = json.loads((out / "quantize_config.json").read_text())
    assert qc["desc_act"] == (kind == "sym") and qc["group_size"] == (GROUP if kind == "sym" else -1)


def test_mixed_widths_use_dynamic_overrides(quantized, tmp_path):
    names = list(read_checkpoint(quantized["sym"]).layers)
    mix = {"*": 4, names[0]: 2, names[1]: 3, names[-1]: 8}
    (tmp_path / "mix.json").write_text(json.dumps(mix))
    out = export_gptq(quantized["sym"], tmp_path / "g", "gptq_v2", bits_config=tmp_path / "mix.json")
    qc = json.loads((out / "quantize_config.json").read_text())
    assert qc["bits"] == 4
    assert qc["dynamic"] == {f"+:^{n.replace('.', chr(92) + '.')}$": {"bits": r} for n, r in mix.items() if r != 4}
    back = read_gptq_checkpoint(out)
    assert {n: q.bits for n, q in back.layers.items()} == {n: mix.get(n, 4) for n in names}
    assert torch.equal(_logits(matgptq.load(out)), _logits(matgptq.load(quantized["sym"], bits=mix)))


def test_cli_export_and_eval(quantized, tmp_path, capsys):
    out = tmp_path / "g"
    assert main(["export", str(quantized["sym"]), "--format", "gptq_v1", "--bits", "3", "--out", str(out)]) == 0
    text = tmp_path / "t.txt"
    text.write_text(" ".join(CALIB))
    assert main(["eval", str(out), "--text", str(text), "--seqlen", "32", "--max-tokens", "64"]) == 0
    assert "ppl" in capsys.readouterr().out
    assert main(["export", str(quantized["sym"]), "--format", "gptq_v1", "--bits", "3", "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
