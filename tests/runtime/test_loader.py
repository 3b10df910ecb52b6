"""matgptq.load: the loaded model computes with exactly the quantized weights; slicing, switching, mixes."""

import json

import pytest
import torch

import matgptq
from matgptq.cli import main
from matgptq.errors import UserError
from matgptq.formats.parent import read_checkpoint
from tests.conftest import TINYSTORIES

IDS = torch.tensor([[1, 20, 30, 40, 50, 60, 70, 80]])


@pytest.fixture(scope="module")
def parent(tiny_llama_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("rt") / "parent"
    matgptq.quantize(
        tiny_llama_dir,
        out,
        calib=TINYSTORIES,
        calib_range=(0.9, 1.0),
        method="matgptq",
        bits=(3, 4, 8),
        nsamples=8,
        seqlen=64,
        group_size=32,
        act_order=True,
        static_groups=False,
        progress=False,
    )
    return out


def logits(model):
    with torch.no_grad():
        return model(IDS).logits


def test_loaded_weights_are_the_dequantized_codes(parent):
    ckpt = read_checkpoint(parent)
    for bits in (8, 4, 6, 2):
        model = matgptq.load(parent, bits=bits)
        for name, q in ckpt.layers.items():
            assert torch.equal(model.get_submodule(name).weight.data, q.slice(bits).dequantize())
    assert model.training is False


def test_generate_works(parent):
    model = matgptq.load(parent, bits=4)
    out = model.generate(IDS, max_new_tokens=5, do_sample=False)
    assert out.shape == (1, IDS.shape[1] + 5)


def test_switching_width_in_memory_equals_loading_that_width(parent, monkeypatch):
    model = matgptq.load(parent)
    import matgptq.untrusted as ck  # every safetensors read goes through untrusted.read_tensors

    monkeypatch.setattr(ck, "load_file", lambda *a, **k: pytest.fail("set_bits must not re-read the file"))
    for bits in (3, 6, 8):
        matgptq.set_bits(model, bits)
        monkeypatch.undo()
        assert torch.equal(logits(model), logits(matgptq.load(parent, bits=bits)))
        monkeypatch.setattr(ck, "load_file", lambda *a, **k: pytest.fail("set_bits must not re-read the file"))


def test_per_layer_mix_from_dict_and_json(parent, tmp_path):
    names = list(read_checkpoint(parent).layers)
    mix = {n: (3 if i % 2 else 8) for i, n in enumerate(names)}
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(mix))
    a, b = matgptq.load(parent, bits=mix), matgptq.load(parent, bits=str(path))
    assert torch.equal(logits(a), logits(b))
    assert torch.equal(a.get_submodule(names[1]).weight, matgptq.load(parent, bits=3).get_submodule(names[1]).weight)
    with pytest.raises(UserError, match="misses"):
        matgptq.load(parent, bits={names[0]: 4})
    with pytest.raises(UserError, match="2..8"):
        matgptq.load(parent, bits=9)


def test_slice_command_writes_a_smaller_equivalent_checkpoint(parent, tmp_path):
    out = tmp_path / "s4"
    assert main(["slice", str(parent), "--bits", "4", "--out", str(out)]) == 0
    assert (out / "model.safetensors").stat().st_size < (parent / "model.safetensors").stat().st_size
    assert torch.equal(logits(matgptq.load(out)), logits(matgptq.load(parent, bits=4)))
    with pytest.raises(UserError, match="holds only 4-bit"):
        matgptq.load(out, bits=3)


def test_unquantized_model_loads_as_is(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    assert torch.equal(logits(matgptq.load(tiny_llama_dir)), logits(ref))


def test_quantization_is_reproducible_bit_exactly(tiny_llama_dir, tmp_path):
    from safetensors.torch import load_file

    from matgptq.formats.parent import read_checkpoint
    from matgptq.quantization import config_from_json

    kw = dict(
        calib=TINYSTORIES,
        calib_range=(0.9, 1.0),
        method="gptq",
        bits=3,
        nsamples=4,
        seqlen=64,
        group_size=32,
        act_order=True,
        static_groups=False,
        mse=True,
        progress=False,
    )
    a, _ = matgptq.quantize(tiny_llama_dir, tmp_path / "a", **kw)
    b, _ = matgptq.quantize(tiny_llama_dir, tmp_path / "b", **kw)
    ta, tb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")  # (header key order may vary)
    assert set(ta) == set(tb) and all(torch.equal(ta[k], tb[k]) for k in ta)
    meta = read_checkpoint(a).meta
    cfg = config_from_json(meta["quantization"])  # the recorded settings rebuild the same config
    assert cfg.bits == 3 and cfg.act_order and cfg.mse and cfg.group_size == 32
    assert meta["calibration"]["nsamples"] == 4 and meta["calibration"]["sha256"]


def test_skipped_layers_round_trip_and_exports(tiny_llama_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from matgptq.exporters.gguf import export_gguf
    from matgptq.exporters.gptq import export_gptq
    from matgptq.formats.gguf import read_gguf_weights

    out, _ = matgptq.quantize(
        tiny_llama_dir,
        tmp_path / "skip",
        calib=TINYSTORIES,
        calib_range=(0.9, 1.0),
        bits=4,
        nsamples=4,
        seqlen=64,
        group_size=32,
        signed_scale=True,
        skip=(r"mlp\.down_proj$",),
        progress=False,
    )
    ref = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    model = matgptq.load(out)
    name = "model.layers.1.mlp.down_proj"
    assert name not in model.matgptq.layers
    assert torch.equal(model.get_submodule(name).weight, ref.get_submodule(name).weight)
    assert bool((model.matgptq.layers["model.layers.0.mlp.up_proj"].scales < 0).any())
    with pytest.raises(UserError, match="--skip"):
        export_gptq(out, tmp_path / "g", "gptq_v2")
    assert not (tmp_path / "g").exists()
    report = export_gguf(out, tmp_path / "m.gguf", float_type="f32")
    weights = read_gguf_weights(tmp_path / "m.gguf")
    assert torch.equal(torch.from_numpy(weights[f"{name}.weight"]), ref.get_submodule(name).weight)
    assert report.exact
