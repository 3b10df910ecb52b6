"""Mixture-of-experts models whose experts are fused 3-D tensors (models/experts.py): every expert projection its own
quantized layer, its Hessian from the tokens routed to it (checked against a hand-computed routing), the low-token
policy (quantization/experts.py), the router untouched, and the whole path a user takes (quantize, eval, slice,
load, search) on tiny random qwen3_moe, mixtral and gpt_oss models as the pinned transformers builds them."""

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM

import matgptq
from matgptq.cli import main
from matgptq.errors import UserError
from matgptq.formats import read_checkpoint
from matgptq.models import load_fp_model
from matgptq.models.arch import ARCHITECTURES, arch_spec
from matgptq.quantization.resume import BlockState
from tests.conftest import STORIES, TINYSTORIES
from tests.models.test_arch import SIZES, tiny_dir

MOE = {
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "gpt_oss": dict(
        num_local_experts=4,
        num_experts_per_tok=2,
        head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
}
ROUTER = {"qwen3_moe": "mlp.gate", "mixtral": "mlp.gate", "gpt_oss": "mlp.router"}
CALIB = ["--calib", str(TINYSTORIES), "--calib-range", "0.6:0.7", "--seqlen", "64"]


def tensors(path) -> dict[str, torch.Tensor]:
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.mark.parametrize("model_type", sorted(MOE))
def test_each_expert_projection_is_its_own_layer(model_type):
    assert model_type not in ARCHITECTURES
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **SIZES, **MOE[model_type]))
    spec = arch_spec(model)
    experts = tuple(f"mlp.experts.{e}.{p}" for p in ("gate_up_proj", "down_proj") for e in range(4))
    assert spec.layers == ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", *experts)
    assert [(fe.path, fe.count, fe.transposed) for fe in spec.experts] == [("mlp.experts", 4, model_type == "gpt_oss")]


