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
  up here; the readers line `matgptq export` prints (exporters/readers.py) is checked against each load's outcome.
  * Ragged groups written as such (group_size 32 on 172 columns) fail in both readers ("tensor column shape must be
    divisble by the given group_size"); the export therefore repeats scales at group size gcd(g, K) instead
    (test_ct_decompressor_refuses_ragged_groups). The export checked without the peer, and its refusals:
    test_compressed_tensors_export.py (sources and exports: ct_helpers.py, built once for both modules).

Tolerance of the logit comparison: 0. Both readers compute (q_ct − zp)·scale in the scale's dtype; the export stores
float32 scales (our float16 scale times 2^d, exact) and the integer q_ct − zp has at most 8 bits, so the product has
at most 8 + 11 significant bits < 24: exact in float32, equal to our dequantized weight s·(S·2^d − z) (the same
exact product). In a float32 model no cast follows, so each quantized Linear holds the very tensor matgptq.load
builds, every other tensor is the source's, and both models run the same LlamaForCausalLM forward on the same inputs
in one process: bit-identical logits. (Any change of a code, zero or scale moves the logits; a tolerance would only
hide a decoding error.)
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from matgptq.exporters.readers import ct_readers
from matgptq.formats.compressed_tensors import CT_VERSION, pack_int32
from matgptq.runtime import open_checkpoint
from tests.conftest import require_peer
from tests.exporters.ct_helpers import EXPORTS, _config, _expected, _per_column, _slices


@pytest.fixture(scope="module")
def cache(ct_cache):  # conftest.py's one Cache for both compressed-tensors modules: each source quantized once
    return ct_cache


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
    dumped = {
        "version": CT_VERSION,
        "quant_method": "compressed-tensors",
        "sparsity_config": {},
        "transform_config": {},
        **lib.model_dump(exclude=["quant_method"]),
    }
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
    sd = {
        "weight_packed": torch.from_numpy(pack_int32(q.codes.numpy(), 4)),
        "weight_shape": torch.tensor(q.shape),
        "weight_scale": q.scales.float() * 16,
    }
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
