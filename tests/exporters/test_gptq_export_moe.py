"""GPTQ export of fused mixture-of-experts checkpoints without peers (formats/gptq/experts.py, docs/formats.md
§2.9): the files hold per-expert gate_proj / up_proj / down_proj layers whose codes, scales and zeros are, bit for
bit, the rows of the parent's slice (unpacked here straight from the files, so the split is checked independently
of our reader's join), `dynamic` names them, gpt_oss' biases follow their rows, our own reader joins the halves back
so matgptq.load of the export gives the source's logits exactly, and what is not supported is one UserError line.
GPTQModel reading these files: test_gptq_moe_interop.py."""

import json
import re
import shutil
from collections import Counter

import pytest
import torch
from safetensors.torch import load_file

import matgptq
from matgptq.cli import main
from matgptq.errors import UserError
from matgptq.exporters.gptq import export_gptq
from matgptq.exporters.readers import gptq_readers
from matgptq.formats.gptq.packing import unpack_cols, unpack_rows
from matgptq.formats.gptq.reader import read_gptq_checkpoint
from matgptq.formats.parent import read_checkpoint
from tests.exporters.gptq_moe_helpers import MoECache

TYPES = ["qwen3_moe", "mixtral", "gpt_oss"]
EXPERT = re.compile(r"^(.+\.experts)\.(\d+)\.(gate_up_proj|down_proj)$")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return MoECache(tmp_path_factory.mktemp("gptq_moe"))


def _file_layer(files, name, bits, n, v1):
    """(codes [N, K], scales [N, G] float, zeros [N, G]) of GPTQ layer `name`, unpacked from the file tensors."""
    k = files[f"{name}.g_idx"].numel()
    codes = torch.from_numpy(unpack_rows(files[f"{name}.qweight"].numpy(), bits, k, pad=True)).T
    zeros = torch.from_numpy(unpack_cols(files[f"{name}.qzeros"].numpy(), bits, n, pad=True)).T.int()
    return codes, files[f"{name}.scales"].T.float(), zeros + int(v1)  # v1 stores z − 1 (docs/formats.md §2.5)


@pytest.mark.parametrize("fmt", ["gptq_v1", "gptq_v2"])
@pytest.mark.parametrize("model_type", TYPES)
def test_expert_halves_are_the_parent_slice_rows_bit_for_bit(cache, tmp_path, model_type, fmt):
    src = cache.source(model_type, "parent")
    out = export_gptq(src, tmp_path / "x", fmt, bits=4)
    files, parent = load_file(str(out / "model.safetensors")), read_checkpoint(src)
    assert not [k for k in files if "gate_up_proj" in k]
    experts = [n for n in parent.layers if EXPERT.match(n)]
    assert len(experts) == 2 * 2 * 4
    for name in experts:
        q = parent.layers[name].slice(4)  # shift 4: GPTQ scale s·2^4, zero z / 2^4 (docs/formats.md §2.8)
        m = EXPERT.match(name)
        halves = ["down_proj"] if m.group(3) == "down_proj" else ["gate_proj", "up_proj"]
        rows = q.shape[0] // len(halves)
        for i, half in enumerate(halves):
            part, sl = f"{m.group(1)}.{m.group(2)}.{half}", slice(i * rows, (i + 1) * rows)
            codes, scales, zeros = _file_layer(files, part, 4, rows, fmt == "gptq_v1")
            assert torch.equal(codes, q.codes[sl])
            assert torch.equal(scales, q.scales[sl].float() * 16)
            assert torch.equal(zeros, q.zeros[sl].int() >> 4)
            assert torch.equal(files[f"{part}.g_idx"], q.g_idx)  # act-order: the same per-column groups for both
    read = read_gptq_checkpoint(out)  # our reader joins each expert's halves back into its gate_up layer
    assert sorted(read.layers) == sorted(parent.layers)
    for name, q in read.layers.items():
        assert torch.equal(q.dequantize(), parent.layers[name].slice(4).dequantize()), name
    with torch.no_grad():
        assert torch.equal(matgptq.load(out)(cache.ids).logits, matgptq.load(src, bits=4)(cache.ids).logits)
    line = gptq_readers(out).line()
    assert "runs in matgptq.load; GPTQModel 7.6" in line and "not in transformers + optimum" in line


@pytest.mark.parametrize("model_type", TYPES)
def test_asymmetric_gptq_v2_round_trips(cache, tmp_path, model_type):
    src = cache.source(model_type, "gptq4")
    out = export_gptq(src, tmp_path / "x", "gptq_v2", bits=4)
    parent, read = read_checkpoint(src), read_gptq_checkpoint(out)
    for name, q in parent.layers.items():
        r = read.layers[name]
        assert torch.equal(r.codes, q.codes) and torch.equal(r.zeros.int(), q.zeros.int()), name
        assert torch.equal(r.scales, q.scales) and torch.equal(r.g_idx, q.g_idx), name
    with torch.no_grad():
        assert torch.equal(matgptq.load(out)(cache.ids).logits, matgptq.load(src)(cache.ids).logits)


