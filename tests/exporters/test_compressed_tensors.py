"""compressed-tensors `pack-quantized` export (src/matgptq/exporters/compressed_tensors.py), read by independent readers.

Readers (checked 2026-11-26 with compressed-tensors 0.19.0 on CPU; transformers 5.23.0 in .venv and 5.17.0 in
.venv-bench, where this file runs too: `PYTHONPATH=src .venv-bench/bin/python -m pytest <this file>`):
  * compressed-tensors' PackedQuantizationCompressor.decompress: every export below, exactly (test_ct_decompressor).
  * transformers, default from_pretrained (dequantize=False: the checkpoint's packed tensors are loaded into modules
    compressed-tensors prepares, and the first forward decompresses them): exact for every symmetric export, mixes
    and repeated-scale (ragged) layers included. Asymmetric: exact on 5.17; 5.23 (and 5.24, per
    /work/shared/reference/integration.md) refuse the packed `weight_zero_point` ([ceil(N·r/32), G]) because the
    module they prepare holds it unpacked ([N, G]) — "You set `ignore_mismatched_sizes` to `False`".
  * transformers, CompressedTensorsConfig(dequantize=True) (decompressed while loading): exact on 5.17 for all; on
    5.23 exact for single-config-group exports, asymmetric ones included, but a checkpoint of several config groups is
    decoded with the first group's scheme for every layer (wrong logits, or an error when shapes disagree).
  The last two are asserted as they are for transformers >= 5.23 (BROKEN below), so an upgrade that fixes them shows
  up here; the readers line `matgptq export` prints (export/readers.py) is checked against each load's outcome.
  * Not representable, refused by the export: act-order groups (compressed-tensors 0.19 removed actorder "group" and
    weight_g_idx: QuantizationArgs(actorder="group") raises), asymmetric slices whose zero is not a multiple of 2^d.
    Ragged groups written as such (group_size 32 on 172 columns) fail in both readers ("tensor column shape must be
    divisble by the given group_size"); the export therefore repeats scales at group size gcd(g, K) instead.

Tolerance of the logit comparison: 0. Both readers compute (q_ct − zp)·scale in the scale's dtype; the export stores
float32 scales (our float16 scale times 2^d, exact) and the integer q_ct − zp has at most 8 bits, so the product has
at most 8 + 11 significant bits < 24: exact in float32, equal to our dequantized weight s·(S·2^d − z) (the same
exact product). In a float32 model no cast follows, so each quantized Linear holds the very tensor matgptq.load
builds, every other tensor is the source's, and both models run the same LlamaForCausalLM forward on the same inputs
in one process: bit-identical logits. (Any change of a code, zero or scale moves the logits; a tolerance would only
hide a decoding error.)
"""

import json
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import matgptq
from matgptq.cli import main
from matgptq.exporters.readers import ct_readers
from matgptq.errors import UserError
from matgptq.exporters.compressed_tensors import CT_VERSION, export_compressed_tensors, pack_int32, unpack_int32
from matgptq.formats.parent import read_checkpoint
from matgptq.runtime import open_checkpoint

from tests.conftest import STORIES, quick_quantize, require_peer

