"""transformers' own `from_pretrained` on matgptq checkpoints (integrations/transformers.py), against `matgptq.load` of the
same checkpoint and widths: the same module types and bit-identical logits (both compute with the same modules from
the same integer data, so no tolerance applies). `make compat` runs this file on transformers 5.17 too."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

import matgptq
from matgptq.errors import UserError
from matgptq.formats import read_checkpoint
from matgptq.integrations.transformers import register
from matgptq.runtime.packed import PackedLinear
from tests.conftest import quick_quantize
from tests.models.test_hub import add_to_cache, hub_cache  # noqa: F401 — the offline cache fixture

# transformers' note that the passed config's loading attributes override the checkpoint's (asserted once below)
pytestmark = pytest.mark.filterwarnings("ignore:You passed `quantization_config`:UserWarning")
IDS = torch.tensor([[1, 5, 9, 20, 33, 7, 61, 2]])


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


@pytest.fixture(scope="module")
def parent(tiny_llama_dir, tmp_path_factory):
    return quick_quantize(
        tiny_llama_dir, tmp_path_factory.mktemp("hfq") / "parent", method="matgptq", bits="3,4,8", group_size=32
    )


def from_pretrained(path, **kw):
    if "bits" in kw or "packed" in kw:
        kw["quantization_config"] = matgptq.MatGPTQQuantizationConfig(
            bits=kw.pop("bits", None), packed=kw.pop("packed", None)
        )
    return AutoModelForCausalLM.from_pretrained(path, **kw)


def same_model(a, b) -> None:
    assert [type(m).__name__ for m in a.modules()] == [type(m).__name__ for m in b.modules()]
    assert a.matgptq.bits == b.matgptq.bits and a.dtype == b.dtype
    assert torch.equal(logits(a), logits(b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32-dense", "bfloat16-packed"])
@pytest.mark.parametrize("bits", [None, 3, 4], ids=["stored", "3bit", "4bit"])
def test_from_pretrained_equals_load(parent, dtype, bits):
    kw = {} if bits is None else {"bits": bits}
    model = from_pretrained(parent, dtype=dtype, **kw)
    same_model(model, matgptq.load(parent, bits=bits, dtype=dtype))
    layer = model.get_submodule("model.layers.0.mlp.up_proj")
    assert isinstance(layer, PackedLinear) == (dtype == torch.bfloat16)  # packed where `load` packs (CPU, bfloat16)
    assert set(model.matgptq.bits.values()) == {bits or 8}


def test_the_width_asked_for_is_the_width_loaded(parent):
    """Guards the override itself: 3 bits are not the stored 8 bits."""
    with pytest.warns(UserWarning, match=r"loading attributes \(e\.g\. \['bits', 'packed'\]\) will be overwritten"):
        three = from_pretrained(parent, bits=3)
    assert not torch.equal(logits(three), logits(from_pretrained(parent)))
    assert three.config.quantization_config.bits == 3 and three.config.quantization_config.stored_bits == 8


def test_a_mix_as_dict_or_file(parent, tmp_path):
    names = list(read_checkpoint(parent).layers)
    mix = {n: (3 if i % 2 else 8) for i, n in enumerate(names)}
    (tmp_path / "mix.json").write_text(json.dumps({"bits": mix}))  # as `matgptq search` nests it
    reference = matgptq.load(parent, bits=mix)
    same_model(from_pretrained(parent, bits=mix), reference)
    same_model(from_pretrained(parent, bits=str(tmp_path / "mix.json")), reference)
    same_model(from_pretrained(parent, bits=tmp_path / "mix.json"), reference)


def test_packed_can_be_forced_either_way(parent):
    same_model(
        from_pretrained(parent, dtype=torch.bfloat16, packed=False),
        matgptq.load(parent, dtype=torch.bfloat16, packed=False),
    )
    same_model(from_pretrained(parent, bits=4, packed=True), matgptq.load(parent, bits=4, packed=True))


def test_set_bits_switches_a_from_pretrained_model(parent):
    model = from_pretrained(parent, dtype=torch.bfloat16)
    for bits in (3, 6):
        matgptq.set_bits(model, bits)
        assert torch.equal(logits(model), logits(matgptq.load(parent, bits=bits, dtype=torch.bfloat16)))


def test_a_slice_and_a_mixed_width_gptq_checkpoint(parent, tiny_llama_dir, tmp_path):
    from matgptq.cli import main

    assert main(["slice", str(parent), "--bits", "4", "--out", str(tmp_path / "s4")]) == 0
    same_model(from_pretrained(tmp_path / "s4"), matgptq.load(parent, bits=4))
    with pytest.raises(UserError, match="holds only 4-bit"):
        from_pretrained(tmp_path / "s4", bits=3)
    names = list(read_checkpoint(parent).layers)
    mixed = quick_quantize(tiny_llama_dir, tmp_path / "mixed", bits_config={"*": 4, names[0]: 3}, group_size=32)
    assert "layer_bits" in read_checkpoint(mixed).meta
    same_model(from_pretrained(mixed), matgptq.load(mixed))


def test_a_parent_with_a_column_permutation(tiny_llama_dir, tmp_path):
    """Act order without static groups stores a permutation, whose check reads tensors: it runs on the CPU, not under
    transformers' init context (default device meta)."""
    p = quick_quantize(
        tiny_llama_dir,
        tmp_path / "p",
        method="matgptq",
        bits="3,4,8",
        group_size=32,
        act_order=True,
        static_groups=False,
    )
    assert read_checkpoint(p).layers["model.layers.0.mlp.up_proj"].perm is not None
    same_model(from_pretrained(p, bits=4), matgptq.load(p, bits=4))


