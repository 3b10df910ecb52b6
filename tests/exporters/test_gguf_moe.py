"""GGUF for mixture-of-experts models (formats/gguf/experts.py): qwen3_moe → `qwen3moe`, mixtral → `llama` with experts,
on tiny random models (4 experts, top 2, 2 blocks), against llama.cpp as the oracle, as test_gguf_arch.py does:
- its converter writes the same F32 file for the float model (metadata, names, types, bit-identical data); and for
  matgptq's dequantized 4-bit model (saved as a plain HF directory) it writes the file our Q4_0 export is: the same
  metadata, names and shapes, the router F32 in both, and gguf-py's dequantization of each of our Q4_0 tensors equal
  to the converter's F32 data bit for bit (the experts' 3-D `ffn_{gate,up,down}_exps`, gate/up split included);
- our reader (read_gguf_weights) gives every expert's weight exactly as matgptq.load's fused tensors hold it;
- llama.cpp runs both files: F32 logits equal transformers' (≤ 1e-4: float summation order with an F32 KV cache,
  test_gguf_interop.py's derivation), and the Q4_0 export equals matgptq.load with llama.cpp's Q8_0 activation
  quantization emulated in the attention Linears and both expert matmuls (median over positions ≤ 1e-4, as there),
  the 3-bit slice as negative control (≥ 0.05).
gpt_oss is refused in one line naming the alternative, and configs llama.cpp's graphs would compute differently too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import quick_quantize, require_peer
from tests.exporters.gguf_converter import assert_same_file_as_converter
from tests.exporters.gguf_moe_helpers import emulate_q8_0, make_moe, save_dequantized
from tests.exporters.test_gguf_interop import F32_KV, TOKENS, cpp_logits, per_position
from tests.models.test_arch import tiny_dir
from tests.models.test_moe import MOE as MOE_MODELS

pytestmark = pytest.mark.interop
gguf = pytest.importorskip("gguf")

import matgptq  # noqa: E402
from matgptq.errors import UserError  # noqa: E402
from matgptq.exporters.gguf import GGUFExportWarning, export_gguf  # noqa: E402
from matgptq.exporters.readers import gguf_readers  # noqa: E402
from matgptq.formats.gguf import read_gguf_weights  # noqa: E402

KINDS = ("qwen3_moe", "mixtral")
EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """Per kind: the float model and a MatGPTQ (4, 8) parent, group size 32 (every row whole Q4_0 blocks)."""
    root = tmp_path_factory.mktemp("gguf_moe")
    out = {}
    for kind in KINDS:
        model = make_moe(kind, root / kind / "model")
        out[kind] = model, quick_quantize(model, root / kind / "parent", method="matgptq", bits="4,8", group_size=32)
    return out


def _ref_logits(parent, bits: int) -> np.ndarray:
    model = matgptq.load(parent, bits=bits, dtype=torch.float32)
    emulate_q8_0(model)
    with torch.no_grad():
        return model(torch.tensor([TOKENS])).logits[0].numpy()


@pytest.mark.parametrize("kind", KINDS)
def test_same_file_as_llamacpp_converter(converter, moe, tmp_path, kind):
    assert_same_file_as_converter(gguf, converter, moe[kind][0], tmp_path)


@pytest.mark.parametrize("kind", KINDS)
def test_q4_export_is_the_converters_file_of_the_dequantized_model(converter, moe, tmp_path, kind):
    # the converter's F32 file of matgptq's dequantized model (and our F32 export of it: the same, asserted there)
    assert_same_file_as_converter(gguf, converter, save_dequantized(moe[kind][1], 4, tmp_path / "deq"), tmp_path)
    ours = tmp_path / "q4.gguf"
    rep = export_gguf(moe[kind][1], ours, bits=4)
    assert {t.ggml_type for t in rep.tensors if t.bits is not None} == {"Q4_0"} and rep.exact
    theirs, mine = gguf.GGUFReader(str(tmp_path / "theirs.gguf")), gguf.GGUFReader(str(ours))
    skip = ("tokenizer.", "general.", "GGUF.", "matgptq.")
    fields = [{k: f.contents() for k, f in r.fields.items() if not k.startswith(skip)} for r in (theirs, mine)]
    arch = mine.fields["general.architecture"].contents()
    assert arch == {"qwen3_moe": "qwen3moe", "mixtral": "llama"}[kind]
    assert fields[0] == fields[1] and fields[1][f"{arch}.expert_count"] == 4
    a, b = {t.name: t for t in theirs.tensors}, {t.name: t for t in mine.tensors}
    assert sorted(a) == sorted(b)
    assert all(f"blk.{i}.{e}.weight" in b for i in range(2) for e in EXPERTS)
    for name, t in a.items():
        assert t.shape.tolist() == b[name].shape.tolist(), name
        want = "Q4_0" if name.startswith("blk.") and len(t.shape) >= 2 and "ffn_gate_inp" not in name else "F32"
        assert b[name].tensor_type.name == want, name  # the router stays F32, as the converter writes it
        back = gguf.quants.dequantize(np.asarray(b[name].data), b[name].tensor_type)
        np.testing.assert_array_equal(back.reshape(-1), np.asarray(t.data).reshape(-1), err_msg=name)


@pytest.mark.parametrize("kind", KINDS)
def test_llamacpp_runs_moe(moe, tmp_path, kind):
    require_peer("llama_cpp")
    model, parent = moe[kind]
    f32 = tmp_path / "f32.gguf"
    export_gguf(model, f32)
    ref = matgptq.load(model, dtype=torch.float32)
    with torch.no_grad():
        want = ref(torch.tensor([TOKENS])).logits[0].numpy()
    assert per_position(cpp_logits(f32, TOKENS, **F32_KV), want).max() <= 1e-4

    q4 = tmp_path / "q4.gguf"
    rep = export_gguf(parent, q4, bits=4)
    assert {t.ggml_type for t in rep.tensors if t.bits is not None} == {"Q4_0"} and rep.exact
    readers = gguf_readers(q4)
    assert "llama.cpp (llama-cpp-python 0.3.36)" in readers.runs and len(readers.runs) == 1
    # bit-exactness: gguf-py's dequantization of every expert (and every other weight) is matgptq's weight
    loaded = matgptq.load(parent, bits=4, dtype=torch.float32).state_dict()
    weights = read_gguf_weights(q4)
    _assert_experts_are(weights, loaded)
    for name, w in weights.items():
        if ".experts." not in name:
            np.testing.assert_array_equal(w, loaded[name].numpy(), name)
    got = cpp_logits(q4, TOKENS, **F32_KV)
    assert np.median(per_position(got, _ref_logits(parent, 4))) <= 1e-4
    assert np.median(per_position(got, _ref_logits(parent, 3))) >= 0.05  # negative control


def _assert_experts_are(weights: dict, loaded: dict) -> None:
    """Each expert read back from the GGUF (model.layers.<i>.mlp.experts.<e>.<projection>.weight) is slot e of the
    loaded model's fused tensor, bit for bit; every expert is there."""
    experts = {n: w for n, w in weights.items() if ".experts." in n}
    for name, w in experts.items():
        fused, e, proj = name.rsplit(".", 3)[0], int(name.split(".")[-3]), name.split(".")[-2]
        np.testing.assert_array_equal(w, loaded[f"{fused}.{proj}"][e].numpy(), name)
    assert len(experts) == 2 * 2 * 4  # blocks × projections × experts


