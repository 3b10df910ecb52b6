"""GGUF exports run by llama.cpp (llama-cpp-python) and read by transformers' GGUF loader.

Tolerances (measured on this CPU, x86 AVX-512, llama-cpp-python 0.3.36; tiny models have |logits| ≲ 4):

- F32 GGUF vs transformers fp32, F32 KV cache: max |Δlogit| 3e-6 (float summation order only) → assert ≤ 1e-4.
  With llama.cpp's default F16 KV cache: 3e-3.
- Quantized weights: llama.cpp quantizes the activations of every quantized matmul (Q8_0 blocks of 32 for
  Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K blocks of 256 for K-quants; F16 for F16 weights). Against matgptq.load
  (fp32 activations) that alone moves the logits by 0.07–0.12 on the 64-wide model and 0.23–0.32 on the 256-wide one
  (max |logit| 3.5 / 6.6), i.e. ≤ 0.05·max|logit|; transformers with fake-quantized activations moves them by the
  same amount to 4 digits → assert ≤ 0.1·max|logit|. Emulating that activation quantization in transformers (hooks
  below, incl. Q8_1's fp16 block sums for the Q4_1 offsets) with an F32 KV cache, llama.cpp agrees to 0.7–3e-6 (median
  over positions); a rare activation rounding tie (inputs one float ulp apart landing on both sides of a .5) flips a
  Q8 code and moves later positions by ~0.03, so the assertion is on the median (≤ 1e-4). Negative control: the
  one-bit-narrower slice gives a median ≥ 0.13 in the same metric (asserted ≥ 0.05).
- transformers' GGUF loader dequantizes with gguf-py: its state dict equals matgptq.load's bit for bit (logits Δ = 0).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import STORIES, TINYSTORIES, make_tiny_llama, quick_quantize, require_peer

pytestmark = pytest.mark.interop
gguf = pytest.importorskip("gguf")

import matgptq  # noqa: E402
from matgptq.exporters.gguf import export_gguf  # noqa: E402
from matgptq.exporters.readers import gguf_readers  # noqa: E402
from matgptq.formats.gguf import ARCHITECTURES, llama_qk_permutation, read_gguf_weights  # noqa: E402

TOKENS = [1] + list(range(5, 60)) + [100, 200, 300, 400, 511, 3, 13, 300]  # 64 ids (ids 3.. are bytes / pieces)
F32_KV = {"type_k": 0, "type_v": 0}  # GGML_TYPE_F32: no F16 rounding of K/V


@pytest.fixture(scope="module")
def llama_cpp():
    return require_peer("llama_cpp")


def cpp_logits(path: Path, tokens: list[int], **kw) -> np.ndarray:
    from llama_cpp import Llama

    n = len(tokens)
    llm = Llama(model_path=str(path), n_ctx=n, n_batch=n, n_ubatch=n, logits_all=True, n_threads=2, verbose=False, **kw)
    try:
        llm.eval(tokens)
        return np.array(llm.scores[:n], dtype=np.float32)
    finally:
        llm.close()


# --- llama.cpp's activation quantization, emulated in transformers ---------------------------------------------------


def _q8_0(x: torch.Tensor) -> torch.Tensor:  # quantize_row_q8_0 (x86): q = round(x·127/amax), d = fp16(amax/127)
    xb = x.reshape(*x.shape[:-1], -1, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    q = torch.round(xb * torch.where(amax > 0, 127 / amax, torch.zeros_like(amax)))
    return (q * (amax / 127).half().float()).reshape(x.shape)


def _q8_k(x: torch.Tensor) -> torch.Tensor:  # quantize_row_q8_K: iscale = −127/max (signed), d = 1/iscale (fp32)
    xb = x.reshape(*x.shape[:-1], -1, 256)
    mx = torch.gather(xb, -1, xb.abs().argmax(-1, keepdim=True))
    iscale = torch.where(mx != 0, -127 / mx, torch.zeros_like(mx))
    q = torch.clamp(torch.round(xb * iscale), max=127)
    return (q * torch.where(iscale != 0, 1 / iscale, torch.zeros_like(iscale))).reshape(x.shape)


ACTIVATION = {
    "Q4_0": _q8_0,
    "Q5_0": _q8_0,
    "Q8_0": _q8_0,
    "Q4_1": _q8_0,
    "Q5_1": _q8_0,
    "Q2_K": _q8_k,
    "Q3_K": _q8_k,
    "Q4_K": _q8_k,
    "Q5_K": _q8_k,
    "Q6_K": _q8_k,
    "F16": lambda x: x.half().float(),
    "F32": None,
}


def hf_logits(src: Path, tokens: list[int], bits=None, emulate: Path | None = None) -> np.ndarray:
    """matgptq.load logits; with `emulate`, inputs of each Linear quantized as llama.cpp does for that GGUF's types."""
    return model_logits(matgptq.load(src, bits=bits, dtype=torch.float32), tokens, emulate)