def test_generate_runs(parent):
    out = from_pretrained(parent, bits=3).generate(IDS, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, IDS.shape[1] + 4)


def test_save_pretrained_refuses_in_one_line_and_writes_nothing(parent, tmp_path):
    with pytest.raises(UserError, match="matgptq slice") as e:
        from_pretrained(parent, bits=3).save_pretrained(tmp_path / "out")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


def test_an_unquantized_model_is_refused_with_the_command_that_quantizes(tiny_llama_dir):
    with pytest.raises(UserError, match="matgptq quantize"):
        from_pretrained(tiny_llama_dir, bits=3)


def test_a_damaged_checkpoint_is_one_error(parent, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(parent, bad)
    meta = json.loads((bad / "matgptq.json").read_text())
    meta["layers"]["model.layers.0.mlp.up_proj"] = [5, 7]
    (bad / "matgptq.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="up_proj"):
        from_pretrained(bad)
    (bad / "matgptq.json").unlink()
    with pytest.raises(UserError, match="matgptq.json"):
        from_pretrained(bad)


def test_a_hub_id_loads_from_the_cache(parent, hub_cache):  # noqa: F811 — the fixture
    snap = add_to_cache(hub_cache, "org/parent", parent)
    same_model(from_pretrained("org/parent", bits=3), matgptq.load(parent, bits=3))
    (snap / "matgptq.json").unlink()  # not cached, and the network is off: one error naming the file
    with pytest.raises(UserError, match="no matgptq.json"):
        from_pretrained("org/parent")


def test_registration_happens_once():
    assert register() is matgptq.MatGPTQQuantizationConfig


@pytest.mark.parametrize("first", ["matgptq", "transformers"])
def test_import_matgptq_is_light_and_still_registers(parent, first):
    """In a fresh interpreter: `import matgptq` imports neither torch, transformers nor Triton; whichever of matgptq
    and transformers' quantizer registry is imported first, from_pretrained of a parent then goes through matgptq's
    quantizer and gives `matgptq.load`'s logits."""
    import subprocess
    import sys

    code = f"""import sys
if {first!r} == "transformers":
    import transformers.quantizers.auto
import matgptq
if {first!r} == "matgptq":
    assert not {{"torch", "transformers", "triton"}} & set(sys.modules), sorted(sys.modules)
import torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained({str(parent)!r})
assert type(m.hf_quantizer).__name__ == "MatGPTQHfQuantizer", type(m.hf_quantizer)
x = torch.arange(12)[None]
assert torch.equal(m(x).logits, matgptq.load({str(parent)!r})(x).logits)
print("ok")"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-1500:]


def test_without_import_matgptq_transformers_misreads_a_parent_loudly(parent):
    """What plain transformers does with a parent (as docs/guide/serving.md says): it does not know the method, skips
    quantization and leaves every quantized weight MISSING (random), in its load report. Asserted as it is, so a
    transformers that starts refusing shows up here."""
    import subprocess
    import sys

    code = f"from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained({str(parent)!r})"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "mlp.up_proj.weight" in run.stderr and "MISSING" in run.stderr, run.stderr[-500:]
