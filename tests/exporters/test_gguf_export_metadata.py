"""GGUF export, everything around the quantized layers, checked with gguf-py only as in test_gguf_export.py: the
embeddings (re-quantized types and their worst-case error bounds, derived below; llama.cpp's auto presets), the
llama metadata, tokenizer and Q/K RoPE permutation, the real stories260K, the refusals (nothing left behind) and the
CLI's summary."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from matgptq.errors import UserError  # noqa: E402
from matgptq.exporters.gguf import export_gguf  # noqa: E402
from matgptq.formats.gguf import llama_qk_permutation, read_gguf_weights  # noqa: E402
from tests.conftest import STORIES, quick_quantize  # noqa: E402
from tests.exporters.gguf_helpers import _check_readback, _reference  # noqa: E402


def test_embeddings_q8_0(parent, tmp_path):
    rep = export_gguf(parent, tmp_path / "m.gguf", bits=4, embed_type="q8_0")
    emb = {t.name: t for t in rep.tensors}
    assert emb["token_embd.weight"].ggml_type == "Q8_0" and emb["output.weight"].ggml_type == "Q8_0"
    assert emb["token_embd.weight"].method == "requantized" and emb["token_embd.weight"].rel_err < 0.57 / 127
    _check_readback(tmp_path / "m.gguf", _reference(parent, 4), rep)


# Worst-case error of a re-quantized tensor, relative to its max |w| (gguf-py's ports of ggml-quants.c): Q4_0/Q5_0
# take d = (the block's signed extreme) / −2^(b−1), so the opposite extreme clips one code short: error ≤ |d| =
# max|w| / 2^(b−1); Q4_1/Q5_1 take d = (max − min) / (2^b − 1) ≤ 2·max|w| / (2^b − 1) with round-to-nearest: ≤ d/2.
# The factor 1.07 (0.57 for the halves) covers the float16 rounding of d (and m), ≤ 2^-11 relative, times at most
# 2^b codes: 16·2^-11 < 0.07 of a step.
REQUANT_BOUND = {"q4_0": 1.07 / 8, "q5_0": 1.07 / 16, "q4_1": 0.57 * 2 / 15, "q5_1": 0.57 * 2 / 31}


@pytest.mark.parametrize("typ", sorted(REQUANT_BOUND))
def test_embeddings_legacy_types(parent, tmp_path, typ):
    """--embed-type q4_0…q5_1 (llama-quantize's --token-embedding-type): the tensors are written in that type,
    read back by gguf-py within the type's worst-case error, and the quantized layers stay bit-exact."""
    rep = export_gguf(parent, tmp_path / "m.gguf", bits=4, embed_type=typ)
    emb = {t.name: t for t in rep.tensors if t.name in ("token_embd.weight", "output.weight")}
    assert {t.ggml_type for t in emb.values()} == {typ.upper()} and len(emb) == 2
    for t in emb.values():
        assert t.method == "requantized" and 0 < t.rel_err <= REQUANT_BOUND[typ]
    assert all(t.exact for t in rep.tensors if t.bits is not None)
    _check_readback(tmp_path / "m.gguf", _reference(parent, 4), rep)


def test_embeddings_auto_as_llamacpp_presets(parent, models, tmp_path):
    """auto: Q6_K when rows are multiples of 256, else Q8_0 (llama-quant.cpp's rule for the output matrix); the
    printed bits per weight is Σ tensor bytes · 8 / Σ weights, recounted here from the file by gguf-py."""
    k256 = quick_quantize(models["k256"], models["root"] / "k256-q", bits=4, group_size=32)
    for src, bits, want in ((parent, 4, "Q8_0"), (k256, None, "Q6_K")):
        out = tmp_path / f"{want}.gguf"
        rep = export_gguf(src, out, bits=bits, embed_type="auto")
        emb = {t.name: t for t in rep.tensors if t.name in ("token_embd.weight", "output.weight")}
        assert {t.ggml_type for t in emb.values()} == {want} and len(emb) == 2
        _check_readback(out, _reference(src, bits), rep)
        tensors = gguf.GGUFReader(str(out)).tensors
        assert rep.bits_per_weight == pytest.approx(
            8 * sum(int(t.n_bytes) for t in tensors) / sum(int(t.n_elements) for t in tensors), rel=1e-12
        )
    unquantized = export_gguf(models["small"], tmp_path / "f.gguf", embed_type="auto")  # nothing quantized: float
    assert {t.ggml_type for t in unquantized.tensors} == {"F32"}


# --- metadata, tokenizer, permutation -------------------------------------------------------------------------------


def test_unquantized_model_and_permutation(models, tmp_path):
    """An unquantized model exports as F32; attn_q/attn_k rows are permuted exactly as convert_hf_to_gguf does."""
    from safetensors.torch import load_file

    rep = export_gguf(models["small"], tmp_path / "f32.gguf")
    assert rep.exact and rep.file_type == "f32" and {t.ggml_type for t in rep.tensors} == {"F32"}
    hf = load_file(str(models["small"] / "model.safetensors"))
    raw = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(tmp_path / "f32.gguf")).tensors}
    for kind, heads in (("q", 4), ("k", 2)):
        w = hf[f"model.layers.1.self_attn.{kind}_proj.weight"].numpy()
        hd = 64 // 4
        expect = w.reshape(heads, 2, hd // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)  # LlamaModel.permute
        np.testing.assert_array_equal(raw[f"blk.1.attn_{kind}.weight"], expect)
        np.testing.assert_array_equal(expect[np.argsort(llama_qk_permutation(w.shape[0], heads))], w)
    back = read_gguf_weights(tmp_path / "f32.gguf")
    for k, v in hf.items():
        np.testing.assert_array_equal(back[k], v.numpy(), err_msg=k)


def test_llama_metadata_and_tokenizer(parent, tmp_path):
    export_gguf(parent, tmp_path / "m.gguf", bits=4)
    f = {k: v.contents() for k, v in gguf.GGUFReader(str(tmp_path / "m.gguf")).fields.items()}
    assert f["general.architecture"] == "llama"
    assert (f["llama.context_length"], f["llama.embedding_length"], f["llama.block_count"]) == (256, 64, 2)
    assert (f["llama.feed_forward_length"], f["llama.attention.head_count"], f["llama.attention.head_count_kv"]) == (
        128,
        4,
        2,
    )
    assert f["llama.rope.dimension_count"] == 16 and f["llama.rope.freq_base"] == 10000.0
    assert f["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    assert f["general.quantization_version"] == 2
    tj = json.loads((STORIES / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    assert f["tokenizer.ggml.model"] == "llama"
    assert f["tokenizer.ggml.tokens"] == sorted(vocab, key=vocab.get)
    types, scores = f["tokenizer.ggml.token_type"], f["tokenizer.ggml.scores"]
    assert types[0] == gguf.TokenType.UNKNOWN and types[1] == types[2] == gguf.TokenType.CONTROL
    assert types[vocab["<0x0A>"]] == gguf.TokenType.BYTE and types[vocab["▁the"]] == gguf.TokenType.NORMAL
    assert scores[vocab["▁t"]] == 0.0 and scores[vocab["▁the"]] == -6.0  # −(rank of the first merge making it)
    assert (f["tokenizer.ggml.bos_token_id"], f["tokenizer.ggml.eos_token_id"]) == (1, 2)
    assert f["tokenizer.ggml.unknown_token_id"] == 0
    assert f["tokenizer.ggml.add_bos_token"] is True and f["tokenizer.ggml.add_space_prefix"] is True


def test_stories260k_down_proj(tmp_path):
    """The real model (tied embeddings, head_dim 8, intermediate 172): no output.weight; ffn_down has no blocks."""
    rep = export_gguf(STORIES, tmp_path / "s.gguf")
    names = {t.name for t in rep.tensors}
    assert "output.weight" not in names and "token_embd.weight" in names and len(names) == 2 + 9 * 5
    back = read_gguf_weights(tmp_path / "s.gguf")
    from safetensors.torch import load_file

    for k, v in load_file(str(STORIES / "model.safetensors")).items():
        if k != "lm_head.weight":
            np.testing.assert_array_equal(back[k], v.float().numpy(), err_msg=k)


# --- refusals -------------------------------------------------------------------------------------------------------


def _no_leftovers(d: Path, allowed: set[str]) -> None:
    assert {p.name for p in d.iterdir()} == allowed


def test_refusals(parent, models, tmp_path):
    out = tmp_path / "m.gguf"
    with pytest.raises(UserError, match="Q4_0 cannot hold"):
        export_gguf(parent, out, bits=8, qtype="q4_0")
    with pytest.raises(UserError, match="unknown GGUF type"):
        export_gguf(parent, out, qtype="iq4_xs")
    with pytest.raises(UserError, match="either"):
        export_gguf(parent, out, bits=4, bits_config={"*": 4})
    with pytest.raises(UserError, match="not quantized"):
        export_gguf(models["small"], out, bits=4)
    with pytest.raises(UserError, match="does not exist"):
        export_gguf(tmp_path / "nope", out)
    _no_leftovers(tmp_path, set())
    out.write_bytes(b"keep")
    with pytest.raises(UserError, match="already exists"):
        export_gguf(parent, out, bits=4)
    assert out.read_bytes() == b"keep"
    export_gguf(parent, out, bits=4, overwrite=True)
    assert out.read_bytes()[:4] == b"GGUF"
    _no_leftovers(tmp_path, {"m.gguf"})


def test_unmapped_architecture_refused(parent, tmp_path):
    import shutil

    other = tmp_path / "gpt2"
    shutil.copytree(parent, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["model_type"] = "gpt2"  # quantizable by matgptq, not mapped to llama.cpp's names
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        UserError, match="GGUF export supports the model types llama, .*phi3, .*gemma2.*; this model is 'gpt2'"
    ):
        export_gguf(other, tmp_path / "m.gguf", bits=4)
    assert not (tmp_path / "m.gguf").exists()


def test_cli(parent, tmp_path, capsys):
    from matgptq.cli import main

    out = tmp_path / "m.gguf"
    assert main(["export", str(parent), "--format", "gguf", "--bits", "3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rep = export_gguf(parent, tmp_path / "again.gguf", bits=3, embed_type="auto")  # the CLI's defaults
    n, exact, types = len(rep.tensors), sum(t.exact for t in rep.tensors), rep.types()
    worst = max(rep.tensors, key=lambda t: t.max_abs_err)
    assert types["Q8_0"] == 2 and worst.ggml_type == "Q8_0"  # --embed-type auto (hidden 64): embeddings re-quantized
    by_count = ", ".join(f"{c} {t}" for t, c in sorted(types.items(), key=lambda kv: (-kv[1], kv[0])))
    assert text.split("\n") == [  # a summary, not one row per tensor
        f"{n} tensors: {by_count}",
        f"{exact}/{n} tensors bit-exact, max |Δw| {worst.max_abs_err:.3g} ({worst.name}, Q8_0)",
        f"wrote {out} ({out.stat().st_size / 2**20:.2f} MiB, {rep.bits_per_weight:.2f} bits per weight, mostly Q4_0)",
        "readers: runs in llama.cpp (llama-cpp-python 0.3.36); transformers' GGUF reader (dequantized to float)",
        "",
    ]
    assert (
        main(["export", str(parent), "--format", "gguf", "--bits", "3", "--out", str(out), "--overwrite", "--verbose"])
        == 0
    )
    text = capsys.readouterr().out
    readers = "readers: runs in llama.cpp (llama-cpp-python 0.3.36); transformers' GGUF reader (dequantized to float)"
    assert text.endswith(f"mostly Q4_0)\n{readers}\n") and f"{n} tensors: {by_count}" in text
    rows = [line for line in text.split("\n") if re.match(r"\| (token_embd|blk|output)", line)]
    assert len(rows) == n and re.search(r"token_embd.weight +\| Q8_0", text)
    assert sum(re.search(r"\| (yes|no) +\|", r).group(1) == "yes" for r in rows) == exact
    assert (
        main(
            [
                "export",
                str(parent),
                "--format",
                "gguf",
                "--bits",
                "8",
                "--type",
                "q4_0",
                "--out",
                str(tmp_path / "x.gguf"),
            ]
        )
        == 2
    )
    assert "Q4_0 cannot hold" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()
