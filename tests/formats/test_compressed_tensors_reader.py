"""compressed-tensors `pack-quantized` checkpoints read by matgptq.load and eval
(src/matgptq/formats/compressed_tensors/reader.py).

  (a) Round trip: matgptq.load of a compressed-tensors export equals matgptq.load of its source at that width, every
      tensor and the logits bit for bit (sym and asym, every width 2-8, group and channel scales, ragged groups,
      per-layer mixes; tolerance 0: both hold the same exact float32 weights, formats/compressed_tensors/writer.py).
  (b) The independent oracle: compressed-tensors' own target matching and decompressor read each export to exactly the
      weights our reader gives (compressed_tensors_reader_helpers.ct_weights; skipped without the peer).
  (c) Files written the way llm-compressor writes them: compressed-tensors' ModelCompressor compresses a model whose
      config groups target ["Linear"] and `re:` regexes with `ignore` (lm_head, a whole block), sym and asym, group,
      channel and tensor scales, float32 and bfloat16; matgptq.load holds exactly the weights compressed-tensors
      decompresses from the saved file.
  (e) `matgptq eval` scores an export exactly as it scores its source; sharded files and re-exports.
Damaged and unsupported inputs (d): test_compressed_tensors_reader_damaged.py.
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import matgptq
from matgptq.cli import main
from matgptq.errors import UserError
from matgptq.exporters.compressed_tensors import export_compressed_tensors
from matgptq.exporters.gptq import export_gptq
from matgptq.formats import read_ct_checkpoint
from matgptq.runtime import open_checkpoint
from tests.conftest import STORIES, TINYSTORIES, require_peer
from tests.formats.compressed_tensors_reader_helpers import EXPORTS, Cache, ct_weights


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return Cache(tmp_path_factory.mktemp("ct_read"))


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


# ------------------------------------------------------------------------------------------------- (a) round trip


@pytest.mark.parametrize("export_id", EXPORTS)
def test_export_loads_as_its_source(cache, export_id):
    ref = cache.reference(export_id)
    model = matgptq.load(cache.export(export_id), dtype=torch.float32, packed=False)
    want, got = ref.state_dict(), model.state_dict()
    assert sorted(got) == sorted(want)
    for key, t in want.items():
        assert torch.equal(got[key], t), key
    assert torch.equal(_logits(model, cache.ids), _logits(ref, cache.ids))
    assert model.matgptq.bits == ref.matgptq.bits  # each layer at its exported width


@pytest.mark.parametrize("export_id", ["sym-4bit", "asym-mix"])
def test_export_loads_as_its_source_in_bfloat16_packed(cache, export_id):
    """The default CPU load of a bfloat16 model (packed layers) computes the same as the source's."""
    ref = cache.reference(export_id, torch.bfloat16)
    model = matgptq.load(cache.export(export_id), dtype=torch.bfloat16, packed=True)
    dense = matgptq.load(cache.export(export_id), dtype=torch.bfloat16, packed=False)
    for name in ref.matgptq.bits:
        assert torch.equal(dense.get_submodule(name).weight, ref.get_submodule(name).weight), name
    assert torch.equal(
        _logits(model, cache.ids),
        _logits(
            matgptq.load(
                cache.source(EXPORTS[export_id][0]), bits=cache.bits(export_id), dtype=torch.bfloat16, packed=True
            ),
            cache.ids,
        ),
    )