TINY_LAYERS = [f"model.layers.{i}.{m}" for i in range(2) for m in ("self_attn.q_proj", "self_attn.k_proj",
               "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]  # fmt: skip
MIX = {n: (2, 3, 4, 6, 8)[i % 5] for i, n in enumerate(TINY_LAYERS)}  # every width, 5 config groups
ASYM_MIX = {"*": 4, **{n: 3 for n in TINY_LAYERS[::3]}, **{n: 8 for n in TINY_LAYERS[1::4]}}

SOURCES = {  # name: (model, quantize options); "tiny" is conftest's random Llama (K = 64, 128)
    "sym-g32": ("tiny", dict(method="matgptq", bits=(2, 3, 4, 6, 8), group_size=32)),
    "sym-g64-ao": ("tiny", dict(method="matgptq", bits=(3, 4), group_size=64, act_order=True, static_groups=True)),
    "sym-channel": ("tiny", dict(method="gptq", bits=6, group_size=-1)),
    "asym-g64": ("tiny", dict(method="gptq", bits=4, sym=False, group_size=64)),
    "asym-mix": ("tiny", dict(method="gptq", bits_config=ASYM_MIX, sym=False, group_size=32)),
    "stories-sym-g32": (STORIES, dict(method="matgptq", bits=(2, 4, 8), group_size=32)),  # down_proj: 172 columns
    "stories-asym-channel": (STORIES, dict(method="gptq", bits=3, sym=False, group_size=-1)),
    "stories-skip": (STORIES, dict(method="gptq", bits=4, group_size=32, skip=("down_proj$",))),  # left unquantized
    "ao-dynamic": ("tiny", dict(method="gptq", bits=4, group_size=32, act_order=True)),  # refused
    "asym-parent": ("tiny", dict(method="matgptq", bits=(4, 8), sym=False, group_size=32)),  # 4-bit slice refused
    "sym-g32-signed": ("tiny", dict(method="gptq", bits=4, target="gguf")),  # llama.cpp's grid: scales of either sign
}
EXPORTS = {  # id: (source, bits); None = the stored widths
    **{f"sym-g32-{b}bit": ("sym-g32", b) for b in (2, 3, 4, 6, 8)},
    "sym-g32-mix": ("sym-g32", "MIX"),
    "sym-g64-actorder-static-3bit": ("sym-g64-ao", 3),
    "sym-channel-6bit": ("sym-channel", 6),
    "asym-g64-4bit": ("asym-g64", 4),
    "asym-mix": ("asym-mix", None),
    "stories-sym-g32-ragged-4bit": ("stories-sym-g32", 4),
    "stories-sym-g32-ragged-2bit": ("stories-sym-g32", 2),
    "stories-asym-channel-3bit": ("stories-asym-channel", 3),
    "stories-skip-down-proj-4bit": ("stories-skip", 4),
    "sym-g32-signed-scales-4bit": ("sym-g32-signed", 4),
}


WARNINGS = {  # the export's one-line warnings: words -> the exports that must (and only they) say them
    "do not tile their rows": lambda e: "ragged" in e,
}


class Cache:
    def __init__(self, tiny, base):
        self.tiny, self.base, self.items = tiny, base, {}
        self.ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(0))

    def _get(self, key, make):
        if key not in self.items:
            self.items[key] = make()
        return self.items[key]

    def source(self, name):
        model, kw = SOURCES[name]
        model = self.tiny if model == "tiny" else model
        return self._get(("src", name), lambda: quick_quantize(model, self.base / f"src-{name}", **kw))

    def bits(self, export_id):
        bits = EXPORTS[export_id][1]
        return MIX if bits == "MIX" else bits

    def export(self, export_id):
        def make():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = export_compressed_tensors(self.source(EXPORTS[export_id][0]), self.base / f"ct-{export_id}",
                                                bits=self.bits(export_id))  # fmt: skip
            said = " | ".join(str(w.message) for w in caught)
            for words, applies in WARNINGS.items():
                assert (words in said) == applies(export_id), (export_id, words, said)
            return out

        return self._get(("ct", export_id), make)

    def reference(self, export_id):
        """Logits and the float32 dense model of matgptq.load(source, bits)."""

        def make():
            model = matgptq.load(self.source(EXPORTS[export_id][0]), bits=self.bits(export_id), dtype=torch.float32,
                                 packed=False)  # fmt: skip
            with torch.no_grad():
                return model(self.ids).logits, model

        return self._get(("ref", export_id), make)


@pytest.fixture(scope="module")
def cache(tiny_llama_dir, tmp_path_factory):
    return Cache(tiny_llama_dir, tmp_path_factory.mktemp("ct"))


def _slices(cache, export_id):
    ckpt = open_checkpoint(cache.source(EXPORTS[export_id][0]))
    bits = cache.bits(export_id)
    widths = {n: q.bits for n, q in ckpt.layers.items()} if bits is None else (
        bits if isinstance(bits, dict) else dict.fromkeys(ckpt.layers, bits))  # fmt: skip
    return {n: ckpt.layers[n].slice(r) for n, r in widths.items()}, ckpt


def _config(out):
    return json.loads((out / "config.json").read_text())["quantization_config"]


def _schemes(qc):
    return {name: g["weights"] for g in qc["config_groups"].values() for name in g["targets"]}


def _per_column(t, weights, k):
    """[N, G'] (group or channel) → [N, K]: the value each column uses."""
    return t.repeat_interleave(k if weights["strategy"] == "channel" else weights["group_size"], dim=1)


def _expected(q):
    """Our slice in compressed-tensors terms, per column (module docstring of the exporter)."""
    r, d, idx = q.bits, q.shift, q.g_idx.long()
    zero = q.zeros.int()[:, idx]
    sym = bool((q.zeros.int() == 1 << (q.master_bits - 1)).all())
    return {"q": q.codes.int() - (1 << (r - 1)), "scale": q.scales.float()[:, idx] * float(1 << d),
            "zp": (zero >> d) - (1 << (r - 1)), "sym": sym}  # fmt: skip


# ------------------------------------------------------------------------------------- (c) pure: packer and reader


def _pack_bit_by_bit(u: np.ndarray, bits: int) -> np.ndarray:
    """The definition, one bit at a time: bit i of value k of a row is stream bit k·bits + i = bit (that mod 32) of
    word (that // 32); words are read as two's-complement int32."""
    rows, n = u.shape
    words = np.zeros((rows, -(-n * bits // 32)), dtype=np.int64)
    for row in range(rows):
        for k in range(n):
            for i in range(bits):
                if (int(u[row, k]) >> i) & 1:
                    j = k * bits + i
                    words[row, j // 32] |= 1 << (j % 32)
    return np.where(words >= 1 << 31, words - (1 << 32), words).astype(np.int32)


@pytest.mark.parametrize("bits", range(1, 9))
def test_packer_matches_bit_by_bit_definition(bits):
    gen = np.random.default_rng(bits)
    for n in (1, 7, 31, 32, 33, 64, 172):
        u = gen.integers(0, 1 << bits, size=(3, n), dtype=np.uint8)
        u[0, :] = (1 << bits) - 1  # all ones: every bit and the sign bit of every word
        words = pack_int32(u, bits)
        assert words.dtype == np.int32 and words.shape == (3, -(-n * bits // 32))
        assert np.array_equal(words, _pack_bit_by_bit(u, bits)), (bits, n)
        assert np.array_equal(unpack_int32(words, bits, n), u)
        assert np.array_equal(pack_int32(unpack_int32(words, bits, n), bits), words)  # padding bits stay zero


@pytest.mark.parametrize("export_id", EXPORTS)
def test_round_trip_through_our_reader(cache, export_id):
    """Our own reading of the written files gives back the slice exactly; layout, config and other tensors."""
    out = cache.export(export_id)
    slices, ckpt = _slices(cache, export_id)
    raw, qc = load_file(str(out / "model.safetensors")), _config(out)
    schemes = _schemes(qc)
    targets = [n for g in qc["config_groups"].values() for n in g["targets"]]
    assert sorted(targets) == sorted(slices) and len(targets) == len(set(targets))  # disjoint, complete
    skipped = [f"model.layers.{i}.mlp.down_proj" for i in range(5)] if "skip" in export_id else []
    assert qc["ignore"] == skipped + ["lm_head"]  # every other Linear, in module order
    assert (qc["quant_method"], qc["format"], qc["quantization_status"], qc["version"]) == (
        "compressed-tensors", "pack-quantized", "compressed", CT_VERSION)  # fmt: skip
    for name, q in slices.items():
        w, (n, k), want = schemes[name], q.shape, _expected(q)
        assert w["num_bits"] == q.bits and w["symmetric"] == want["sym"]
        assert raw[f"{name}.weight_shape"].dtype == torch.int64 and raw[f"{name}.weight_shape"].tolist() == [n, k]
        packed, scale = raw[f"{name}.weight_packed"], raw[f"{name}.weight_scale"]
        assert packed.dtype == torch.int32 and packed.shape == (n, -(-k * q.bits // 32))
        assert scale.dtype == torch.float32 and f"{name}.weight" not in raw
        codes = torch.from_numpy(unpack_int32(packed.numpy(), q.bits, k)).int() - (1 << (q.bits - 1))
        assert torch.equal(codes, want["q"])
        assert torch.equal(_per_column(scale, w, k), want["scale"])
        if want["sym"]:
            assert f"{name}.weight_zero_point" not in raw
            continue
        zp = raw[f"{name}.weight_zero_point"]
        assert zp.dtype == torch.int32 and zp.shape == (-(-n * q.bits // 32), scale.shape[1])
        zp = torch.from_numpy(unpack_int32(zp.numpy().T, q.bits, n).T).int() - (1 << (q.bits - 1))
        assert torch.equal(_per_column(zp, w, k), want["zp"])
        assert torch.equal((codes - _per_column(zp, w, k)) * _per_column(scale, w, k), q.dequantize())
    for name, t in ckpt.tensors.items():
        assert torch.equal(raw[name], t)
    assert (out / "tokenizer.json").is_file()


def test_ragged_groups_repeat_scales(cache):
    """stories260K's down_proj (172 columns) at group size 32 is written at gcd(32, 172) = 4, the rest at 32."""
    out = cache.export("stories-sym-g32-ragged-4bit")
    qc = _config(out)
    sizes = {g["weights"]["group_size"]: g["targets"] for g in qc["config_groups"].values()}
    assert sorted(sizes) == [4, 32] and all(n.endswith("down_proj") for n in sizes[4]) and len(sizes[4]) == 5
    scale = load_file(str(out / "model.safetensors"))["model.layers.0.mlp.down_proj.weight_scale"]
    assert scale.shape == (64, 43) and torch.equal(scale[:, :8], scale[:, :1].expand(-1, 8))


# ------------------------------------------------------------------------------------------ (d) refusals (CLI)


def _refused(capsys, argv, out, match):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("matgptq: error: ") and err.count("\n") == 1 and match in err, err
    assert not out.exists() and not list(out.parent.glob(f".{out.name}.tmp-*"))


def test_cli_writes_and_refuses(cache, tmp_path, capsys):
    src = str(cache.source("sym-g32"))
    out = tmp_path / "ct"
    assert main(["export", src, "--format", "compressed-tensors", "--bits", "4", "--out", str(out)]) == 0
    assert "compressed-tensors" in capsys.readouterr().out and (out / "config.json").is_file()
    before = (out / "model.safetensors").stat().st_mtime_ns
    assert main(["export", src, "--format", "compressed-tensors", "--bits", "3", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and err.count("\n") == 1
    assert (out / "model.safetensors").stat().st_mtime_ns == before and _config(out)["config_groups"]["group_0"][
        "weights"]["num_bits"] == 4  # fmt: skip
    new = tmp_path / "new"
    for bits in ("9", "1"):
        _refused(capsys, ["export", src, "--format", "compressed-tensors", "--bits", bits, "--out", str(new)], new,
                 f"cannot use {bits} bits")  # fmt: skip


@pytest.mark.parametrize("source,bits,match", [("ao-dynamic", "4", "--static-groups"),
                                               ("asym-parent", "4", "not multiples of 2^4")])  # fmt: skip
def test_cli_refuses_what_compressed_tensors_cannot_hold(cache, tmp_path, capsys, source, bits, match):
    out = tmp_path / "ct"
    _refused(capsys, ["export", str(cache.source(source)), "--format", "compressed-tensors", "--bits", bits, "--out",
                      str(out)], out, match)  # fmt: skip


def test_asym_parent_master_width_is_exact(cache, tmp_path):
    """The asymmetric parent refused at 4 bits exports at its master width (shift 0: every zero is an integer)."""
    out = export_compressed_tensors(cache.source("asym-parent"), tmp_path / "ct", bits=8)
    q = read_checkpoint(cache.source("asym-parent")).layers["model.layers.1.mlp.up_proj"]
    zp = load_file(str(out / "model.safetensors"))["model.layers.1.mlp.up_proj.weight_zero_point"]
    assert torch.equal(torch.from_numpy(unpack_int32(zp.numpy().T, 8, 128).T).int(), q.zeros.int())
    with pytest.raises(UserError, match="act-order"):
        export_compressed_tensors(cache.source("ao-dynamic"), tmp_path / "ao", bits=4)


# ------------------------------------------------------------------------ (b) compressed-tensors' own decompressor


@pytest.fixture(scope="module")
def ct():
    return require_peer("compressed_tensors")


@pytest.mark.interop
@pytest.mark.parametrize("export_id", EXPORTS)
def test_ct_decompressor(ct, cache, export_id):
    """PackedQuantizationCompressor unpacks our codes, scales and zero points, and its weights equal ours exactly;
    the config is the one compressed-tensors itself serializes (ModelCompressor.update_config's layout)."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from compressed_tensors.quantization import QuantizationConfig

    out = cache.export(export_id)
    qc = _config(out)
    lib = QuantizationConfig.model_validate({k: v for k, v in qc.items() if k in QuantizationConfig.model_fields})
    dumped = {"version": CT_VERSION, "quant_method": "compressed-tensors", "sparsity_config": {},
              "transform_config": {}, **lib.model_dump(exclude=["quant_method"])}  # fmt: skip
    assert json.loads(json.dumps(dumped, default=str)) == qc
    schemes = {n: g for g in lib.config_groups.values() for n in g.targets}
    raw = load_file(str(out / "model.safetensors"))
    slices, _ = _slices(cache, export_id)
    for name, q in slices.items():
        scheme, want, k = schemes[name], _expected(q), q.shape[1]
        sd = {key: raw[f"{name}.{key}"] for key in PackedQuantizationCompressor.compression_param_names(scheme)}
        codes = unpack_from_int32(sd["weight_packed"], q.bits, sd["weight_shape"])
        assert torch.equal(codes.int(), want["q"]), name
        w = scheme.weights.model_dump()
        assert torch.equal(_per_column(sd["weight_scale"], w, k), want["scale"])
        if not want["sym"]:
            zp = unpack_from_int32(sd["weight_zero_point"], q.bits, (q.shape[0], sd["weight_scale"].shape[1]), 0)
            assert torch.equal(_per_column(zp.int(), w, k), want["zp"])
        weight = PackedQuantizationCompressor.decompress(sd, scheme)["weight"]
        assert weight.dtype == torch.float32 and torch.equal(weight, q.dequantize()), name


@pytest.mark.interop
def test_ct_decompressor_refuses_ragged_groups(ct, cache):
    """Why ragged layers repeat their scales: written as they are (group size 32, ceil(172/32) = 6 scales per row),
    compressed-tensors cannot decompress them."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    name = "model.layers.0.mlp.down_proj"
    q = open_checkpoint(cache.source("stories-sym-g32")).layers[name].slice(4)
    scheme = QuantizationScheme(targets=[name], weights=QuantizationArgs(num_bits=4, group_size=32, strategy="group"))
    sd = {"weight_packed": torch.from_numpy(pack_int32(q.codes.numpy(), 4)), "weight_shape": torch.tensor(q.shape),
          "weight_scale": q.scales.float() * 16}  # fmt: skip
    assert sd["weight_scale"].shape == (64, 6)
    with pytest.raises(ValueError, match="group_size 32 but got 172"):
        PackedQuantizationCompressor.decompress(sd, scheme)


# --------------------------------------------------------------------------------- (a) transformers from_pretrained


@pytest.fixture(scope="module")
def transformers_ct(ct):
    import transformers
    from packaging.version import Version

    return Version(transformers.__version__) >= Version("5.23")  # BROKEN: the two bugs of the module docstring


def _load(out, ids, dequantize):
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    kw = {"quantization_config": CompressedTensorsConfig(dequantize=True)} if dequantize else {}
    model = AutoModelForCausalLM.from_pretrained(out, **kw)
    with torch.no_grad():
        return model(ids).logits, model


@pytest.mark.interop
@pytest.mark.parametrize("dequantize", [False, True], ids=["default", "dequantize"])
@pytest.mark.parametrize("export_id", EXPORTS)
def test_transformers_loads_export(transformers_ct, cache, export_id, dequantize):
    broken = transformers_ct
    out = cache.export(export_id)
    ref, ref_model = cache.reference(export_id)
    groups, asym = len(_config(out)["config_groups"]), "asym" in export_id
    # what the export's readers line says of this load: it must be what happens below
    reader = f"transformers {'5.23' if broken else '5.17'}"
    runs = ct_readers(out).runs
    said = f"{reader} with CompressedTensorsConfig(dequantize=True)" in runs if dequantize else reader in runs
    if broken and asym and not dequantize:
        assert not said
        with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
            _load(out, cache.ids, dequantize)
        return
    if broken and dequantize and groups > 1:
        assert not said
        try:
            logits, _ = _load(out, cache.ids, dequantize)
        except (RuntimeError, ValueError):
            return
        assert not torch.equal(logits, ref), "transformers' dequantize=True now reads mixed configs: fix readers.py"
        return
    assert said or (dequantize and reader in runs)  # a default-readable file is not also listed with dequantize=True
    logits, model = _load(out, cache.ids, dequantize)
    assert model.dtype == torch.float32
    for name in ref_model.matgptq.bits:
        assert torch.equal(model.get_submodule(name).weight.data, ref_model.get_submodule(name).weight.data), name
    assert torch.equal(logits, ref)  # tolerance 0: module docstring