def test_experts_of_mixed_widths_share_one_type(moe, tmp_path):
    """A per-layer mix giving one expert 8 bits: auto picks Q8_0 for it and Q4_0 for its siblings, but a GGUF tensor
    has one type, so the whole gate/up pair is Q8_0 (which holds 4-bit symmetric codes too: still exact)."""
    parent = moe["qwen3_moe"][1]
    mix = {"*": 4, "model.layers.0.mlp.experts.1.gate_up_proj": 8}
    with pytest.warns(GGUFExportWarning, match="one type per tensor"):
        rep = export_gguf(parent, tmp_path / "mix.gguf", bits_config=mix)
    types = {t.name: t.ggml_type for t in rep.tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == types["blk.0.ffn_up_exps.weight"] == "Q8_0"
    assert types["blk.0.ffn_down_exps.weight"] == types["blk.1.ffn_gate_exps.weight"] == "Q4_0" and rep.exact
    loaded = matgptq.load(parent, bits=mix, dtype=torch.float32).state_dict()
    _assert_experts_are(read_gguf_weights(tmp_path / "mix.gguf"), loaded)


def test_router_stays_f32_beside_f16_floats(moe, tmp_path):
    """convert_hf_to_gguf keeps ffn_gate_inp F32 whatever --outtype; the float experts follow the float type."""
    rep = export_gguf(moe["mixtral"][0], tmp_path / "f16.gguf", float_type="f16")
    types = {t.name: t.ggml_type for t in rep.tensors}
    assert types["blk.0.ffn_gate_inp.weight"] == "F32" and types["blk.0.ffn_down_exps.weight"] == "F16"


def test_gpt_oss_is_refused_in_one_line(tmp_path):
    model = tiny_dir(tmp_path / "model", "gpt_oss", **MOE_MODELS["gpt_oss"])
    with pytest.raises(UserError, match=r"gpt_oss.*--format gptq_v1/gptq_v2") as err:
        export_gguf(model, tmp_path / "out.gguf")
    assert "\n" not in str(err.value)


# measured with the checks bypassed: llama.cpp's logits then differ from transformers' by up to 0.75 (norm_topk_prob
# false: llama.cpp renormalises the top-2 weights anyway) and 4.2 (mixtral, sliding_window 16 < the 64 test tokens:
# llama.cpp's llama graph attends to all of them); a qwen3_moe with dense MLP blocks has tensors qwen3moe lacks.
@pytest.mark.parametrize(
    "kind, overrides, match",
    [
        ("qwen3_moe", dict(norm_topk_prob=False), "norm_topk_prob"),
        ("qwen3_moe", dict(mlp_only_layers=[1]), "dense MLP"),
        ("mixtral", dict(sliding_window=16), "sliding_window"),
    ],
)
def test_refuses_what_llamacpp_would_compute_differently(tmp_path, kind, overrides, match):
    src = make_moe(kind, tmp_path / "model", **overrides)
    with pytest.raises(UserError, match=match):
        export_gguf(src, tmp_path / "out.gguf")