def test_layers_are_plain_b_bit_layers(cache):
    """What the reader builds: shift-0 layers of the exported width, zeros 2^(b−1) when symmetric; the record."""
    ckpt = read_ct_checkpoint(cache.export("sym-3bit"))
    q = ckpt.layers["model.layers.0.mlp.down_proj"]
    assert (q.bits, q.shift, q.shape, q.scales.dtype) == (3, 0, (64, 172), torch.float16)
    assert torch.equal(q.zeros, torch.full((64, 43), 4, dtype=torch.uint8))  # group 4: the export's repeated scales
    assert torch.equal(q.g_idx, torch.arange(172, dtype=torch.int32) // 4)
    assert ckpt.meta["format"] == "compressed-tensors" and ckpt.meta["quantization"]["bits"] == 3
    assert "group_size" not in ckpt.meta["quantization"]  # groups of 4 and 32: no one group size
    record = read_ct_checkpoint(cache.export("asym-channel-4bit")).meta["quantization"]
    assert record == {"method": "gptq", "bits": 4, "sym": False, "act_order": False, "group_size": -1}
    assert "quantization_config" not in ckpt.config and ckpt.path == cache.export("sym-3bit")


# ------------------------------------------------------------------------------- (b) compressed-tensors' own reading


@pytest.mark.interop
@pytest.mark.parametrize("export_id", EXPORTS)
def test_compressed_tensors_decompresses_the_same_weights(cache, export_id):
    require_peer("compressed_tensors")
    theirs = ct_weights(cache.export(export_id))
    ours = open_checkpoint(cache.export(export_id)).layers
    assert sorted(theirs) == sorted(ours)  # the same Linears quantized: its matching is ours
    for name, q in ours.items():
        assert theirs[name].dtype == torch.float32 and torch.equal(theirs[name], q.dequantize()), name


# ------------------------------------------------------------------------------- (c) written as llm-compressor does


RECIPES = {  # config groups as an llm-compressor recipe gives them: class name and regex targets, ignore
    "w4a16": (
        {
            "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "group_size": 32, "strategy": "group"}},
            "group_1": {"targets": ["re:.*down_proj$"], "weights": {"num_bits": 4, "strategy": "channel"}},
        },
        ["lm_head"],
    ),
    "asym-mixed": (
        {
            "g3": {
                "targets": ["re:.*self_attn\\.[qk]_proj$"],
                "weights": {"num_bits": 3, "group_size": 16, "strategy": "group", "symmetric": False},
            },
            "g8": {
                "targets": ["re:.*mlp\\.(gate|up)_proj$", "model.layers.1.self_attn.o_proj"],
                "weights": {"num_bits": 8, "strategy": "channel", "symmetric": False},
            },
            "g5": {
                "targets": ["Linear"],
                "weights": {"num_bits": 5, "group_size": 4, "strategy": "group", "symmetric": False},
            },
            "g6": {"targets": ["re:.*o_proj$"], "weights": {"num_bits": 6, "strategy": "tensor"}},
        },
        ["lm_head", "re:model\\.layers\\.4\\..*"],
    ),
}


def _fake_quantized(dtype, groups: dict, ignore: list, out, fp16_scales: bool = True):
    """stories260K compressed by compressed-tensors itself the way llm-compressor saves a model: schemes applied,
    min-max scales and zero points set (its calculate_qparams; `fp16_scales`: rounded to float16 values, which
    matgptq's layers hold), then ModelCompressor.from_pretrained_model, compress_model, save_pretrained and
    update_config."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus, apply_quantization_config
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(STORIES, dtype=dtype)
    config = QuantizationConfig(config_groups=groups, ignore=ignore, quantization_status=QuantizationStatus.FROZEN)
    apply_quantization_config(model, config, show_progress=False)
    for _, module in model.named_modules():
        args = getattr(getattr(module, "quantization_scheme", None), "weights", None)
        if args is None:
            continue
        w = module.weight.detach()
        n, k = w.shape
        size = {"group": args.group_size, "channel": k, "tensor": n * k}[str(args.strategy)]
        blocks = w.reshape(-1, size)
        scale, zp = calculate_qparams(blocks.amin(-1), blocks.amax(-1), args)
        scale = scale.to(torch.float16).to(scale.dtype) if fp16_scales else scale
        shape = module.weight_scale.shape
        module.weight_scale.data.copy_(scale.reshape(shape))
        if getattr(module, "weight_zero_point", None) is not None:
            module.weight_zero_point.data.copy_(zp.reshape(shape))
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(out)
    return out


@pytest.mark.interop
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_llm_compressor_layout(tmp_path, recipe, dtype):
    require_peer("compressed_tensors")
    out = _fake_quantized(dtype, *RECIPES[recipe], tmp_path / "ct")
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "pack-quantized" and "Linear" in [
        t for g in qc["config_groups"].values() for t in g["targets"]
    ]
    theirs = ct_weights(out)
    model = matgptq.load(out, dtype=dtype, packed=False)
    assert sorted(model.matgptq.bits) == sorted(theirs)
    if recipe == "asym-mixed":  # ignore wins over every target: block 4 stays float
        assert not any(n.startswith("model.layers.4.") for n in theirs) and len(theirs) == 28
        assert {model.matgptq.bits[n] for n in theirs} == {3, 5, 6, 8}
    for name, w in theirs.items():
        assert w.dtype == dtype and torch.equal(model.get_submodule(name).weight, w), name
    fp = load_file(str(out / "model.safetensors"))
    for key, t in fp.items():
        if key.endswith(".weight") and "norm" not in key:
            assert torch.equal(model.get_parameter(key), t), key  # float layers and embeddings as stored
    assert torch.isfinite(_logits(model, torch.tensor([[1, 20, 30, 40]]))).all()


@pytest.mark.interop
def test_float32_scales_float16_cannot_hold_are_refused(tmp_path):
    """A float32 model's llm-compressor file holds float32 scales; matgptq keeps float16 ones and never rounds."""
    require_peer("compressed_tensors")
    out = _fake_quantized(torch.float32, *RECIPES["w4a16"], tmp_path / "ct", fp16_scales=False)
    with pytest.raises(UserError, match="float32 scales that float16 cannot hold exactly") as e:
        matgptq.load(out)
    assert "\n" not in str(e.value)


# --------------------------------------------------------------------------------- (e) eval, shards, re-exports


def _ppl(capsys, tmp_path, argv, name):
    report = tmp_path / f"{name}.json"
    assert (
        main(["eval", *argv, "--text", str(TINYSTORIES), "--seqlen", "32", "--max-tokens", "96", "--json", str(report)])
        == 0
    ), capsys.readouterr().err
    return json.loads(report.read_text())["results"]


def test_eval_scores_export_as_its_source(cache, tmp_path, capsys):
    for export_id in ("sym-4bit", "asym-mix"):
        bits = cache.bits(export_id)
        argv = [str(cache.source(EXPORTS[export_id][0]))] + (["--bits", str(bits)] if bits else [])
        src = _ppl(capsys, tmp_path, argv, f"src-{export_id}")
        ct = _ppl(capsys, tmp_path, [str(cache.export(export_id))], f"ct-{export_id}")
        assert [(r["ppl"], r["tokens"], r["bits"]) for r in ct] == [(r["ppl"], r["tokens"], r["bits"]) for r in src]


def test_sharded_checkpoint_reads_the_same(cache, tmp_path):
    out = cache.export("asym-mix")
    shard = tmp_path / "sharded"
    shard.mkdir()
    tensors = load_file(str(out / "model.safetensors"))
    keys = sorted(tensors)
    files = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for f, names in files.items():
        save_file({k: tensors[k] for k in names}, str(shard / f), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: f for f, names in files.items() for k in names}}
    (shard / "model.safetensors.index.json").write_text(json.dumps(index))
    (shard / "config.json").write_text((out / "config.json").read_text())
    a, b = read_ct_checkpoint(out), read_ct_checkpoint(shard)
    assert sorted(a.tensors) == sorted(b.tensors) and all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
    for name, q in a.layers.items():
        assert torch.equal(b.layers[name].dequantize(), q.dequantize()) and b.layers[name].bits == q.bits