def _q8_1_matmul(x: torch.Tensor, w: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """vec_dot_q4_1_q8_1: Σ_b d_x·Σ q_x·(d_w q_w) + m_w·s_x with s_x = fp16(d_x·Σ q_x) (quantize_row_q8_1)."""
    xb = x.reshape(*x.shape[:-1], -1, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    q = torch.round(xb * torch.where(amax > 0, 127 / amax, torch.zeros_like(amax)))
    d = amax / 127
    s = (d[..., 0] * q.sum(-1)).half().float()
    w_d = w - m.repeat_interleave(32, dim=1)  # d_w·q_w, exact
    return (q * d.half().float()).reshape(x.shape) @ w_d.T + s @ m.T


def model_logits(model, tokens: list[int], emulate: Path | None = None) -> np.ndarray:
    if emulate is not None:
        reader = gguf.GGUFReader(str(emulate))
        arch = next(a for a in ARCHITECTURES.values() if a.name == reader.fields["general.architecture"].contents())
        cfg = model.config
        weights = None
        for t in reader.tensors:
            p = t.name.split(".")
            fq = ACTIVATION[t.tensor_type.name]
            if fq is not None and p[0] == "blk" and p[-1] == "weight" and not p[2].endswith("norm"):
                hf = arch.hf_name(t.name)
                mod = model.get_submodule(hf.removesuffix(".weight"))
                if t.tensor_type.name in ("Q4_1", "Q5_1"):  # the offset term uses the Q8_1 block sums
                    weights = weights or read_gguf_weights(emulate)
                    raw = np.asarray(t.data)
                    nbytes = gguf.GGML_QUANT_SIZES[t.tensor_type][1]
                    m = raw.reshape(raw.shape[0], -1, nbytes)[..., 2:4].copy().view(np.float16)[..., 0]
                    if p[2] in ("attn_q", "attn_k") and arch.permute_qk:
                        heads = cfg.num_attention_heads if p[2] == "attn_q" else cfg.num_key_value_heads
                        m = m[np.argsort(llama_qk_permutation(m.shape[0], heads))]
                    w = torch.from_numpy(weights[hf])
                    m = torch.from_numpy(m.astype(np.float32))
                    mod.register_forward_hook(lambda mod, args, out, w=w, m=m: _q8_1_matmul(args[0], w, m))
                else:
                    mod.register_forward_pre_hook(lambda mod, args, fq=fq: (fq(args[0]),))
        types = {t.name: t.tensor_type.name for t in reader.tensors}
        fq = ACTIVATION[types.get("output.weight", types["token_embd.weight"])]  # tied: token_embd is the output
        if fq is not None:
            model.lm_head.register_forward_pre_hook(lambda mod, args, fq=fq: (fq(args[0]),))
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].numpy()


def per_position(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a.astype(np.float64) - b).max(-1)


# --- fixtures -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf_interop")
    small = make_tiny_llama(root / "small")
    k256 = make_tiny_llama(root / "k256", hidden=256, intermediate=256, heads=4, kv_heads=2, layers=1)
    return {
        "root": root,
        "small": small,
        # the options the emulation's tolerance was measured on: with MatGPTQ's defaults today (group act-order and
        # the refit) one activation of this fixture's 6-bit slice sits on a Q8 rounding boundary at position 19, and
        # the flip reaches most later positions through attention (median 0.004), which the median cannot absorb
        "parent": quick_quantize(
            small,
            root / "parent",
            method="matgptq",
            bits="4,8",
            group_size=32,
            group_act_order=False,
            refit_scales=False,
        ),
        # float32 passes, as measured: calibrated in bfloat16 (`auto` on a CPU with it) llama.cpp and the emulation
        # agree at position 0 (1e-6) and differ by 0.017 (median) from position 1 on, the pattern of a Q8 rounding
        # flip carried through attention, as the parent's above
        "asym": quick_quantize(small, root / "asym", bits=4, sym=False, group_size=32, dtype="float32"),
        "pc": quick_quantize(k256, root / "pc", method="rtn", bits=8, group_size=-1),  # per-channel: exact K-quants
        # group 32 with scales on Q2_K's lattice (quantize --kquant): every K-quant exact; written as the type named
        "lattice": quick_quantize(
            k256, root / "lattice", method="matgptq", bits="2,3,4,8", group_size=32, kquant="q2_k"
        ),
    }


CASES = [  # checkpoint, bits, expected type of the quantized layers
    ("parent", 2, "Q4_0"),
    ("parent", 3, "Q4_0"),
    ("parent", 4, "Q4_0"),
    ("parent", 5, "Q5_0"),
    ("parent", 6, "Q8_0"),
    ("parent", 8, "Q8_0"),
    ("asym", None, "Q4_1"),
    ("pc", 2, "Q2_K"),
    ("pc", 3, "Q3_K"),
    ("pc", 6, "Q6_K"),
    ("lattice", 2, "Q2_K"),
    ("lattice", 3, "Q3_K"),
    ("lattice", 4, "Q4_K"),
    ("lattice", 5, "Q5_K"),
    ("lattice", 6, "Q6_K"),
]


def _export(ck, key, bits, tmp_path, typ):
    out = tmp_path / f"{key}-{bits}.gguf"
    rep = export_gguf(ck[key], out, bits=bits, qtype=typ.lower() if key == "lattice" else "auto")
    return out, rep


# --- tests ----------------------------------------------------------------------------------------------------------


def test_f32_baseline(llama_cpp, ck, tmp_path):
    path = tmp_path / "f32.gguf"
    export_gguf(ck["small"], path)
    ref = hf_logits(ck["small"], TOKENS)
    assert per_position(cpp_logits(path, TOKENS, **F32_KV), ref).max() <= 1e-4
    assert per_position(cpp_logits(path, TOKENS), ref).max() <= 2e-2  # F16 KV cache (llama.cpp's default)


@pytest.mark.parametrize("key,bits,typ", CASES, ids=[f"{k}-{b}-{t}" for k, b, t in CASES])
def test_llamacpp_logits_match_matgptq(llama_cpp, ck, tmp_path, key, bits, typ):
    path, rep = _export(ck, key, bits, tmp_path, typ)
    assert "llama.cpp (llama-cpp-python 0.3.36)" in gguf_readers(path).runs  # what the export prints
    assert rep.exact or key == "asym"  # Q4_1 rounds its offsets to fp16
    assert {t.ggml_type for t in rep.tensors if t.bits is not None} == {typ}
    got = cpp_logits(path, TOKENS, **F32_KV)
    ref = hf_logits(ck[key], TOKENS, bits)
    plain = per_position(got, ref)
    assert plain.max() <= 0.1 * np.abs(ref).max(), plain.max()  # activation quantization (measured ≤ 0.05·max)
    emulated = per_position(got, hf_logits(ck[key], TOKENS, bits, emulate=path))
    assert np.median(emulated) <= 1e-4, np.median(emulated)  # measured ≤ 3.1e-6
    if bits is not None and bits > 2:  # negative control: the next narrower slice is far outside the tolerance
        other = per_position(got, hf_logits(ck[key], TOKENS, bits - 1, emulate=path))
        assert np.median(other) >= 0.05


@pytest.mark.parametrize("key,bits", [("parent", 4), ("parent", 8), ("asym", None), ("pc", 3), ("pc", 6)])
def test_transformers_gguf_loader_agrees(ck, tmp_path, key, bits):
    require_peer("gguf")
    from transformers import AutoModelForCausalLM

    path, rep = _export(ck, key, bits, tmp_path, "auto")
    assert "transformers' GGUF reader (dequantized to float)" in gguf_readers(path).runs  # what the export prints
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32)
    ref = matgptq.load(ck[key], bits=bits, dtype=torch.float32)
    got, want = model.state_dict(), ref.state_dict()
    gguf_py = read_gguf_weights(path)
    err = {t.source: t.max_abs_err for t in rep.tensors}
    for name, w in want.items():
        if name in gguf_py:  # transformers and gguf-py dequantize the same bytes identically
            assert torch.equal(got[name], torch.from_numpy(gguf_py[name])), name
        assert (got[name] - w).abs().max().item() == err.get(name, 0.0), name  # 0 where exact (all but Q4_1)
    if rep.exact:
        with torch.no_grad():
            ids = torch.tensor([TOKENS])
            assert torch.equal(model(ids).logits, ref(ids).logits)


