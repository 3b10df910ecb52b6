"""Architectures found from the model alone (models/arch.py `discover`): the decoder blocks and their layers, the
refusals, and the whole path a user takes (quantize, eval, slice, load, search) on tiny random models of the
architectures that have no written-out ArchSpec, as the pinned transformers builds them."""

import json
import shutil

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import matgptq
from matgptq.cli import main
from matgptq.errors import UserError
from matgptq.models.arch import ARCHITECTURES, arch_spec
from tests.conftest import STORIES, TINYSTORIES

SIZES = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
FOUND = {"gemma2": dict(head_dim=16), "gemma3_text": dict(head_dim=16), "olmo2": {}, "granite": {}}


def tiny_dir(path, model_type, seed=0, **extra):
    """A random model of `model_type` with stories260K's tokenizer (vocab 512), saved as safetensors."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **SIZES, **extra))
    model.save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(STORIES / name, path / name)
    return path


@pytest.mark.parametrize("model_type", sorted(FOUND))
def test_blocks_and_layers_are_found_without_a_table(model_type):
    assert model_type not in ARCHITECTURES
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **SIZES, **FOUND[model_type]))
    spec = arch_spec(model)
    assert spec.blocks == "model.layers" and spec.groups is None and not spec.conv1d
    assert spec.layers == (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    )
    assert not spec.residual_last and spec.attention_out is None  # no shortcut is assumed for an unknown block


def test_a_model_without_a_block_list_is_a_clear_error():
    class NoBlocks(torch.nn.Module):
        config = type("C", (), {"model_type": "toy", "num_hidden_layers": 2})()

        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

    with pytest.raises(UserError, match="no list of 2 decoder blocks found in the toy model"):
        arch_spec(NoBlocks())


@pytest.mark.parametrize("model_type", sorted(FOUND))
def test_quantize_eval_slice_load_and_search_end_to_end(model_type, tmp_path, capsys):
    model = tiny_dir(tmp_path / "fp", model_type, **FOUND[model_type])
    parent, mixes = tmp_path / "parent", tmp_path / "mixes"
    calib = ["--calib", str(TINYSTORIES), "--calib-range", "0.6:0.7", "--seqlen", "64"]
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
                *calib,
                "--quiet",
            ]
        )
        == 0
    )
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
        assert torch.equal(matgptq.load(parent, bits=4)(ids).logits, matgptq.load(tmp_path / "s4")(ids).logits)
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
                *calib,
                "--quiet",
            ]
        )
        == 0
    )
    mix = json.loads((mixes / "mix-3.5.json").read_text())
    assert len(mix["bits"]) == 2 * 7 and mix["summary"]["search_code_bits"] <= 3.5