@pytest.mark.parametrize("export_id", ["sym-3bit", "asym-mix", "asym-channel-4bit"])
def test_reexport_is_the_same_file(cache, tmp_path, export_id):
    """Exporting a compressed-tensors checkpoint (exporters/source.py opens it like any other) writes it again."""
    out = cache.export(export_id)
    again = export_compressed_tensors(out, tmp_path / "again")
    a, b = load_file(str(out / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    qc = [json.loads((d / "config.json").read_text())["quantization_config"] for d in (out, again)]
    assert qc[0] == qc[1]


def test_gptq_export_of_an_export(cache, tmp_path):
    """A compressed-tensors checkpoint of one group size exports to GPTQ like any source; one of several group sizes
    (the ragged repeat) records none, and the GPTQ export refuses it in one line."""
    out = export_gptq(cache.export("asym-channel-4bit"), tmp_path / "gptq", "gptq_v2")
    a = matgptq.load(out, dtype=torch.float32, packed=False)
    b = matgptq.load(cache.export("asym-channel-4bit"), dtype=torch.float32, packed=False)
    assert all(torch.equal(t, b.state_dict()[k]) for k, t in a.state_dict().items())
    with pytest.raises(UserError, match="does not record its group size") as e:
        export_gptq(cache.export("sym-4bit"), tmp_path / "refused", "gptq_v2")
    assert "\n" not in str(e.value) and not (tmp_path / "refused").exists()