SENTENCES = [
    "Once upon a time, there was a little girl named Lily.",
    "She loved to play outside in the sunshine!  Two  spaces, tabs\tand\nnewlines.",
    "“Quotes” — dashes… naïve café, 123 + 4.5 = 127.5; emoji 🙂 and 漢字 fall back to bytes.",
    " leading space",
    "",
    "a",
    "The end.</s> <s> not special",
]


def test_stories260k_tokenizer_identical(llama_cpp, tmp_path):
    from llama_cpp import Llama
    from transformers import AutoTokenizer

    path = tmp_path / "stories.gguf"
    export_gguf(STORIES, path)
    tok = AutoTokenizer.from_pretrained(STORIES)
    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        text = TINYSTORIES.read_text(encoding="utf-8")[:30000]
        for s in SENTENCES + [text]:
            want = tok(s)["input_ids"]
            got = llm.tokenize(s.encode("utf-8"), add_bos=True, special=True)  # HF parses "</s>" in text too
            assert got == want, s[:60]
            if s:  # llama-cpp-python's detokenize keeps the SentencePiece prefix space that HF's decoder strips
                assert llm.detokenize(got[1:], special=True).decode("utf-8") == " " + tok.decode(want[1:]), s[:60]
    finally:
        llm.close()


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    lp, lq = (torch.log_softmax(torch.from_numpy(x).double(), -1) for x in (p, q))
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


