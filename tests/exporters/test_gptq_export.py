"""GPTQ v1/v2 export and import without peer libraries: bit-exact round trips, logits, configs, refusals."""

import json
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import matgptq
from matgptq.cli import main
from matgptq.errors import UserError
from matgptq.exporters.gptq import export_gptq
from matgptq.formats.gptq_checkpoint import read_gptq_checkpoint
from matgptq.formats.gptq_packing import pack_cols, unpack_cols
from matgptq.formats.parent import read_checkpoint, save_checkpoint
from matgptq.formats.quantized import QuantizedWeight
from matgptq.formats.slicing import slice_codes

from tests.conftest import make_tiny_llama

GROUP = 32
CALIB = ["Once upon a time there was a little girl who liked to play in the park with her dog. " * 8] * 4


def _layer(n, k, sym, act_order, gen, master=8, group=GROUP):
    """A random parent layer: `master`-bit codes; sym zero 2^(master-1), asym zeros in [0, 2^master) including 0."""
    ngroups = -(-k // group) if group > 0 else 1
    codes = torch.randint(0, 1 << master, (n, k), generator=gen, dtype=torch.int32).to(torch.uint8)
    if sym:
        zeros = torch.full((n, ngroups), 1 << (master - 1), dtype=torch.uint8)
    else:
        zeros = torch.randint(0, 1 << master, (n, ngroups), generator=gen, dtype=torch.int32).to(torch.uint8)
        zeros[0, 0] = 0
    scales = (torch.rand(n, ngroups, generator=gen) * 0.01 + 1e-3).half()
    size = k if group == -1 else group
    perm = torch.randperm(k, generator=gen) if act_order else None
    order = torch.argsort(perm) if act_order else torch.arange(k)
    # per-width scales (a v2 parent, as the default variant writes) on sym parents: slices must carry them out
    width_scales = {r: (scales.float() * (0.9 + 0.2 * torch.rand(scales.shape, generator=gen))).half()
                    for r in range(2, master)} if sym else None  # fmt: skip
    return QuantizedWeight(codes, scales, zeros, (order // size).to(torch.int32), master, 0, perm, width_scales)


def synthetic(path, model_dir, sym=True, act_order=False, master=8, group=GROUP, shapes=None, seed=0):
    """A matgptq checkpoint of `model_dir`'s architecture with random codes (no calibration): fast, all combinations."""
    gen = torch.Generator().manual_seed(seed)
    fp = load_file(str(model_dir / "model.safetensors"))
    config = json.loads((model_dir / "config.json").read_text())
    if shapes is None:
        shapes = {k[: -len(".weight")]: tuple(v.shape) for k, v in fp.items() if k.endswith("_proj.weight")}
    layers = {name: _layer(n, k, sym, act_order, gen, master, group) for name, (n, k) in shapes.items()}
    tensors = {k: v for k, v in fp.items() if k[: -len(".weight")] not in layers}
    meta = {"quantization": {"method": "matgptq", "bits": master, "group_size": group, "sym": sym,
                             "act_order": act_order, "damp": 0.01, "true_sequential": True, "static_groups": False}}
    return save_checkpoint(path, config, tensors, layers, meta, model_dir)


@pytest.fixture(scope="module")
def parents(tiny_llama_dir, tmp_path_factory):
    """Synthetic parents: sym 8-bit (sliceable to any width) and asym r-bit (shift 0), each with/without act-order."""
    base = tmp_path_factory.mktemp("gptq_src")
    out = {}
    for ao in (False, True):
        out["sym", ao] = synthetic(base / f"sym{ao}", tiny_llama_dir, True, ao)
        for r in (2, 3, 4, 8):
            out["asym", r, ao] = synthetic(base / f"asym{r}{ao}", tiny_llama_dir, False, ao, master=r, seed=r)
    return out


def _source(parents, sym, bits, ao):
    return parents["sym", ao] if sym else parents["asym", bits, ao]


def _no_output(out):
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}.tmp-*")), "a temporary directory was left behind"


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


@pytest.mark.parametrize("bits,v1_word,v2_word", [(2, 0x55555555, 0xAAAAAAAA), (4, 0x77777777, 0x88888888),
                                                  (8, 0x7F7F7F7F, 0x80808080)])  # fmt: skip
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
    sym, _ = matgptq.quantize(tiny_llama_dir, base / "sym", method="matgptq", bits=(2, 3, 4, 8), group_size=GROUP,
                              act_order=True, **common)  # fmt: skip
    asym, _ = matgptq.quantize(tiny_llama_dir, base / "asym", method="gptq", bits=4, sym=False, group_size=-1, **common)
    return {"sym": sym, "asym": asym}


def _logits(model):
    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("kind,bits,fmt", [("sym", 2, "gptq_v1"), ("sym", 3, "gptq_v2"), ("sym", 4, "gptq_v1"),
                                           ("sym", 8, "gptq_v2"), ("asym", 4, "gptq_v2")])  # fmt: skip
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


# ----------------------------------------------------------------------------------------------------- odd shapes


@pytest.fixture(scope="module")
def odd_llama(tmp_path_factory):
    """Random Llamas whose MLP width does not fill int32 words: 172 (stories260K: pads at 2/4 bits) and 170 (also 8)."""
    base = tmp_path_factory.mktemp("odd")
    return {i: make_tiny_llama(base / str(i), intermediate=i) for i in (172, 170)}


# The last qzeros word of a 172-wide layer in GPTQModel 7.6.0's own stories260K checkpoints (sym, group size 32);
# test_gptq_interop.py compares whole files.
GPTQMODEL_LAST_QZEROS_WORD = {("gptq_v2", 4): 0x00008888, ("gptq_v1", 4): 0xEEEF7777, ("gptq_v1", 2): 0xAB555555}


@pytest.mark.parametrize("fmt", ["gptq_v1", "gptq_v2"])
@pytest.mark.parametrize("inter,bits", [(172, 2), (172, 4), (172, 8), (170, 8)])  # 172 fills whole words at 8 bits
def test_padded_shapes_round_trip(odd_llama, tmp_path, inter, bits, fmt):
    """Features that do not fill int32 words are zero-padded as GPTQModel pads them and read back exactly."""
    src = synthetic(tmp_path / "p", odd_llama[inter], act_order=bits == 4)
    fill = inter % (32 // bits) * bits  # bits used in the last word of a 172/170-value axis, 0 if it is full
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = export_gptq(src, tmp_path / "g", fmt, bits=bits)
    assert any("zero-padded" in str(w.message) for w in caught) == bool(fill)
    raw = load_file(str(out / "model.safetensors"))
    words = -(-inter * bits // 32)
    gate, down = "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.down_proj"  # 64 → inter, inter → 64
    assert raw[f"{gate}.qweight"].shape == (64 * bits // 32, inter) and raw[f"{gate}.qzeros"].shape == (2, words)
    assert raw[f"{down}.qweight"].shape == (words, 64) and raw[f"{down}.qzeros"].shape == (-(-inter // 32), 64 * bits // 32)
    assert raw[f"{down}.g_idx"].shape == (inter,) and raw[f"{gate}.scales"].shape == (2, inter)
    if fill:  # the unused high fields of the last word: zero codes; zero v2 zeros, from which v1 borrows
        last = raw[f"{down}.qweight"][-1].numpy().view(np.uint32)
        assert (last >> np.uint32(fill) == 0).all()
        stored = raw[f"{gate}.qzeros"][:, -1].numpy().view(np.uint32)
        v2_word = sum((1 << (bits - 1)) << (bits * i) for i in range(fill // bits))
        want = v2_word if fmt == "gptq_v2" else (v2_word - {2: 0x55555555, 4: 0x11111111, 8: 0x01010101}[bits]) % 2**32
        assert (stored == want).all()
        if inter == 172 and (fmt, bits) in GPTQMODEL_LAST_QZEROS_WORD:
            assert want == GPTQMODEL_LAST_QZEROS_WORD[fmt, bits]
    parent, back = read_checkpoint(src), read_gptq_checkpoint(out)
    for name, q in parent.layers.items():
        assert torch.equal(back.layers[name].codes, slice_codes(q.codes, q.bits, bits)), name
        assert torch.equal(back.layers[name].dequantize(), q.slice(bits).dequantize()), name
    assert torch.equal(_logits(matgptq.load(out)), _logits(matgptq.load(src, bits=bits)))
    if fmt == "gptq_v1":  # GPTQModel's reader path (word add) gives the same zeros
        _relabel(out, meta={"quantizer": ["gptqmodel:7.6.0"]})
        for name, q in read_gptq_checkpoint(out).layers.items():
            assert torch.equal(q.zeros, back.layers[name].zeros), name


def test_padded_asymmetric_v2_round_trip(odd_llama, tmp_path):
    src = synthetic(tmp_path / "p", odd_llama[172], sym=False, master=4)
    with pytest.warns(UserWarning, match="zero-padded"):
        out = export_gptq(src, tmp_path / "g", "gptq_v2", bits=4)
    back = read_gptq_checkpoint(out)
    for name, q in read_checkpoint(src).layers.items():
        assert torch.equal(back.layers[name].dequantize(), q.dequantize()), name
    assert torch.equal(_logits(matgptq.load(out)), _logits(matgptq.load(src)))


def test_padded_qweight_with_a_missing_row_is_refused(odd_llama, tmp_path):
    with pytest.warns(UserWarning, match="zero-padded"):
        out = export_gptq(synthetic(tmp_path / "p", odd_llama[172]), tmp_path / "g", "gptq_v2", bits=4)
    raw = load_file(str(out / "model.safetensors"))
    key = "model.layers.0.mlp.down_proj.qweight"
    raw[key] = raw[key][:-1].contiguous()  # 21 rows hold 168 of the 172 inputs g_idx names
    save_file(raw, str(out / "model.safetensors"))
    with pytest.raises(UserError, match=r"qweight \(21, 64\) for 172 inputs, which is not 4-bit GPTQ"):
        read_gptq_checkpoint(out)


# ------------------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("bits", [5, 6, 7])
def test_widths_without_gptq_packing_are_refused(parents, tmp_path, bits):
    with pytest.raises(UserError, match="no packing"):
        export_gptq(parents["sym", False], tmp_path / "g", "gptq_v2", bits=bits)
    _no_output(tmp_path / "g")


def test_fractional_asymmetric_zero_is_refused(tiny_llama_dir, tmp_path):
    src = synthetic(tmp_path / "p", tiny_llama_dir, sym=False, master=8)
    with pytest.raises(UserError, match="not multiples of 2"):
        export_gptq(src, tmp_path / "g", "gptq_v2", bits=4)
    _no_output(tmp_path / "g")
    export_gptq(src, tmp_path / "g8", "gptq_v2", bits=8)  # the parent width itself is exact


def test_asymmetric_slice_with_divisible_zeros_is_exported(tiny_llama_dir, tmp_path):
    src = synthetic(tmp_path / "p", tiny_llama_dir, sym=False, master=8)
    ck = read_checkpoint(src)
    layers = {n: QuantizedWeight(q.codes, q.scales, (q.zeros // 16) * 16, q.g_idx, 8) for n, q in ck.layers.items()}
    save_checkpoint(tmp_path / "p16", ck.config, ck.tensors, layers, ck.meta, src)
    export_gptq(tmp_path / "p16", tmp_path / "g", "gptq_v2", bits=4)
    back = read_gptq_checkpoint(tmp_path / "g")
    for n, q in layers.items():
        assert torch.equal(back.layers[n].dequantize(), q.slice(4).dequantize())


@pytest.mark.parametrize("fmt", ["gptq_v1", "gptq_v2"])
@pytest.mark.parametrize("n,k", [(172, 64), (64, 172), (32, 48)])
def test_three_bit_partial_block_is_refused(tiny_llama_dir, tmp_path, n, k, fmt):
    """3-bit GPTQ packs 32 values into 3 words; a partial block is refused (naming the layer and the way out)."""
    shapes = {"model.layers.0.mlp.down_proj": (n, k), "model.layers.1.mlp.down_proj": (64, 128)}
    src = synthetic(tmp_path / "p", tiny_llama_dir, shapes=shapes, group=-1)
    with pytest.raises(UserError, match=rf"layers\.0\.mlp\.down_proj has {n} output × {k} input.*multiples of 32.*"
                                        r"export 2, 4 or 8 bits.*--format gguf"):  # fmt: skip
        export_gptq(src, tmp_path / "g", fmt, bits=3)
    _no_output(tmp_path / "g")


def test_scale_overflow_is_refused(tiny_llama_dir, tmp_path):
    ck = read_checkpoint(synthetic(tmp_path / "p", tiny_llama_dir))
    layers = {n: QuantizedWeight(q.codes, torch.full_like(q.scales, 60000.0), q.zeros, q.g_idx, 8)
              for n, q in ck.layers.items()}  # fmt: skip
    save_checkpoint(tmp_path / "big", ck.config, ck.tensors, layers, ck.meta, None)
    export_gptq(tmp_path / "big", tmp_path / "g8", "gptq_v2", bits=8)
    with pytest.raises(UserError, match="overflows float16"):
        export_gptq(tmp_path / "big", tmp_path / "g", "gptq_v2", bits=2)
    _no_output(tmp_path / "g")


def test_bad_requests_are_refused(parents, tiny_llama_dir, tmp_path):
    src = parents["sym", False]
    for kwargs, match in [
        (dict(fmt="gptq_v3"), "unknown GPTQ format"),
        (dict(fmt="gptq_v2", bits=4, bits_config={"*": 4}), "either"),
        (dict(fmt="gptq_v2", bits=9), "cannot use 9 bits"),
    ]:
        with pytest.raises(UserError, match=match):
            export_gptq(src, tmp_path / "g", **kwargs)
        _no_output(tmp_path / "g")
    with pytest.raises(UserError, match="not quantized"):
        export_gptq(tiny_llama_dir, tmp_path / "g", "gptq_v2")
    (tmp_path / "exists").mkdir()
    with pytest.raises(UserError, match="already exists"):
        export_gptq(src, tmp_path / "exists", "gptq_v2", bits=4)
    export_gptq(src, tmp_path / "exists", "gptq_v2", bits=4, overwrite=True)


# --------------------------------------------------------------------------------------------------------- import


def _relabel(path, **fields):
    for f in (path / "quantize_config.json",):
        qc = json.loads(f.read_text())
        qc.update(fields)
        f.write_text(json.dumps(qc))
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"].update(fields)
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("written,label", [("gptq_v1", "gptq_v2"), ("gptq_v2", "gptq")])
def test_mislabelled_symmetric_checkpoint_trusts_the_data(parents, tmp_path, written, label):
    out = export_gptq(parents["sym", False], tmp_path / "g", written, bits=4)
    want = read_gptq_checkpoint(out)
    _relabel(out, checkpoint_format=label, format=label)
    with pytest.warns(UserWarning, match="labelled"):
        got = read_gptq_checkpoint(out)
    for n, q in want.layers.items():
        assert torch.equal(got.layers[n].dequantize(), q.dequantize())


def test_consistent_label_does_not_warn(parents, tmp_path):
    out = export_gptq(parents["sym", True], tmp_path / "g", "gptq_v1", bits=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_gptq_checkpoint(out)


def _asym_v1(parents, tmp_path, bits, gptqmodel_tag):
    """An asymmetric v1 checkpoint as GPTQModel writes it: v2 words minus a constant per word (borrows included)."""
    out = export_gptq(parents["asym", bits, False], tmp_path / "g", "gptq_v2", bits=bits)
    raw = load_file(str(out / "model.safetensors"))
    want = read_gptq_checkpoint(out)
    for k in [k for k in raw if k.endswith(".qzeros")]:
        if bits == 3:  # GPTQModel 3-bit: (z - 1) & 7 per field
            n = raw[k].shape[1] * 32 // 3
            raw[k] = torch.from_numpy(pack_cols((unpack_cols(raw[k].numpy(), 3, n).astype(np.int64) - 1) & 7, 3))
        else:
            words = raw[k].numpy().view(np.uint32).astype(np.int64) - {2: 0x55555555, 4: 0x11111111, 8: 0x01010101}[bits]
            raw[k] = torch.from_numpy((words & 0xFFFFFFFF).astype(np.uint32).view(np.int32))
    save_file(raw, str(out / "model.safetensors"))
    _relabel(out, checkpoint_format="gptq", format="gptq", meta={"quantizer": ["gptqmodel:7.6.0"] if gptqmodel_tag else []})
    return out, want


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_gptqmodel_asymmetric_v1_with_zero_points_of_zero(parents, tmp_path, bits):
    out, want = _asym_v1(parents, tmp_path, bits, gptqmodel_tag=True)
    assert any((q.zeros == 0).any() for q in want.layers.values())
    got = read_gptq_checkpoint(out)
    for n, q in want.layers.items():
        assert torch.equal(got.layers[n].zeros, q.zeros), n


def test_v1_zero_field_overflow_from_other_producers_is_refused(parents, tmp_path):
    out, _ = _asym_v1(parents, tmp_path, 3, gptqmodel_tag=False)
    with pytest.raises(UserError, match="re-export it as gptq_v2"):
        read_gptq_checkpoint(out)


def test_dynamic_negative_override_and_unsupported_checkpoints(parents, tmp_path):
    out = export_gptq(parents["sym", False], tmp_path / "g", "gptq_v2", bits=4)
    _relabel(out, dynamic={r"+:.*q_proj": {"bits": 8}})
    with pytest.raises(UserError, match="not 8-bit GPTQ"):
        read_gptq_checkpoint(out)
    _relabel(out, dynamic={r"-:.*mlp\.down_proj": {}})
    with pytest.raises(UserError, match="excludes"):
        read_gptq_checkpoint(out)
    _relabel(out, checkpoint_format="gptq_p", format="gptq_p", dynamic={})
    with pytest.raises(UserError, match="gptq_p"):
        read_gptq_checkpoint(out)
    _relabel(out, checkpoint_format="gptq_v2", format="gptq_v2", pack_dtype="int16")
    with pytest.raises(UserError, match="int16"):
        read_gptq_checkpoint(out)
    _relabel(out, pack_dtype="int32")
    (out / "model.safetensors").rename(out / "pytorch_model.bin")
    with pytest.raises(UserError, match="safetensors"):
        matgptq.load(out)


def test_gptq_source_converts_between_v1_and_v2(parents, tmp_path):
    v2 = export_gptq(parents["sym", True], tmp_path / "v2", "gptq_v2", bits=3)
    v1 = export_gptq(v2, tmp_path / "v1", "gptq_v1")  # a GPTQ checkpoint is a valid source too
    a, b = read_gptq_checkpoint(v2), read_gptq_checkpoint(v1)
    assert b.meta["checkpoint_format"] == "gptq" and json.loads((v1 / "quantize_config.json").read_text())["desc_act"]
    for n, q in a.layers.items():
        assert torch.equal(b.layers[n].dequantize(), q.dequantize())


def test_scales_in_other_dtypes_are_read_only_when_exact(parents, tmp_path):
    out = export_gptq(parents["sym", False], tmp_path / "g", "gptq_v2", bits=4)
    want = read_gptq_checkpoint(out)
    raw = load_file(str(out / "model.safetensors"))
    key = "model.layers.0.mlp.up_proj.scales"
    raw[key] = raw[key].float()
    save_file(raw, str(out / "model.safetensors"))
    assert torch.equal(read_gptq_checkpoint(out).layers[key[:-7]].dequantize(), want.layers[key[:-7]].dequantize())
    raw[key][0, 0] += 1e-6
    save_file(raw, str(out / "model.safetensors"))
    with pytest.raises(UserError, match="float16 cannot hold"):
        read_gptq_checkpoint(out)


def test_corrupt_tensors_are_reported(parents, tmp_path):
    out = export_gptq(parents["sym", False], tmp_path / "g", "gptq_v2", bits=4)
    raw = load_file(str(out / "model.safetensors"))
    raw["model.layers.0.mlp.up_proj.qzeros"] = raw["model.layers.0.mlp.up_proj.qzeros"][:, :-1].contiguous()
    save_file(raw, str(out / "model.safetensors"))
    with pytest.raises(UserError, match="corrupt"):
        read_gptq_checkpoint(out)
