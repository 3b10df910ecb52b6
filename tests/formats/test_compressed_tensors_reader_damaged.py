"""(d) Damaged or unsupported compressed-tensors checkpoints give one line, never a traceback
(formats/compressed_tensors/reader.py; the pattern of tests/test_damaged_inputs.py): named damage and refusals through
matgptq.load and the CLI, a fuzzed property (truncation anywhere, tensors dropped / reshaped / retyped, config values
replaced), and the two things the reader accepts beyond our own exports: a valid act-order g_idx and an all-zero zero
point of a symmetric layer."""

import json
import os
import shutil

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import matgptq
from matgptq.cli import main
from matgptq.errors import UserError
from matgptq.formats import read_ct_checkpoint
from matgptq.formats.compressed_tensors import pack_int32
from tests.conftest import TINYSTORIES
from tests.formats.compressed_tensors_reader_helpers import Cache, edit_config

SETTINGS = settings(
    max_examples=int(os.environ.get("MATGPTQ_FUZZ_EXAMPLES", 20)),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
LAYER = "model.layers.0.mlp.down_proj"


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    cache = Cache(tmp_path_factory.mktemp("ct_damage"))
    return {"sym": cache.export("sym-3bit"), "asym": cache.export("asym-3bit")}


def _copy(sources, kind, tmp_path):
    d = tmp_path / kind
    shutil.copytree(sources[kind], d)
    return d


def _edit_tensors(d, fn):
    tensors = load_file(str(d / "model.safetensors"))
    fn(tensors)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})


def _refused(d, match):
    with pytest.raises(UserError) as e:
        matgptq.load(d)
    assert "\n" not in str(e.value) and match in str(e.value), str(e.value)
    return str(e.value)


def _set(key, value):
    return lambda t: t.__setitem__(key, value)


def _weights(field, value):
    return lambda qc: [g["weights"].__setitem__(field, value) for g in qc["config_groups"].values()]