def test_stories260k_logits(llama_cpp, tmp_path):
    """The real model: F32 export, and a GPTQ 4-bit slice as Q4_0 with the 172-column down_proj as F16.

    Five real layers amplify activation rounding ties (F16 conversion of down_proj inputs, Q8_0 codes) chaotically:
    one flipped code moves later logits by ~0.1, and flips occur every ~10-40 positions, so the per-position 1e-4
    agreement shown on the tiny models only holds up to the first flip here. Asserted instead: KL(transformers reading
    the same GGUF ‖ llama.cpp) ≤ 2e-3 per token (measured 2-5e-4), and the plain logit bound.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokens = AutoTokenizer.from_pretrained(STORIES)(TINYSTORIES.read_text(encoding="utf-8")[:400])["input_ids"][:96]
    f32 = tmp_path / "f32.gguf"
    export_gguf(STORIES, f32)
    assert per_position(cpp_logits(f32, tokens, **F32_KV), hf_logits(STORIES, tokens)).max() <= 1e-4
    q = quick_quantize(STORIES, tmp_path / "q4", bits=4, group_size=32)
    with pytest.warns(UserWarning, match="not a multiple of 32"):
        rep = export_gguf(q, tmp_path / "q4.gguf", qtype="q4_0", float_type="f16", embed_type="q8_0")
    types = {t.name: t.ggml_type for t in rep.tensors}
    assert types["blk.0.ffn_down.weight"] == "F16" and types["blk.0.ffn_up.weight"] == "Q4_0"
    assert types["token_embd.weight"] == "Q8_0"
    assert all(t.exact for t in rep.tensors if t.ggml_type == "Q4_0")
    got = cpp_logits(tmp_path / "q4.gguf", tokens, **F32_KV)
    ref = hf_logits(q, tokens)
    assert per_position(got, ref).max() <= 0.1 * np.abs(ref).max()
    same = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="q4.gguf", dtype=torch.float32)
    assert _kl(model_logits(same, tokens), got) <= 2e-3


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "factor": 2.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ],
    ids=["linear", "llama3"],
)
def test_rope_scaling(llama_cpp, tmp_path, rope):
    """RoPE scaling metadata (linear) and the rope_freqs tensor (llama3) reproduce transformers' positions."""
    import json

    model = make_tiny_llama(tmp_path / "m", layers=1)
    cfg = json.loads((model / "config.json").read_text())
    plain = hf_logits(model, TOKENS)
    cfg.pop("rope_scaling", None)
    cfg["rope_parameters"] = {"rope_theta": 10000.0, **rope}
    (model / "config.json").write_text(json.dumps(cfg))
    ref = hf_logits(model, TOKENS)
    assert per_position(ref, plain).max() > 1e-2  # the scaling matters at these positions
    export_gguf(model, tmp_path / "m.gguf")
    assert per_position(cpp_logits(tmp_path / "m.gguf", TOKENS, **F32_KV), ref).max() <= 1e-4