@pytest.mark.parametrize("model_type", sorted(MOE))
def test_quantize_eval_slice_load_and_search_end_to_end(model_type, tmp_path):
    model = tiny_dir(tmp_path / "fp", model_type, **MOE[model_type])
    parent, mixes = tmp_path / "parent", tmp_path / "mixes"
    assert (
        main(
            [
                "quantize",
                str(model),
                "--out",
                str(parent),
                "--method",
                "matgptq",
                "--bits",
                "3,4,8",
                "--nsamples",
                "8",
                *CALIB,
                "--quiet",
            ]
        )
        == 0
    )
    fp, q = load_fp_model(model).state_dict(), tensors(parent)  # (mixtral's files name its tensors the old way)
    for i in range(2):
        router = f"model.layers.{i}.{ROUTER[model_type]}.weight"
        assert torch.equal(fp[router], q[router])  # the router stays float, bit for bit
    assert "model.layers.0.mlp.experts.gate_up_proj" not in q and "model.layers.0.mlp.experts.3.down_proj.codes" in q
    meta = json.loads((parent / "matgptq.json").read_text())
    routed = [r for r in meta["report"] if ".experts." in r["name"]]
    assert len(routed) == 2 * 2 * 4 and all(r["tokens"] > 0 for r in routed) and meta["experts"]["starved"] == {}
    report = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                str(parent),
                "--bits",
                "3,8",
                "--kl-to",
                str(model),
                "--text",
                str(TINYSTORIES),
                "--text-range",
                "0:0.01",
                "--seqlen",
                "64",
                "--max-tokens",
                "512",
                "--json",
                str(report),
            ]
        )
        == 0
    )
    kl = {str(r["bits"]): r["kl"] for r in json.loads(report.read_text())["results"]}
    assert 0 < kl["8"] < kl["3"]  # wider slices are closer to the float model
    assert main(["slice", str(parent), "--bits", "4", "--out", str(tmp_path / "s4")]) == 0
    ids = torch.randint(3, 512, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        four = matgptq.load(parent, bits=4)(ids).logits
        assert torch.equal(four, matgptq.load(tmp_path / "s4")(ids).logits)
        assert torch.equal(four, AutoModelForCausalLM.from_pretrained(tmp_path / "s4")(ids).logits)  # transformers'
    assert (
        main(
            [
                "search",
                str(parent),
                "--out",
                str(mixes),
                "--budget",
                "3.5",
                "--levels",
                "3,4,8",
                "--generations",
                "2",
                "--offspring",
                "4",
                "--stages",
                "126:2,252:1",
                "--sensitivity-tokens",
                "126",
                "--tie",
                *CALIB,
                "--quiet",
            ]
        )
        == 0
    )
    mix = json.loads((mixes / "mix-3.5.json").read_text())
    assert len(mix["bits"]) == 2 * (4 + 8) and mix["summary"]["search_code_bits"] <= 3.5
    assert {b for n, b in mix["bits"].items() if ".experts." in n} - {3, 4, 8} == set()
    # tied: each block's experts are one unit, as vLLM runs them as one fused MoE layer
    experts = [{n for n in mix["bits"] if n.startswith(f"model.layers.{i}.mlp.experts.")} for i in range(2)]
    assert all(e in [set(g) for g in mix["tied"]] for e in experts)
    assert all(len({mix["bits"][n] for n in g}) == 1 for g in mix["tied"])


def moe_dir(path, model_type, edit):
    """tiny_dir's model with `edit` applied to it before it is saved."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **SIZES, **MOE[model_type]))
    with torch.no_grad():
        edit(model)
    model.save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(STORIES / name, path / name)
    return path


def test_gptq_with_some_experts_skipped_stores_their_fused_tensor_whole(tmp_path, capsys):
    model = tiny_dir(tmp_path / "fp", "qwen3_moe", **MOE["qwen3_moe"])
    parent = tmp_path / "gptq"
    assert (
        main(
            [
                "quantize",
                str(model),
                "--out",
                str(parent),
                "--method",
                "gptq",
                "--bits",
                "4",
                "--nsamples",
                "8",
                "--skip",
                r"layers\.0\.mlp\.experts\.0\.gate_up_proj$",
                *CALIB,
                "--quiet",
            ]
        )
        == 0
    )
    q = tensors(parent)
    assert "model.layers.0.mlp.experts.gate_up_proj" in q and "model.layers.1.mlp.experts.gate_up_proj" not in q
    assert "model.layers.0.mlp.experts.0.gate_up_proj.codes" not in q
    fp, ckpt = load_fp_model(model), read_checkpoint(parent)
    loaded = matgptq.load(parent)
    experts = loaded.model.layers[0].mlp.experts
    assert torch.equal(experts.gate_up_proj[0], fp.model.layers[0].mlp.experts.gate_up_proj[0])  # left float
    for e in range(1, 4):
        q = ckpt.layers[f"model.layers.0.mlp.experts.{e}.gate_up_proj"]
        assert torch.equal(experts.gate_up_proj[e], q.dequantize())
    report = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                str(parent),
                "--kl-to",
                str(model),
                "--text",
                str(TINYSTORIES),
                "--text-range",
                "0:0.01",
                "--seqlen",
                "64",
                "--max-tokens",
                "256",
                "--json",
                str(report),
            ]
        )
        == 0
    )
    assert 0 < json.loads(report.read_text())["results"][0]["kl"] < 1
    assert main(["export", str(parent), "--format", "gptq_v1", "--out", str(tmp_path / "x")]) == 2  # GPTQ: no --skip
    assert "leaves block Linears unquantized" in capsys.readouterr().err
    packed = matgptq.load(parent, packed=True)  # experts have no packed kernel: dense, and one line says so
    assert capsys.readouterr().err.startswith(
        "matgptq: 15 of 23 quantized layers run dense (float weights), not on packed codes: fused expert tensors"
    )
    with torch.no_grad():
        ids = torch.randint(3, 512, (1, 16), generator=torch.Generator().manual_seed(0))
        assert torch.equal(packed(ids).logits, loaded(ids).logits)  # float32: the packed path is exact


def test_starved_experts_are_reported_in_the_checkpoint(tmp_path):
    def never_route_to_expert_3(model):
        for block in model.model.layers:
            block.mlp.router.bias[3] = -1e4

    model = moe_dir(tmp_path / "fp", "gpt_oss", never_route_to_expert_3)
    parent = tmp_path / "parent"
    assert (
        main(
            [
                "quantize",
                str(model),
                "--out",
                str(parent),
                "--method",
                "gptq",
                "--bits",
                "4",
                "--nsamples",
                "2",
                *CALIB,
                "--quiet",
            ]
        )
        == 0
    )
    meta = json.loads((parent / "matgptq.json").read_text())
    starved = meta["experts"]["starved"]
    for i in range(2):  # expert 3 saw no token; 2 x 64 tokens x top-2 spread over 3 experts: < 128 (down's K) each
        assert starved[f"model.layers.{i}.mlp.experts.3.gate_up_proj"] == 0
        assert all(f"model.layers.{i}.mlp.experts.{e}.down_proj" in starved for e in range(4))
    assert "H_mean" in meta["experts"]["policy"]
    report = {r["name"]: r for r in meta["report"]}
    assert report["model.layers.0.mlp.experts.3.down_proj"]["starved"]
    assert "tokens" not in report["model.layers.0.self_attn.q_proj"]  # dense layers' reports are as before


def test_an_unknown_fused_layout_is_a_clear_error():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(2, 4, 4))

    class Toy(torch.nn.Module):
        config = type("C", (), {"model_type": "toy", "num_hidden_layers": 2})()

        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Block(), Block()])

    with pytest.raises(UserError, match="toy keeps w as a fused 3-D tensor in a layout matgptq does not know"):
        arch_spec(Toy())


class _Stop(Exception):
    pass


def test_a_stopped_run_resumes_to_the_uninterrupted_checkpoint(tmp_path, monkeypatch):
    """The model loaded whole (stream=False): the resumed run writes block 0's experts back into the fused tensors
    (block_io.restore) before quantizing block 1 on their outputs."""
    model = tiny_dir(tmp_path / "fp", "mixtral", **MOE["mixtral"])
    args = dict(
        calib=TINYSTORIES,
        calib_range=(0.6, 0.7),
        method="gptq",
        bits=4,
        nsamples=8,
        seqlen=64,
        progress=False,
        stream=False,
    )
    matgptq.quantize(model, tmp_path / "whole", **args)
    save = BlockState.save

    def stop_after_one(self, done, *rest):
        save(self, done, *rest)
        if done == 1:
            raise _Stop

    monkeypatch.setattr(BlockState, "save", stop_after_one)
    with pytest.raises(_Stop):
        matgptq.quantize(model, tmp_path / "out", **args)
    monkeypatch.undo()
    matgptq.quantize(model, tmp_path / "out", **args, resume=True)
    whole, out = tensors(tmp_path / "whole"), tensors(tmp_path / "out")
    assert sorted(whole) == sorted(out) and all(torch.equal(whole[k], out[k]) for k in whole)
    reports = [
        [{k: v for k, v in r.items() if k != "seconds"} for r in json.loads((d / "matgptq.json").read_text())["report"]]
        for d in (tmp_path / "whole", tmp_path / "out")
    ]
    assert reports[0] == reports[1] and reports[0][-1]["tokens"] > 0


@pytest.mark.parametrize("model_type", sorted(MOE))
def test_the_calibration_forward_computes_what_the_model_does(model_type):
    """Through the proxies (models/experts.py calibration_experts) the MoE module's output is the model's own, up to
    float summation order; afterwards the module is as it was."""
    from matgptq.models.experts import calibration_experts

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **SIZES, **MOE[model_type])).eval()
    block, spec = model.model.layers[0], arch_spec(model)
    x = torch.randn(2, 16, SIZES["hidden_size"], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        own = block.mlp(x)
        with calibration_experts(block, spec.experts):
            proxied = block.mlp(x)
            assert isinstance(block.get_submodule("mlp.experts.3.down_proj"), torch.nn.Linear)
        again = block.mlp(x)
    own, proxied, again = (o[0] if isinstance(o, tuple) else o for o in (own, proxied, again))
    torch.testing.assert_close(proxied, own, rtol=1e-5, atol=1e-6)
    assert torch.equal(again, own) and "0" not in block.mlp.experts._modules
