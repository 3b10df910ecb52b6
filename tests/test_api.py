"""api.quantize options that no other test covers: the calibration dtype, and that the source model is never written
(the pipeline overwrites weights in place in the model's copy-on-write memory map)."""

import hashlib
import json

import pytest
from safetensors import safe_open

from matgptq.errors import UserError
from tests.conftest import make_tiny_llama, quick_quantize


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_bfloat16_calibration_writes_bfloat16_and_leaves_the_source_untouched(tmp_path):
    src = make_tiny_llama(tmp_path / "m")
    before = {p.name: sha(p) for p in src.iterdir() if p.is_file()}
    out = quick_quantize(src, tmp_path / "q", dtype="bfloat16")
    assert {p.name: sha(p) for p in src.iterdir() if p.is_file()} == before
    meta = json.loads((out / "matgptq.json").read_text())
    assert meta["calibration"]["dtype"] == "bfloat16"
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert str(f.get_slice("model.norm.weight").get_dtype()) in ("BF16", "bfloat16")
    quick_quantize(src, tmp_path / "q32")  # default: the model's own dtype, and the source still untouched
    assert {p.name: sha(p) for p in src.iterdir() if p.is_file()} == before


def half_copy(src, dst, dtype="bfloat16"):
    """The model at `src` stored in `dtype` (config.json's dtype too), with its tokenizer."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(src, dtype=getattr(torch, dtype)).save_pretrained(dst, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(src / name, dst / name)
    return dst


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
@pytest.mark.parametrize("native", [False, True])
def test_auto_calibrates_a_half_model_in_float32_on_a_cpu_without_it(tmp_path, monkeypatch, native, half):
    """run.calibration_dtypes (execution.compute_dtype): where the CPU emulates the model's half dtype, `auto`
    computes as --dtype float32 does (the same codes and scales) and writes the model's half tensors as they were;
    where it has it, `auto` is --dtype <half> byte for byte."""
    import torch
    from safetensors.torch import load_file

    from matgptq.execution import devices

    src = half_copy(make_tiny_llama(tmp_path / "m"), tmp_path / "half", half)
    monkeypatch.setattr(devices, "native_half", lambda dtype, dev: native)
    auto = quick_quantize(src, tmp_path / "auto")
    same = quick_quantize(src, tmp_path / "same", dtype=half if native else "float32")
    assert json.loads((auto / "matgptq.json").read_text())["calibration"]["dtype"] == (half if native else "float32")
    assert json.loads((auto / "config.json").read_text())["dtype"] == half
    got, want, source = (load_file(str(d / "model.safetensors")) for d in (auto, same, src))
    assert set(got) == set(want)
    for k, t in got.items():
        assert torch.equal(t, want[k].to(t.dtype)), k
        if k in source:  # the tensors stored as they are (norms, embeddings, lm_head)
            assert t.dtype == getattr(torch, half) and torch.equal(t, source[k]), k


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
@pytest.mark.parametrize("native", [False, True])
def test_eval_auto_scores_a_half_model_in_float32_on_a_cpu_without_it(tmp_path, monkeypatch, native, half):
    """evaluate's `auto` (execution.compute_dtype) is --dtype float32 where the CPU emulates the model's half dtype
    and the model's own where it has it: the very same scores as the explicit dtype, for the model and its
    reference."""
    import matgptq
    from matgptq.execution import devices
    from tests.conftest import TINYSTORIES

    src = half_copy(make_tiny_llama(tmp_path / "m"), tmp_path / "half", half)
    monkeypatch.setattr(devices, "native_half", lambda dtype, dev: native)
    kw = dict(text=str(TINYSTORIES), text_range=(0.0, 0.02), seqlen=64, max_tokens=512, kl_to=src, progress=False)
    auto = matgptq.evaluate(src, **kw)
    same = matgptq.evaluate(src, dtype=half if native else "float32", **kw)
    assert auto["dtype"] == same["dtype"] == (half if native else "float32")
    assert auto["results"] == same["results"]
    with pytest.raises(UserError, match="--dtype int8 is not one of auto, float32, bfloat16, float16"):
        matgptq.evaluate(src, dtype="int8", **kw)


def bfloat16_valued(src, dst):
    """The float32 model at `src` with every tensor rounded to a bfloat16 value, still stored in float32."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    save_file(
        {k: t.to(torch.bfloat16).float() for k, t in tensors.items()},
        str(dst / "model.safetensors"),
        metadata={"format": "pt"},
    )
    return dst