TENSOR_DAMAGE = {  # id: (source, edit of the tensors, words of the message)
    "packed-column-dropped": (
        "sym",
        lambda t: t.__setitem__(f"{LAYER}.weight_packed", t[f"{LAYER}.weight_packed"][:, 1:].contiguous()),
        "not a 64×172 layer packed at 3 bits",
    ),
    "packed-retyped": (
        "sym",
        lambda t: t.__setitem__(f"{LAYER}.weight_packed", t[f"{LAYER}.weight_packed"].float()),
        "2-D int32",
    ),
    "shape-wrong": ("sym", _set(f"{LAYER}.weight_shape", torch.tensor([64, 170])), "not a 64×170 layer"),
    "scale-wrong-shape": (
        "sym",
        lambda t: t.__setitem__(f"{LAYER}.weight_scale", t[f"{LAYER}.weight_scale"][:, :-1].contiguous()),
        "expected [64, 43]",
    ),
    "scale-missing": ("sym", lambda t: t.pop(f"{LAYER}.weight_scale"), "weight_scale is missing"),
    "scale-nan": ("sym", lambda t: t[f"{LAYER}.weight_scale"].view(-1)[0].fill_(float("nan")), "NaN or Inf"),
    "scale-not-fp16": (
        "sym",
        lambda t: t[f"{LAYER}.weight_scale"].view(-1)[0].fill_(1e-3 + 2**-30),
        "float16 cannot hold exactly",
    ),
    "zero-point-missing": ("asym", lambda t: t.pop(f"{LAYER}.weight_zero_point"), "no integer weight_zero_point"),
    "zero-point-unpacked": (
        "asym",
        _set(f"{LAYER}.weight_zero_point", torch.zeros(64, 43, dtype=torch.int32)),
        "expected int32 [6, 43]",
    ),
    "stray-zero-point": (
        "sym",
        _set(f"{LAYER}.weight_zero_point", torch.ones(64, 43, dtype=torch.int8)),
        "symmetric but stores non-zero zero points",
    ),
    "float-and-packed": ("sym", _set(f"{LAYER}.weight", torch.zeros(64, 172)), "both a float weight and a packed"),
    "g_idx-without-actorder": (
        "sym",
        _set(f"{LAYER}.weight_g_idx", torch.arange(172, dtype=torch.int32) // 4),
        "actorder 'group'",
    ),
    "expert-layers": (
        "sym",
        lambda t: [
            t.__setitem__(k.replace("mlp.down_proj", "mlp.experts.0.down_proj"), t.pop(k))
            for k in [k for k in t if k.startswith(LAYER)]
        ],
        "mixture-of-experts",
    ),
}
CONFIG_DAMAGE = {  # id: (edit of quantization_config, words of the message)
    "format-int-quantized": (lambda qc: qc.__setitem__("format", "int-quantized"), "format 'int-quantized'"),
    "status-frozen": (lambda qc: qc.__setitem__("quantization_status", "frozen"), "status 'frozen'"),
    "activations": (
        lambda qc: qc["config_groups"]["group_0"].__setitem__("input_activations", {"num_bits": 8}),
        "quantizes activations",
    ),
    "float-weights": (_weights("type", "float"), "float weights"),
    "block-strategy": (_weights("strategy", "block"), "'block' strategy"),
    "one-bit": (_weights("num_bits", 1), "num_bits 1"),
    "transforms": (lambda qc: qc.__setitem__("transform_config", {"config_groups": {"u": {}}}), "transforms"),
    "kv-cache": (lambda qc: qc.__setitem__("kv_cache_scheme", {"num_bits": 8}), "KV-cache"),
    "not-targeted": (lambda qc: qc.__setitem__("ignore", qc["ignore"] + [LAYER]), "no config group targets it"),
    "bad-regex": (lambda qc: qc.__setitem__("ignore", ["re:(unclosed"]), "not a regular expression"),
    "legacy-3bit-packing": (lambda qc: qc.__setitem__("version", "0.9.4"), "predates 0.17"),
    "groups-not-object": (lambda qc: qc.__setitem__("config_groups", ["group_0"]), "must be an object"),
    "group-size-not-dividing": (_weights("group_size", 5), "group_size 5 does not divide"),
}


@pytest.mark.parametrize("case", TENSOR_DAMAGE)
def test_damaged_tensors_one_line(sources, tmp_path, case):
    kind, edit, match = TENSOR_DAMAGE[case]
    d = _copy(sources, kind, tmp_path)
    _edit_tensors(d, edit)
    _refused(d, match)


@pytest.mark.parametrize("case", CONFIG_DAMAGE)
def test_unsupported_or_damaged_config_one_line(sources, tmp_path, case):
    edit, match = CONFIG_DAMAGE[case]
    d = _copy(sources, "sym", tmp_path)
    edit_config(d, edit)
    _refused(d, match)


def test_our_moe_export_is_refused_in_one_line(tmp_path):
    """Per-expert Linears (formats/compressed_tensors/experts.py, llm-compressor's MoE layout) are not rejoined: one
    line."""
    from tests.exporters.ct_moe_helpers import CtMoECache

    out = CtMoECache(tmp_path).export("qwen3_moe", "asym", 4)
    _refused(out, "per-expert Linears (model.layers.0.mlp.experts.0.")


def test_cli_eval_one_line_and_exit_2(sources, tmp_path, capsys):
    d = _copy(sources, "asym", tmp_path)
    raw = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    assert main(["eval", str(d), "--text", str(TINYSTORIES), "--seqlen", "32", "--max-tokens", "64"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("matgptq: error: ") and err.count("\n") == 1 and "not a complete safetensors file" in err


def _act_order(d, g_idx):
    """`d` with actorder "group" and weight_g_idx `g_idx` on LAYER (compressed-tensors < 0.19 wrote such files)."""
    _edit_tensors(d, _set(f"{LAYER}.weight_g_idx", g_idx))
    edit_config(d, _weights("actorder", "group"))


def test_act_order_g_idx_read_exactly(sources, tmp_path):
    """actorder "group": compressed-tensors sorts the columns by g_idx and cuts them into blocks of group_size, i.e.
    column k uses group g_idx[k] when every group has group_size columns; checked against that rule computed here."""
    d = _copy(sources, "asym", tmp_path)
    g_idx = torch.arange(172, dtype=torch.int32)[torch.randperm(172, generator=torch.Generator().manual_seed(0))] // 4
    _act_order(d, g_idx)
    raw = load_file(str(d / "model.safetensors"))
    q = read_ct_checkpoint(d).layers[LAYER]
    u = torch.from_numpy(pack_unpack(raw[f"{LAYER}.weight_packed"], 3, 172)).float()
    zp = torch.from_numpy(pack_unpack(raw[f"{LAYER}.weight_zero_point"].T.contiguous(), 3, 64).T.copy()).float()
    perm = torch.argsort(g_idx)  # compressed-tensors' _process_group: sort, cut into groups, un-sort
    blocks = (u[:, perm] - zp.repeat_interleave(4, 1)) * raw[f"{LAYER}.weight_scale"].repeat_interleave(4, 1)
    assert torch.equal(q.dequantize(), blocks[:, torch.argsort(perm)])
    assert torch.equal(q.g_idx, g_idx) and read_ct_checkpoint(d).meta["quantization"]["act_order"]


def pack_unpack(words: torch.Tensor, bits: int, n: int) -> np.ndarray:
    """Unsigned codes of int32 words, by the bit-by-bit definition (independent of the reader's unpacker)."""
    w = words.numpy().astype(np.int64) & 0xFFFFFFFF
    out = np.zeros((w.shape[0], n), dtype=np.uint8)
    for k in range(n):
        for i in range(bits):
            j = k * bits + i
            out[:, k] |= (((w[:, j // 32] >> (j % 32)) & 1) << i).astype(np.uint8)
    return out


def test_act_order_uneven_groups_refused(sources, tmp_path):
    d = _copy(sources, "sym", tmp_path)
    _act_order(d, torch.zeros(172, dtype=torch.int32))  # one group of 172 columns, 42 empty ones
    _refused(d, "other than 4 columns")


def test_reference_unpacker_inverts_the_packer():
    u = np.random.default_rng(0).integers(0, 8, size=(3, 45), dtype=np.uint8)
    assert np.array_equal(pack_unpack(torch.from_numpy(pack_int32(u, 3)), 3, 45), u)


def test_symmetric_zero_point_of_zeros_is_accepted(sources, tmp_path):
    d = _copy(sources, "sym", tmp_path)
    _edit_tensors(d, _set(f"{LAYER}.weight_zero_point", torch.zeros(64, 43, dtype=torch.int8)))
    assert torch.equal(
        read_ct_checkpoint(d).layers[LAYER].dequantize(), read_ct_checkpoint(sources["sym"]).layers[LAYER].dequantize()
    )


# --- the property, fuzzed: works, or one UserError line ------------------------------------------------------------


def _holds(d):
    try:
        matgptq.load(d)
    except UserError as e:
        assert str(e) and "\n" not in str(e), repr(str(e))


@SETTINGS
@given(data=st.data())
def test_fuzzed_damage_one_line(sources, tmp_path_factory, data):
    d = _copy(sources, data.draw(st.sampled_from(["sym", "asym"])), tmp_path_factory.mktemp("fuzz"))
    kind = data.draw(st.sampled_from(["truncate", "tensor", "json"]))
    if kind == "truncate":
        f = d / data.draw(st.sampled_from(["model.safetensors", "config.json"]))
        raw = f.read_bytes()
        f.write_bytes(raw[: data.draw(st.integers(0, len(raw) - 1))])
    elif kind == "tensor":
        tensors = load_file(str(d / "model.safetensors"))
        key = data.draw(st.sampled_from(sorted(tensors)))
        t, op = tensors.pop(key), data.draw(st.sampled_from(["drop", "reshape", "retype", "transpose"]))
        if op != "drop":
            tensors[key] = (
                t.reshape(-1)[: max(1, t.numel() - 1)].clone()
                if op == "reshape"
                else t.T.contiguous()
                if op == "transpose" and t.dim() == 2
                else t.to(torch.float32 if not t.is_floating_point() else torch.int64)
            )
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    else:
        config = json.loads((d / "config.json").read_text())
        qc = config["quantization_config"]
        group = qc["config_groups"]["group_0"]
        node = data.draw(st.sampled_from([qc, group, group["weights"]]))
        values = st.one_of(
            st.none(), st.booleans(), st.integers(-3, 12), st.text(max_size=4), st.lists(st.integers(-2, 9), max_size=3)
        )
        node[data.draw(st.sampled_from(sorted(node)))] = data.draw(values)
        (d / "config.json").write_text(json.dumps(config))
    _holds(d)