@pytest.mark.parametrize("model_type", ["qwen3_moe", "gpt_oss"])
def test_a_per_expert_mix_names_each_half_in_dynamic(cache, tmp_path, model_type):
    src, mix = cache.source(model_type, "parent"), cache.mix(model_type)
    out = export_gptq(src, tmp_path / "x", "gptq_v2", bits_config=mix)
    qc = json.loads((out / "quantize_config.json").read_text())
    expected = {}
    for name, r in mix.items():
        m = EXPERT.match(name)
        halves = (
            [name]
            if m is None or m.group(3) == "down_proj"
            else [f"{m.group(1)}.{m.group(2)}.{h}" for h in ("gate_proj", "up_proj")]
        )
        expected.update(dict.fromkeys(halves, r))
    counts = Counter(expected.values())  # the base width is the most common one among the GPTQ layers (halves)
    base = max(counts, key=lambda b: (counts[b], b))
    assert qc["bits"] == base and qc["dynamic"] == {
        f"+:^{re.escape(n)}$": {"bits": r} for n, r in expected.items() if r != base
    }
    read = read_gptq_checkpoint(out)
    assert {n: q.bits for n, q in read.layers.items()} == mix
    with torch.no_grad():
        assert torch.equal(matgptq.load(out)(cache.ids).logits, matgptq.load(src, bits=mix)(cache.ids).logits)


def test_a_tied_block_of_experts_is_one_dynamic_rule_read_back_at_its_width(cache, tmp_path):
    """A block whose experts all take one width other than the file's gets one rule, matching the experts module
    (the name of vLLM's fused MoE layer: tests/integrations/test_vllm_config_moe.py) and each expert's layers; our
    reader resolves every expert layer through it to the mix's width, and the logits are the parent's at the mix."""
    src = cache.source("qwen3_moe", "parent")
    names = list(read_checkpoint(src).layers)
    block = "model.layers.1.mlp.experts"
    mix = dict.fromkeys(names, 4) | {n: 8 for n in names if n.startswith(block + ".")}
    out = export_gptq(src, tmp_path / "x", "gptq_v2", bits_config=mix)
    rules = json.loads((out / "quantize_config.json").read_text())["dynamic"]
    assert rules == {f"+:^{re.escape(block)}(?:\\.\\d+\\.[^.]+)?$": {"bits": 8}}
    assert {n: q.bits for n, q in read_gptq_checkpoint(out).layers.items()} == mix
    with torch.no_grad():
        assert torch.equal(matgptq.load(out)(cache.ids).logits, matgptq.load(src, bits=mix)(cache.ids).logits)


def test_gpt_oss_expert_biases_follow_their_rows(cache, tmp_path):
    src = cache.source("gpt_oss", "parent")
    out = export_gptq(src, tmp_path / "x", "gptq_v1", bits=8)
    files, fused = load_file(str(out / "model.safetensors")), read_checkpoint(src).tensors
    assert not [k for k in files if k.endswith("_proj_bias")]
    for layer in range(2):
        p = f"model.layers.{layer}.mlp.experts"
        gate_up, down = fused[f"{p}.gate_up_proj_bias"], fused[f"{p}.down_proj_bias"]
        half = gate_up.shape[1] // 2
        assert gate_up.abs().min() > 0  # random (gptq_moe_helpers.moe_model), so a misplaced row would show
        for e in range(4):
            assert torch.equal(files[f"{p}.{e}.gate_proj.bias"], gate_up[e, :half])
            assert torch.equal(files[f"{p}.{e}.up_proj.bias"], gate_up[e, half:])
            assert torch.equal(files[f"{p}.{e}.down_proj.bias"], down[e])


def test_an_moe_type_without_a_tested_gptq_reader_is_one_line(cache, tmp_path):
    src = tmp_path / "olmoe"
    shutil.copytree(cache.source("qwen3_moe", "gptq4"), src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(dict(config, model_type="olmoe")))
    with pytest.raises(UserError) as e:
        export_gptq(src, tmp_path / "x", "gptq_v2", bits=4)
    assert "\n" not in str(e.value) and "olmoe" in str(e.value) and "matgptq.load" in str(e.value)
    assert not (tmp_path / "x").exists()


def test_cli_exports_experts_as_gptq(cache, tmp_path, capsys):
    src = cache.source("mixtral", "gptq4")
    assert main(["export", str(src), "--format", "gptq_v2", "--bits", "4", "--out", str(tmp_path / "x")]) == 0
    assert "readers: runs in matgptq.load; GPTQModel 7.6" in capsys.readouterr().out
