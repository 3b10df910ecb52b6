"""compressed-tensors export of fused mixture-of-experts parents (qwen3_moe, mixtral, gpt_oss;
src/matgptq/formats/compressed_tensors/experts.py), against independent readers:

  * llm-compressor 0.14's own export of the same tiny models (data-free W4A16, group 32): the same tensor names,
    dtypes and shapes, key for key, and the same `quantization_config` but for the documented differences (targets:
    exact names here, mixtral's experts each followed by vLLM's spelling, ["Linear"] there; its observer). Live where .venv-bench exists, and against its layout recorded
    in ct_moe_helpers.py everywhere (test_layout_is_llm_compressors).
  * compressed-tensors 0.19's PackedQuantizationCompressor: every per-expert Linear it decompresses is, bit for bit,
    the expert's rows of matgptq.load's fused weight as transformers' forward reads them (gate = first half of
    gate_up's rows, or gpt_oss' even rows; fused_view in ct_moe_helpers.py), biases and float experts likewise.
  * the transformers 5 model rebuilt from those decompressed tensors, fused back into its 3-D experts, gives
    matgptq.load's logits; transformers' own from_pretrained does too for qwen3_moe files of one symmetric config
    group (5.17 and 5.23), and leaves mixtral's and gpt_oss' per-expert tensors unloaded, as it leaves
    llm-compressor's own files (checked by hand in .venv-bench, 5.17). This file also runs there:
    `PYTHONPATH=src .venv-bench/bin/python -m pytest tests/exporters/test_compressed_tensors_moe.py`.

Tolerance of every comparison: 0. compressed-tensors computes (q − zp)·scale in float32 from an integer of at most
8 bits and a float32 scale that is our float16 scale times 2^d (exact): at most 8 + 11 significant bits < 24, so the
product is exact and equals our dequantized s·(S·2^d − z), the same exact product (test_compressed_tensors.py). The
gate/up split only selects rows, each with its own scales and zeros, so no value changes. The rebuilt model and
matgptq.load's are the same transformers class in float32 holding the same tensors, run on the same inputs in one
process: the same operations on the same bits, hence identical logits.
"""

import json
import math
import re

import pytest
import torch
from safetensors.torch import load_file

import matgptq
from matgptq.errors import UserError
from matgptq.exporters.compressed_tensors import export_compressed_tensors
from matgptq.exporters.readers import ct_readers
from matgptq.formats.compressed_tensors import CT_VERSION
from matgptq.formats.parent import read_checkpoint
from tests.conftest import require_peer
from tests.exporters.ct_moe_helpers import (
    BENCH_PYTHON,
    LLMC_IGNORE,
    LLMC_LAYOUT,
    TYPES,
    CtMoECache,
    fused_view,
    header,
    layout,
    llmcompressor_exports,
)

EXPERTS_PER_LAYER = 4 * 3  # 4 experts × gate/up/down, 2 layers


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return CtMoECache(tmp_path_factory.mktemp("ct_moe"))


@pytest.fixture(scope="module")
def ct():
    return require_peer("compressed_tensors")


def _config(out):
    return json.loads((out / "config.json").read_text())["quantization_config"]


def _mix(cache, model_type):
    """Every expert projection's width cycling 4, 8, 2 (so gate/up/down of one expert differ), attention at 4."""
    names = sorted(read_checkpoint(cache.source(model_type, "sym")).layers)
    return {n: (4, 8, 2)[i % 3] if ".experts." in n else 4 for i, n in enumerate(names)}


def _reference(cache, model_type, kind, bits):
    """matgptq.load of the source at `bits`, float32, dense: the model every export must equal."""
    model = matgptq.load(cache.source(model_type, kind), bits=bits, dtype=torch.float32, packed=False)
    with torch.no_grad():
        return model, model(cache.ids).logits