@pytest.mark.parametrize("method, bits", [("gptq", "4"), ("matgptq", "3,4")])
@pytest.mark.parametrize("native", [False, True])
def test_auto_calibrates_a_float32_model_in_bfloat16_where_the_cpu_has_it(tmp_path, monkeypatch, native, method, bits):
    """run.calibration_dtypes and quantization/narrow.py: where the CPU has bfloat16 arithmetic, `auto` GPTQ or
    MatGPTQ of a float32 model runs its passes on bfloat16 twins of the blocks. The oracle is the model itself in
    bfloat16: for a float32 model whose values are all bfloat16 values, `auto` gives --dtype bfloat16's codes and
    scales exactly (the passes and the weights the solver starts from are then the same), while its config and the
    tensors left unquantized stay the model's float32 ones. Without bfloat16 arithmetic, `auto` is --dtype float32
    byte for byte."""
    import torch
    from safetensors.torch import load_file

    from matgptq.execution import devices

    src = bfloat16_valued(make_tiny_llama(tmp_path / "m"), tmp_path / "bf")
    monkeypatch.setattr(devices, "native_half", lambda dtype, dev: native)
    auto = quick_quantize(src, tmp_path / "auto", method=method, bits=bits)
    same = quick_quantize(src, tmp_path / "same", method=method, bits=bits, dtype="bfloat16" if native else "float32")
    assert json.loads((auto / "matgptq.json").read_text())["calibration"]["dtype"] == (
        "bfloat16" if native else "float32"
    )
    assert json.loads((auto / "config.json").read_text())["dtype"] == "float32"
    got, want, source = (load_file(str(d / "model.safetensors")) for d in (auto, same, src))
    assert set(got) == set(want)
    for k, t in got.items():
        assert torch.equal(t, want[k].to(t.dtype)), k
        if k in source:  # norms, embeddings, lm_head: the model's own float32 tensors
            assert t.dtype == torch.float32 and torch.equal(t, source[k]), k


def test_bfloat16_passes_keep_the_float32_weights_they_do_not_quantize(tmp_path, monkeypatch):
    """A float32 model (values not bfloat16 ones) under bfloat16 passes: the layers `--skip` leaves out and every
    tensor outside the quantized weights are written exactly as in the source, in float32."""
    import torch
    from safetensors.torch import load_file

    from matgptq.execution import devices

    src = make_tiny_llama(tmp_path / "m")
    monkeypatch.setattr(devices, "native_half", lambda dtype, dev: True)
    out = quick_quantize(src, tmp_path / "q", skip=["model.layers.1.mlp.down_proj"])
    assert json.loads((out / "matgptq.json").read_text())["calibration"]["dtype"] == "bfloat16"
    got, source = (load_file(str(d / "model.safetensors")) for d in (out, src))
    kept = [k for k in got if k in source]
    assert "model.layers.1.mlp.down_proj.weight" in kept and "model.norm.weight" in kept
    for k in kept:
        assert got[k].dtype == torch.float32 and torch.equal(got[k], source[k]), k
    assert (
        source["model.layers.1.mlp.down_proj.weight"]
        .to(torch.bfloat16)
        .float()
        .ne(source["model.layers.1.mlp.down_proj.weight"])
        .any()
    )  # the check can fail: the source is not bfloat16-valued


def test_unknown_dtype_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="--dtype int8 is not one of auto, float32, bfloat16, float16"):
        quick_quantize(make_tiny_llama(tmp_path / "m"), tmp_path / "q", dtype="int8")


