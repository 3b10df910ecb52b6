"""The layers an engine fuses (models/fused.py), found by tracing a meta forward: checked against the groups written
out by hand in models/arch.py ARCHITECTURES (split by module) and, for the architectures found without a table and
the mixture-of-experts ones, against vLLM's fused layers for them (its `packed_modules_mapping`: qkv_proj = q, k, v;
gate_up_proj = gate, up; one FusedMoE layer holding a block's experts)."""

import pytest
from transformers import AutoConfig

from matgptq.errors import UserError
from matgptq.models import arch
from matgptq.models.fused import block_groups, describe, fused_groups, fused_name, meta_model, mixed_groups
from tests.conftest import STORIES
from tests.models.test_arch import FOUND, SIZES
from tests.models.test_moe import MOE

QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
GATE_UP = ("mlp.gate_proj", "mlp.up_proj")
DENSE = (QKV, ("self_attn.o_proj",), GATE_UP, ("mlp.down_proj",))
WRITTEN = {"llama": {}, "mistral": {}, "qwen2": {}, "qwen3": dict(head_dim=16), "phi3": {}, "gpt2": {}}


def model_of(model_type: str, **extra):
    return meta_model(AutoConfig.for_model(model_type, **SIZES, **extra))


def by_module(groups) -> set[tuple[str, ...]]:
    """The written true-sequential groups (layers that read one tensor) split where the layers' modules differ."""
    out = set()
    for group in groups:
        for parent in dict.fromkeys(n.rpartition(".")[0] for n in group):
            out.add(tuple(n for n in group if n.rpartition(".")[0] == parent))
    return out


@pytest.mark.parametrize("model_type", sorted(WRITTEN))
def test_the_trace_finds_the_written_groups_without_reading_them(model_type, monkeypatch):
    written = arch.ARCHITECTURES[model_type].groups
    model = model_of(model_type, **WRITTEN[model_type])
    if model_type != "gpt2":  # GPT-2's forward cannot run on meta (its mask): the one architecture that falls back
        monkeypatch.delitem(arch.ARCHITECTURES, model_type)
    assert set(block_groups(model)) == by_module(written)


@pytest.mark.parametrize("model_type", sorted(FOUND))
def test_architectures_without_a_table_fuse_as_vllm_does(model_type):
    assert set(block_groups(model_of(model_type, **FOUND[model_type]))) == set(DENSE)


@pytest.mark.parametrize("model_type", sorted(MOE))
def test_a_blocks_experts_are_one_group(model_type):
    groups = block_groups(model_of(model_type, **MOE[model_type]))
    experts = tuple(f"mlp.experts.{e}.{p}" for p in ("gate_up_proj", "down_proj") for e in range(4))
    assert set(groups) == {QKV, ("self_attn.o_proj",), experts}


def test_a_shared_expert_is_fused_apart_from_the_routed_ones():
    extra = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
    groups = set(block_groups(model_of("qwen2_moe", **extra)))
    assert ("mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj") in groups
    assert ("mlp.shared_expert_gate",) in groups and ("mlp.shared_expert.down_proj",) in groups


def test_full_names_mixed_groups_and_their_words():
    config = AutoConfig.from_pretrained(STORIES)
    names = [f"model.layers.{i}.{n}" for i in range(config.num_hidden_layers) for g in DENSE for n in g]
    groups = fused_groups(config, names + ["lm_head"])
    assert len(groups) == 4 * config.num_hidden_layers + 1 and ("lm_head",) in groups
    assert tuple(f"model.layers.2.self_attn.{x}_proj" for x in "qkv") in groups
    widths = dict.fromkeys(names, 4) | {"model.layers.2.self_attn.k_proj": 3}
    del widths["model.layers.4.mlp.up_proj"]  # left unquantized: differs from its quantized gate_proj too
    mixed = mixed_groups(groups, widths)
    assert [describe(m) for m in mixed] == [
        "model.layers.2.self_attn.{q_proj: 4, k_proj: 3, v_proj: 4}",
        "model.layers.4.mlp.{gate_proj: 4, up_proj: float}",
    ]


@pytest.mark.parametrize(
    "model_type,block", [("qwen3_moe", "mlp"), ("mixtral", "mlp"), ("mixtral", "block_sparse_moe")]
)
def test_an_exported_files_experts_are_one_group_named_as_vllm_names_the_layer(model_type, block):
    """GPTQ and compressed-tensors files write each expert's gate_up_proj as gate_proj and up_proj (mixtral's
    compressed-tensors files under `block_sparse_moe`): a block's 12 are still one group, in the file's names, and
    the fused layer they make is vLLM's `<block>.experts` (tests/integrations/test_vllm_config_moe.py)."""
    config = AutoConfig.for_model(model_type, **SIZES, **MOE[model_type])
    experts = [
        f"model.layers.{i}.{block}.experts.{e}.{p}"
        for i in range(2)
        for e in range(4)
        for p in ("gate_proj", "up_proj", "down_proj")
    ]
    attention = [f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    groups = fused_groups(config, attention + experts)
    moe = [g for g in groups if len(g) > 3]
    assert [sorted(g) for g in moe] == [sorted(experts[:12]), sorted(experts[12:])]
    assert [fused_name(g) for g in moe] == [f"model.layers.{i}.{block}.experts" for i in range(2)]
    assert tuple(f"model.layers.1.self_attn.{x}_proj" for x in "qkv") in groups
    widths = dict.fromkeys(experts, 4) | {f"model.layers.1.{block}.experts.2.up_proj": 8}
    assert [describe(m) for m in mixed_groups(groups, widths) if len(m) > 3] == [
        f"model.layers.1.{block}.experts.{{2.up_proj: 8, … 11 more: 4}}"
    ]
    assert describe(dict.fromkeys(experts[:12], 8)) == f"model.layers.0.{block}.experts.{{all 12: 8}}"


def test_the_models_own_expert_names_keep_their_groups():
    """The parent's names (`…experts.<e>.gate_up_proj`, `down_proj`), as the search's --tie reads them."""
    config = AutoConfig.for_model("qwen3_moe", **SIZES, **MOE["qwen3_moe"])
    names = [f"model.layers.0.mlp.experts.{e}.{p}" for p in ("gate_up_proj", "down_proj") for e in range(4)]
    assert fused_groups(config, names) == [tuple(names)]
    assert fused_groups(config, names[4:]) == [tuple(names)]  # down_proj alone: still the model's spelling
    mixed = mixed_groups([tuple(names)], dict.fromkeys(names, 4) | {names[0]: 8, names[1]: 8, names[2]: 8, names[3]: 2})
    assert describe(mixed[0]) == (
        "model.layers.0.mlp.experts.{0.gate_up_proj: 8, 1.gate_up_proj: 8, 2.gate_up_proj: 8, … 5 more}"
    )  # 3.gate_up_proj at 2, the downs at 4


def test_a_model_whose_forward_cannot_be_traced_and_has_no_table_is_a_clear_error(monkeypatch):
    model = model_of("gpt2")
    monkeypatch.delitem(arch.ARCHITECTURES, "gpt2")
    with pytest.raises(UserError, match="meta device"):
        block_groups(model)