def _decompressed(out):
    """{module: decompressed float32 weight} of every quantized module of the export, by compressed-tensors."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig

    qc = _config(out)
    lib = QuantizationConfig.model_validate({k: v for k, v in qc.items() if k in QuantizationConfig.model_fields})
    schemes = {n: g for g in lib.config_groups.values() for n in file_targets(g.targets)}
    raw = load_file(str(out / "model.safetensors"))
    weights = {}
    for name, scheme in schemes.items():
        sd = {k: raw[f"{name}.{k}"] for k in PackedQuantizationCompressor.compression_param_names(scheme)}
        weights[name] = PackedQuantizationCompressor.decompress(sd, scheme)["weight"]
    return weights, raw


CASES = [("sym", 4), ("sym", 2), ("sym", "mix"), ("asym", 4), ("skip", 4)]


@pytest.mark.interop
@pytest.mark.parametrize("kind,bits", CASES, ids=[f"{k}-{b}" for k, b in CASES])
@pytest.mark.parametrize("model_type", TYPES)
def test_ct_decompressor_gives_our_expert_weights(ct, cache, model_type, kind, bits):
    bits = _mix(cache, model_type) if bits == "mix" else bits
    out = cache.export(model_type, kind, bits)
    ref, _ = _reference(cache, model_type, kind, bits)
    weights, raw = _decompressed(out)
    experts = [n for n in weights if ".experts." in n]
    floats = sorted({k.rsplit(".", 1)[0] for k in raw if ".experts." in k and k.endswith(".weight")})
    assert len(experts) + len(floats) == 2 * EXPERTS_PER_LAYER and not [k for k in raw if "_proj_bias" in k]
    assert len(floats) == (2 * 2 if kind == "skip" else 0)  # experts 1 and 3's down_proj left float by --skip
    assert set(floats) <= set(_config(out)["ignore"])
    for name, w in weights.items():
        assert w.dtype == torch.float32 and torch.equal(w, fused_view(ref, name, model_type)), name
    for name in floats:
        assert torch.equal(raw[f"{name}.weight"], fused_view(ref, name, model_type)), name
    for key in (k for k in raw if k.endswith(".bias") and ".experts." in k):  # gpt_oss: biases follow their rows
        assert torch.equal(raw[key], fused_view(ref, key.removesuffix(".bias"), model_type, "bias")), key
    assert (model_type == "gpt_oss") == any(k.endswith(".bias") and ".experts." in k for k in raw)
    if isinstance(bits, dict):  # each config group holds exactly the layers of one width
        groups = {
            g["weights"]["num_bits"]: set(file_targets(g["targets"])) for g in _config(out)["config_groups"].values()
        }
        assert sorted(groups) == [2, 4, 8] and sum(map(len, groups.values())) == len(weights)


@pytest.mark.interop
@pytest.mark.parametrize("kind,bits", [("sym", 4), ("asym", 4), ("skip", 4)], ids=["sym-4", "asym-4", "skip-4"])
@pytest.mark.parametrize("model_type", TYPES)
def test_model_rebuilt_from_the_decompressed_tensors_gives_our_logits(ct, cache, model_type, kind, bits):
    """Every parameter of a fresh transformers model (NaN first, so a missed one shows) is written from the export:
    float tensors by name, per-expert weights and biases into their rows of the fused 3-D experts (fused_view)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    out = cache.export(model_type, kind, bits)
    _, want = _reference(cache, model_type, kind, bits)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(cache.model(model_type)), dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(math.nan)
        weights, raw = _decompressed(out)
        written = dict(weights)
        written.update({k.removesuffix(".weight"): v for k, v in raw.items() if k.endswith(".weight")})
        for name, w in written.items():
            fused_view(model, name, model_type).copy_(w)
        for key in (k for k in raw if k.endswith(".bias") or k.endswith(".sinks")):
            module, _, what = key.rpartition(".")
            fused_view(model, module, model_type, what).copy_(raw[key])
        assert not any(p.isnan().any() for p in model.parameters())
        assert torch.equal(model(cache.ids).logits, want)


VLLM_MIXTRAL = {"gate": ".w1", "up": ".w3", "down": ".w2"}  # vLLM 0.32's mixtral.py names of an expert's projections


def file_targets(targets: list[str]) -> list[str]:
    """The targets naming the file's modules: without the vLLM spellings of mixtral's experts (`…experts.<e>.w1`),
    which formats/compressed_tensors/experts.py adds after each expert's own name."""
    return [t for t in targets if not re.search(r"\.experts\.\d+\.w[123]$", t)]


def test_layout_is_llm_compressors(cache):
    """Against llm-compressor 0.14's layout of the same models, recorded (ct_moe_helpers.LLMC_LAYOUT): per-expert
    names (mixtral under block_sparse_moe), float routers listed in `ignore`, gpt_oss' expert biases."""
    for model_type in TYPES:
        out = cache.export(model_type, "sym", 4)
        keys = header(out)
        assert layout(keys) == LLMC_LAYOUT[model_type], model_type
        qc = _config(out)
        assert qc["ignore"] == LLMC_IGNORE[model_type]
        (group,) = qc["config_groups"].values()
        packed = sorted(k.removesuffix(".weight_packed") for k in keys if k.endswith(".weight_packed"))
        assert sorted(file_targets(group["targets"])) == packed and len(packed) == 2 * (4 + EXPERTS_PER_LAYER)
        vllm = (
            {
                re.sub(r"\.(gate|up|down)_proj$", lambda m: VLLM_MIXTRAL[m.group(1)], p)
                for p in packed
                if ".experts." in p
            }
            if model_type == "mixtral"
            else set()
        )
        assert set(group["targets"]) - set(packed) == vllm
        assert {k: group["weights"][k] for k in ("num_bits", "symmetric", "group_size", "strategy")} == {
            "num_bits": 4,
            "symmetric": True,
            "group_size": 32,
            "strategy": "group",
        }