def same_tensors(a, b) -> bool:
    """The same tensors (safetensors' header order may differ between two writes of one dict)."""
    import torch
    from safetensors.torch import load_file

    ta, tb = load_file(str(a)), load_file(str(b))
    return set(ta) == set(tb) and all(torch.equal(ta[k], tb[k]) for k in ta)


@pytest.fixture(scope="module")
def parent(tiny_llama_dir, tmp_path_factory):
    return quick_quantize(
        tiny_llama_dir, tmp_path_factory.mktemp("api") / "parent", method="matgptq", bits="3,4,8", group_size=32
    )


def test_slice_evaluate_export_and_search_are_the_commands(parent, tmp_path):
    """The Python calls write and return exactly what the commands do (the commands call them; this guards the
    API's own argument handling): the same slice bytes, the same eval report, the same export bytes."""
    import torch

    import matgptq
    from matgptq.allocation import EvoConfig, parse_stages
    from matgptq.cli import main
    from tests.conftest import TINYSTORIES

    export = matgptq.export

    assert matgptq.slice(parent, 4, tmp_path / "a") == tmp_path / "a"
    assert main(["slice", str(parent), "--bits", "4", "--out", str(tmp_path / "b")]) == 0
    assert same_tensors(tmp_path / "a" / "model.safetensors", tmp_path / "b" / "model.safetensors")
    ids = torch.tensor([[1, 5, 9, 20]])
    assert torch.equal(matgptq.load(tmp_path / "a")(ids).logits, matgptq.load(parent, bits=4)(ids).logits)

    kw = dict(text=str(TINYSTORIES), text_range=(0.0, 0.05), seqlen=64, max_tokens=2048)
    report = matgptq.evaluate(parent, bits=[3, {"*": 4}], kl_to=parent, progress=False, **kw)
    assert (
        main(
            [
                "eval",
                str(parent),
                "--bits",
                "3",
                "--text",
                str(TINYSTORIES),
                "--text-range",
                "0:0.05",
                "--seqlen",
                "64",
                "--max-tokens",
                "2048",
                "--kl-to",
                str(parent),
                "--json",
                str(tmp_path / "e.json"),
            ]
        )
        == 0
    )
    from_cli = json.loads((tmp_path / "e.json").read_text())
    assert from_cli["results"][0] == report["results"][0] and report["results"][1]["bits"] == "4"
    assert 0 < report["results"][1]["kl"] < report["results"][0]["kl"]  # 4 bits are nearer the 8-bit reference than 3

    assert export(parent, tmp_path / "g.gguf", "gguf", bits=3) == tmp_path / "g.gguf"
    assert main(["export", str(parent), "--format", "gptq_v2", "--bits", "3", "--out", str(tmp_path / "c")]) == 0
    export(parent, tmp_path / "d", "gptq_v2", bits=3)
    assert same_tensors(tmp_path / "c" / "model.safetensors", tmp_path / "d" / "model.safetensors")
    with pytest.raises(ValueError, match="'gptq_v3' is not a valid ExportFormat"):
        export(parent, tmp_path / "x", "gptq_v3")

    quick = dict(calib_range=(0.6, 0.7), levels=(2, 4, 8), seqlen=64, sensitivity_tokens=126, progress=False)
    evo = EvoConfig(generations=2, offspring=4, stages=parse_stages("126:2,504:1"))
    rows = matgptq.search(parent, "3.0", TINYSTORIES, tmp_path / "m1", evo=evo, **quick)
    assert (
        main(
            [
                "search",
                str(parent),
                "--budget",
                "3.0",
                "--calib",
                str(TINYSTORIES),
                "--calib-range",
                "0.6:0.7",
                "--levels",
                "2,4,8",
                "--generations",
                "2",
                "--offspring",
                "4",
                "--stages",
                "126:2,504:1",
                "--seqlen",
                "64",
                "--sensitivity-tokens",
                "126",
                "--quiet",
                "--out",
                str(tmp_path / "m2"),
            ]
        )
        == 0
    )
    written = [json.loads((tmp_path / m / "mix-3.0.json").read_text()) for m in ("m1", "m2")]
    assert written[0]["bits"] == written[1]["bits"] and rows[0]["budget"] == "3.0"
