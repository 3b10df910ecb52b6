"""Mixes of a mixture-of-experts model checked by vLLM's own config code (#96 item 3, MoE): a tiny qwen3_moe parent
(4 experts, 2 blocks; hidden size 128, so vLLM's GPTQ config takes its Marlin MoE path, the one that reads `dynamic`
rules, as it does for real models) exported as compressed-tensors and GPTQ (gptq_v2) with a tied mix and a split
one, and vLLM's loader code resolving every fused layer its Qwen3MoeForCausalLM builds: each block's qkv_proj and its
fused MoE layer `model.layers.<i>.mlp.experts` (tests/integrations/vllm_config_child.py; no weights are loaded).

What vLLM 0.32 does for a fused MoE layer (read in its source, asserted below):
  * compressed-tensors (compressed_tensors_moe.py `CompressedTensorsMoEMethod.get_moe_method`): it looks up the
    scheme of expert 0's gate_proj, up_proj and down_proj only, raises "All MoE projections need to have same
    quantization scheme but found multiple" where those three differ, and otherwise gives every expert of the block
    expert 0's scheme without looking at the others.
  * GPTQ (auto_gptq.py `AutoGPTQConfig.get_quant_method`, `get_moe_quant_method`; gptq_utils.py `override_config`):
    the `dynamic` rules are matched against the fused layer's own name, `…mlp.experts`, never an expert's; where none
    matches, the file's `bits`. Our exporter writes one rule per tied block of experts, matching that fused name and
    each expert's layers (formats/gptq/writer.py `dynamic_rules`), so the tied mix resolves as written; the same file
    with one rule per expert layer instead (`per_expert`) resolves to `bits`, as the readers line then says; and where
    the experts' shape is one its Marlin MoE kernel does not take (hidden size not a multiple of 128, or a group size
    that does not divide the intermediate size), its MoeWNA16 fallback (moe_wna16.py) reads the file's `bits` alone.
  * mixtral (compressed-tensors): its MixtralForCausalLM names the experts' projections w1/w3/w2 and looks up
    expert 0's scheme by those names, which our export adds after each expert's target
    (formats/compressed_tensors/experts.py); a file without them has its fused experts built unquantized.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from matgptq.cli import main
from matgptq.exporters.readers import ct_readers, gptq_readers
from matgptq.formats import read_checkpoint
from matgptq.models.fused import fused_groups, fused_name, mixed_groups
from tests.conftest import quick_quantize
from tests.exporters.test_readers import per_expert, tiny_moe

FORMATS = ("compressed-tensors", "gptq_v2")
EXPERTS = [f"model.layers.{i}.mlp.experts" for i in range(2)]

if importlib.util.find_spec("vllm") is None:  # a plain skip, as test_vllm.py's: the main venv never has vLLM
    pytest.skip(
        "vLLM is not installed in this venv: this file runs in `make vllm-test` (.venv-vllm)", allow_module_level=True
    )

from tests.integrations.test_vllm_config import resolve  # noqa: E402 (after the skip: it skips without vLLM too)


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    """(widths per mix, vLLM's resolution per export, {export: directory}), the child examining all in one process."""
    base, spec = tmp_path_factory.mktemp("vllm-config-moe"), {}

    def export(src: Path, name: str, *args: str) -> Path:
        spec[name] = str(base / name)
        assert main(["export", str(src), "--format", name.rpartition("-")[0], "--out", spec[name], *args]) == 0
        return base / name

    parent = quick_quantize(tiny_moe(base / "fp"), base / "parent", method="matgptq", bits="4,8", group_size=32)
    names = list(read_checkpoint(parent).layers)  # experts: model.layers.<i>.mlp.experts.<e>.gate_up_proj, down_proj
    # 4 and 8 bits: the widths vLLM's GPTQ MoE method takes. Tied: block 0's q/k/v and block 1's experts at 8.
    tied = {n: 8 for n in names if re.match(r"model\.layers\.0\.self_attn\.[qkv]_proj$", n) or n.startswith(EXPERTS[1])}
    mixes = {
        "tied": dict.fromkeys(names, 4) | tied,  # split: one projection of expert 0 (block 0), of expert 2 (1)
        "split": dict.fromkeys(names, 4) | {f"{EXPERTS[0]}.0.down_proj": 8, f"{EXPERTS[1]}.2.gate_up_proj": 8},
    }
    for mix, widths in mixes.items():
        (base / f"{mix}.json").write_text(json.dumps(widths))
        for fmt in FORMATS:
            export(parent, f"{fmt}-{mix}", "--bits-config", str(base / f"{mix}.json"))
    spec["gptq_v2-per-expert"] = str(per_expert(base / "gptq_v2-tied", base / "gptq_v2-per-expert", 1))
    small = quick_quantize(
        tiny_moe(base / "fp64", hidden=64), base / "parent64", method="matgptq", bits="4,8", group_size=32
    )
    export(small, "gptq_v2-64", "--bits-config", str(base / "tied.json"))
    mixtral = quick_quantize(tiny_moe(base / "mixtral", "mixtral"), base / "mixtral-q", bits=4, group_size=32)
    export(mixtral, "compressed-tensors-mixtral")
    spec["compressed-tensors-mixtral-bare"] = str(without_aliases(spec["compressed-tensors-mixtral"], base / "bare"))
    return mixes, resolve(base, spec), spec


def without_aliases(src: str, out: Path) -> Path:
    """A copy of compressed-tensors export `src` without the vLLM spellings of its experts (`…experts.<e>.w1`, w3,
    w2) in targets and `ignore`: a mixtral export as written before them."""
    import shutil

    shutil.copytree(src, out)
    config = json.loads((out / "config.json").read_text())
    qc = config["quantization_config"]
    bare = lambda names: [n for n in names if not re.search(r"\.experts\.\d+\.w[123]$", n)]  # noqa: E731
    for group in qc["config_groups"].values():
        group["targets"] = bare(group["targets"])
    qc["ignore"] = bare(qc["ignore"])
    (out / "config.json").write_text(json.dumps(config))
    return out


def parent_name(shard: str) -> str:
    """The parent's layer of an exported shard (an expert's gate_proj and up_proj are halves of its gate_up_proj)."""
    return re.sub(r"(\.experts\.\d+)\.(gate|up)_proj$", r"\1.gate_up_proj", shard)


def bits_of(resolution: str) -> int:
    assert resolution.endswith(" sym") and "bits" in resolution, resolution
    return int(resolution.split()[0])


def check_shards(layers: dict, widths: dict) -> None:
    """Every shard alone resolves to the width the mix gave it: the file says what it holds."""
    assert set(layers) == {f"model.layers.{i}.self_attn.qkv_proj" for i in range(2)} | set(EXPERTS)
    for got in layers.values():
        for shard, alone in got["shards"].items():
            assert bits_of(alone) == widths[parent_name(shard)], (shard, alone)
    assert all(len(layers[e]["shards"]) == 4 * 3 for e in EXPERTS)  # 4 experts × gate/up/down


def readers_of(spec: dict, name: str) -> str:
    return (ct_readers if name.startswith("compressed") else gptq_readers)(spec[name]).line()


@pytest.mark.parametrize("name", ["compressed-tensors-tied", "gptq_v2-tied"])
def test_a_tied_mix_resolves_to_one_scheme_per_fused_layer(resolved, name):
    mixes, found, spec = resolved
    layers = found[name]
    check_shards(layers, mixes["tied"])
    for fused, got in layers.items():
        assert {got["fused"]} == set(got["shards"].values()), (fused, got)
    methods = {layers[e]["method"] for e in EXPERTS}
    assert methods == {"CompressedTensorsWNA16MoEMethod" if name.startswith("compressed") else "AutoGPTQMoEMethod"}
    assert [bits_of(layers[e]["fused"]) for e in EXPERTS] == [4, 8]
    assert "vLLM 0.32 (it runs" not in readers_of(spec, name)


def test_rules_per_expert_layer_leave_a_tied_blocks_experts_at_the_files_bits(resolved):
    """The tied export with its block-1 experts' rule replaced by one per expert layer (`per_expert`): none matches
    `…mlp.experts`, so vLLM gives block 1's 8-bit experts 4 bits (the file's `bits`), as the readers line says; why
    formats/gptq/writer.py writes one rule per block of experts."""
    mixes, found, spec = resolved
    layers = found["gptq_v2-per-expert"]
    check_shards(layers, mixes["tied"])
    assert {layers[f"model.layers.{i}.self_attn.qkv_proj"]["fused"] for i in range(2)} == {
        "8 bits, group 32, sym",
        "4 bits, group 32, sym",
    }  # q/k/v's tied rule matches qkv_proj
    assert [layers[e]["method"] for e in EXPERTS] == ["AutoGPTQMoEMethod"] * 2  # the Marlin path, dynamic-aware
    assert [bits_of(layers[e]["fused"]) for e in EXPERTS] == [4, 4]
    assert set(layers[EXPERTS[1]]["shards"].values()) == {"8 bits, group 32, sym"}
    assert (
        "vLLM 0.32 (it runs model.layers.1.mlp.experts.{all 12: 8} as one layer at 4 bits, from the `dynamic` "
        "rule matching that name itself, else the file's `bits`"
    ) in readers_of(spec, "gptq_v2-per-expert")


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_split_mix_is_named_as_vllm_sees_it(resolved, fmt):
    mixes, found, spec = resolved
    widths, layers = mixes["split"], found[f"{fmt}-split"]
    check_shards(layers, widths)
    differ = {fused for fused, got in layers.items() if len(set(got["shards"].values())) > 1}
    config = json.loads((Path(spec[f"{fmt}-split"]) / "config.json").read_text())
    file_widths = {s: widths[parent_name(s)] for got in layers.values() for s in got["shards"]}
    ours = {fused_name(m) for m in mixed_groups(fused_groups(config, file_widths), file_widths)}
    assert differ == ours == set(EXPERTS)  # the fused MoE layers, named as vLLM names them
    zero, two = (layers[e]["fused"] for e in EXPERTS)
    line = readers_of(spec, f"{fmt}-split").split(" · not in ")[1]
    if fmt == "compressed-tensors":  # expert 0's own projections differ: refused; expert 2 differs: expert 0's scheme
        assert zero.startswith("error: ValueError: All MoE projections need to have same quantization scheme"), zero
        assert two == layers[EXPERTS[1]]["shards"][f"{EXPERTS[1]}.0.gate_proj"] == "4 bits, group 32, sym"
        assert (
            "vLLM 0.32 (it runs model.layers.0.mlp.experts.{0.down_proj: 8, … 11 more: 4} as one layer (1 more "
            "such group) and refuses it, expert 0's projections differing: \"All MoE projections need to have "
            'same quantization scheme"'
        ) in line
    else:  # no rule matches either fused name: the file's 4 bits for both, the 8-bit experts read at 4
        assert bits_of(zero) == bits_of(two) == 4 and layers[EXPERTS[0]]["method"] == "AutoGPTQMoEMethod"
        assert (
            "vLLM 0.32 (it runs model.layers.0.mlp.experts.{0.down_proj: 8, … 11 more: 4} as one layer (1 more "
            "such group) at 4 bits"
        ) in line


def test_where_marlin_does_not_take_the_shape_the_rules_are_not_read(resolved):
    """Hidden size 64 (not a multiple of 128): vLLM's GPTQ config falls back to MoeWNA16 for the fused MoE layer,
    built from the file's `bits` alone, so even a rule matching `…mlp.experts` leaves its 8-bit experts at 4 bits;
    the readers line names it."""
    _, found, spec = resolved
    layer = found["gptq_v2-64"][EXPERTS[1]]
    assert layer["method"] == "MoeWNA16Method" and bits_of(layer["fused"]) == 4
    assert set(layer["shards"].values()) == {"8 bits, group 32, sym"}
    assert f"vLLM 0.32 (it runs {EXPERTS[1]}.{{all 12: 8}} as one layer at 4 bits" in readers_of(spec, "gptq_v2-64")


def test_mixtrals_experts_are_looked_up_by_vllms_names_which_our_export_adds(resolved):
    """vLLM's Mixtral names expert e's projections w1/w3/w2 (mixtral.py `ckpt_names`); its compressed-tensors config
    looks up `…experts.0.w1` (w3, w2), and its rename `.gate_proj.` → `.w1.` wants a dot after the name, which a
    target has not. Our export follows each expert's target with that spelling, so each block's fused experts take
    the file's 4 bits; the same file without those names (an export written before them) has them built
    unquantized, though every expert alone is 4-bit, and its readers line says so."""
    _, found, spec = resolved
    for name, want in (
        ("compressed-tensors-mixtral", ("4 bits, group 32, sym", "CompressedTensorsWNA16MoEMethod")),
        ("compressed-tensors-mixtral-bare", ("float", "UnquantizedFusedMoEMethod")),
    ):
        for i in range(2):
            layer = found[name][f"model.layers.{i}.block_sparse_moe.experts"]
            assert (layer["fused"], layer["method"]) == want, (name, layer)
            assert set(layer["shards"].values()) == {"4 bits, group 32, sym"} and len(layer["shards"]) == 12
    assert "vLLM 0.32 (it looks up" not in readers_of(spec, "compressed-tensors-mixtral")
    line = readers_of(spec, "compressed-tensors-mixtral-bare").split(" · not in ")[1]
    assert (
        "vLLM 0.32 (it looks up the scheme of model.layers.0.block_sparse_moe.experts.0.{w1, w3, w2}, names that "
        "this file's targets"
    ) in line