@pytest.mark.skipif(not BENCH_PYTHON.is_file(), reason="llm-compressor needs .venv-bench (`make bench-venv`)")
def test_llm_compressor_writes_the_same_layout(cache, tmp_path):
    """llm-compressor 0.14 run now on the same float models: the same keys with the same dtypes and shapes, the
    same config but targets (["Linear"] there, exact names here: the same modules) and its observer; and its layout
    is still the one recorded for machines without .venv-bench."""
    theirs = llmcompressor_exports({t: cache.model(t) for t in TYPES}, tmp_path / "llmc")
    for model_type, path in theirs.items():
        ours = cache.export(model_type, "sym", 4)
        assert header(ours) == header(path), model_type
        assert layout(header(path)) == LLMC_LAYOUT[model_type], model_type
        qc, lc = _config(ours), _config(path)
        assert lc["ignore"] == LLMC_IGNORE[model_type] == qc["ignore"]
        assert {k: v for k, v in qc.items() if k != "config_groups"} == {
            k: v for k, v in lc.items() if k != "config_groups"
        }
        (mine,), (other,) = qc["config_groups"].values(), lc["config_groups"].values()
        assert other["targets"] == ["Linear"]
        assert sorted(file_targets(mine["targets"])) == sorted(
            k.removesuffix(".weight_packed") for k in header(path) if k.endswith(".weight_packed")
        )
        assert dict(mine["weights"], observer=None) == dict(other["weights"], observer=None)
        assert {k: v for k, v in mine.items() if k not in ("targets", "weights")} == {
            k: v for k, v in other.items() if k not in ("targets", "weights")
        }
        assert qc["version"] == CT_VERSION


TRANSFORMERS_CASES = [("sym", 4), ("asym", 4), ("sym", "mix")]


@pytest.mark.interop
@pytest.mark.parametrize("kind,bits", TRANSFORMERS_CASES, ids=[f"{k}-{b}" for k, b in TRANSFORMERS_CASES])
@pytest.mark.parametrize("model_type", TYPES)
def test_transformers_from_pretrained(ct, cache, model_type, kind, bits):
    """qwen3_moe: transformers merges symmetric per-expert tensors of one config group into its fused experts (its
    checkpoint conversion), and the default load runs the export; zero points fail its conversion (a RuntimeError),
    several config groups load with wrong weights (silently). mixtral and gpt_oss: it leaves the fused experts
    unloaded (missing keys, the per-expert tensors unexpected), as it does llm-compressor's own files. The readers
    line must say which, and an upgrade that reads more shows up here."""
    import transformers
    from packaging.version import Version
    from transformers import AutoModelForCausalLM

    bits = _mix(cache, model_type) if bits == "mix" else bits
    out = cache.export(model_type, kind, bits)
    ref, want = _reference(cache, model_type, kind, bits)
    reader = f"transformers {'5.23' if Version(transformers.__version__) >= Version('5.23') else '5.17'}"
    readers = ct_readers(out)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    except RuntimeError as e:  # zero points: 5.23 refuses them packed (test_compressed_tensors.py); 5.17 converts
        assert kind == "asym" and reader not in readers.runs, e  # the dense ones but fails on qwen3_moe's experts
        assert "ignore_mismatched_sizes" in str(e) or model_type == "qwen3_moe" and "conversion" in str(e), e
        return
    missing = [k for k in info["missing_keys"] if ".experts." in k]
    if reader not in readers.runs:
        if model_type == "qwen3_moe":  # several config groups: loaded, but decoded with one scheme
            assert isinstance(bits, dict) and not missing
            with torch.no_grad():
                assert not torch.equal(model(cache.ids).logits, want), "transformers now reads MoE mixes: readers.py"
        else:
            assert missing, (model_type, kind, readers.line())
        return
    assert not missing and not info["unexpected_keys"], info
    with torch.no_grad():
        logits = model(cache.ids).logits  # the first forward decompresses the attention's packed weights
    for name in (n for n in ref.matgptq.bits if ".experts." not in n):
        assert torch.equal(model.get_submodule(name).weight, ref.get_submodule(name).weight), name
    for name, p in model.named_parameters():  # the fused experts, merged by transformers from our per-expert tensors
        if ".experts." in name:
            assert torch.equal(p, ref.get_parameter(name)), name
    assert torch.equal(logits, want)


def test_readers_line_names_the_moe_limits(cache):
    for model_type in TYPES:
        line = ct_readers(cache.export(model_type, "sym", 4)).line()
        assert "compressed-tensors 0.19" in line and "vLLM" in line
        assert ("not in transformers" in line) == (model_type != "qwen3_moe"), line


def test_an_moe_type_llm_compressor_was_not_compared_on_is_one_line(cache, tmp_path):
    import shutil

    src = tmp_path / "olmoe"
    shutil.copytree(cache.source("qwen3_moe", "asym"), src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(dict(config, model_type="olmoe")))
    with pytest.raises(UserError) as e:
        export_compressed_tensors(src, tmp_path / "x", bits=4)
    assert "\n" not in str(e.value) and "olmoe" in str(e.value) and "--format gptq_v2" in str(e.value)
    assert not (tmp_path / "x").exists()
