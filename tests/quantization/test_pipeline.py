"""The sequential pipeline on tiny random models of many architectures (built here, no downloads): those with a
written-out ArchSpec (llama ... gpt2) and those found from the model alone (gemma2 ... opt, models/arch.py)."""

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    OPTConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
)

from matgptq.api import make_config
from matgptq.errors import UserError
from matgptq.models.arch import arch_spec, quantized_layer_names, weight_matrix
from matgptq.quantization.pipeline import quantize_model

COMMON = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
CONFIGS = {
    "llama": lambda: LlamaConfig(**COMMON),
    "mistral": lambda: MistralConfig(**COMMON),
    "qwen2": lambda: Qwen2Config(**COMMON),
    "qwen3": lambda: Qwen3Config(**COMMON, head_dim=8),
    "phi3": lambda: Phi3Config(**COMMON, pad_token_id=0),
    "gpt2": lambda: GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64),
    "gemma2": lambda: AutoConfig.for_model("gemma2", **COMMON, head_dim=8, pad_token_id=0),
    "gemma3_text": lambda: AutoConfig.for_model("gemma3_text", **COMMON, head_dim=8, pad_token_id=0),
    "olmo2": lambda: AutoConfig.for_model("olmo2", **COMMON, pad_token_id=0, eos_token_id=1),
    "granite": lambda: AutoConfig.for_model("granite", **COMMON, pad_token_id=0),
    "opt": lambda: OPTConfig(
        vocab_size=96,
        hidden_size=32,
        num_hidden_layers=2,
        ffn_dim=64,
        num_attention_heads=4,
        word_embed_proj_dim=32,
        max_position_embeddings=64,
        pad_token_id=0,
    ),
}
LAYERS_PER_BLOCK = {
    "llama": 7,
    "mistral": 7,
    "qwen2": 7,
    "qwen3": 7,
    "phi3": 4,
    "gpt2": 4,
    "gemma2": 7,
    "gemma3_text": 7,
    "olmo2": 7,
    "granite": 7,
    "opt": 6,
}


def tiny_model(kind):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(CONFIGS[kind](), attn_implementation="eager").eval()


def windows(n=8, length=24, vocab=96):
    return torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_every_architecture_quantizes_every_block_linear(kind):
    model = tiny_model(kind)
    fp_logits = model(windows()).logits
    spec = arch_spec(model)
    layers, reports, _ = quantize_model(model, windows(), make_config("gptq", 4, group_size=16), progress=False)
    assert sorted(layers) == sorted(quantized_layer_names(model, spec))  # (a traced order may differ from module order)
    assert len(layers) == 2 * LAYERS_PER_BLOCK[kind]
    for name, q in layers.items():
        module = model.get_submodule(name)
        assert torch.equal(weight_matrix(module, spec), q.dequantize())  # Conv1D: stored transposed
        assert q.codes.shape == weight_matrix(module, spec).shape
    assert not isinstance(model.get_submodule("lm_head").weight, type(None))
    q_logits = model(windows()).logits
    rel = (q_logits - fp_logits).norm() / fp_logits.norm()
    assert 0 < rel < 0.5
    assert all(0 <= rep.rel_error[4] < 0.1 for rep in reports)


def test_gptq_beats_rtn_on_model_output():
    x = windows(16, 32)
    ref = tiny_model("llama")(x).logits
    errors = {}
    for method in ("rtn", "gptq"):
        model = tiny_model("llama")
        quantize_model(model, x, make_config(method, 3), progress=False)
        errors[method] = float((model(x).logits - ref).norm())
    assert errors["gptq"] < errors["rtn"]


def test_matgptq_propagates_master_width_and_reports_every_target():
    model = tiny_model("llama")
    cfg = make_config("matgptq", (3, 4, 8), act_order=True, static_groups=False)
    layers, reports, _ = quantize_model(model, windows(), cfg, progress=False)
    assert all(q.bits == 8 for q in layers.values())
    assert all(set(rep.rel_error) == {3, 4, 8} for rep in reports)
    assert all(rep.rel_error[3] > rep.rel_error[8] for rep in reports)


def test_default_variant_stores_target_width_scales_and_each_variant_its_rounding():
    from matgptq.quantization.algorithm.multibit import MatryoshkaRounding, PerWidthRounding
    from matgptq.quantization.config import Variant
    from matgptq.quantization.layer import make_rounding

    default, paper = make_config("matgptq", (3, 4, 8)), make_config("matgptq", (3, 4, 8), variant="paper")
    assert default.variant is Variant.PER_WIDTH_SCALES and default.bit_weights == (1.0, 1.0, 4.0)
    assert paper.bit_weights == (1.0, 1.0, 1.0) and make_config("gptq", 4).widths == (4,)
    assert type(make_rounding(paper)) is MatryoshkaRounding and type(make_rounding(default)) is PerWidthRounding
    layers, reports, _ = quantize_model(tiny_model("llama"), windows(), default, progress=False)
    for q in layers.values():
        assert sorted(q.width_scales) == [3, 4]  # the targets below the master; 6 and 8 slice on the master scale
        assert torch.equal(q.slice(3).scales, q.width_scales[3]) and torch.equal(q.slice(6).scales, q.scales)
    with pytest.raises(UserError, match="unknown MatGPTQ variant 'best'"):
        make_config("matgptq", (3, 4, 8), variant="best")


@pytest.mark.parametrize("method", ["gptq", "matgptq"])
def test_refit_scales_keeps_the_codes_and_the_model_uses_the_refit_scales(method):
    """--refit-scales changes only scales; what later layers were calibrated on is the refit model (true sequential),
    so codes may differ from the second layer on, but each stored layer dequantizes to what the model holds."""
    bits = (3, 4, 8) if method == "matgptq" else 4
    x = windows(16, 32)
    ref = tiny_model("llama")(x).logits
    out = {}
    for refit in (False, True):
        model = tiny_model("llama")
        cfg = make_config(method, bits, group_size=16, refit_scales=refit)
        layers, _, _ = quantize_model(model, x, cfg, progress=False)
        for name, q in layers.items():
            assert torch.equal(weight_matrix(model.get_submodule(name), arch_spec(tiny_model("llama"))), q.dequantize())
        with torch.no_grad():
            out[refit] = (layers, float((model(x).logits - ref).norm()))
    first = "model.layers.0.self_attn.q_proj"  # the first layer solved: same inputs, same codes
    assert torch.equal(out[True][0][first].codes, out[False][0][first].codes)
    assert not torch.equal(out[True][0][first].scales, out[False][0][first].scales)
    assert out[True][1] < out[False][1]  # the model's output is closer to the unquantized one
    with pytest.raises(UserError, match="--refit-scales.*RTN"):
        make_config("rtn", 4, refit_scales=True)


def test_a_width_mix_solves_each_layer_as_its_own_one_width_run():
    """Oracle: one-width runs. Block 0's first group (q/k/v) is solved from the unquantized model's inputs in every
    run, so each of its layers must equal, bit for bit, that layer of the one-width run at its width; every layer
    is stored and reported at its own width."""
    x = windows(16, 32)
    names = quantized_layer_names(tiny_model("llama"), arch_spec(tiny_model("llama")))
    mix = dict.fromkeys(names, 4) | {
        "model.layers.0.self_attn.k_proj": 8,
        "model.layers.0.self_attn.v_proj": 3,
        "model.layers.1.mlp.down_proj": 6,
    }
    options = dict(group_size=16, act_order=True, static_groups=False, mse=True)
    cfg = make_config("gptq", 8, layer_bits=tuple(mix.items()), **options)
    layers, reports, _ = quantize_model(tiny_model("llama"), x, cfg, progress=False)
    assert {n: q.bits for n, q in layers.items()} == mix
    assert all(int(q.codes.max()) < 2**q.bits for q in layers.values())
    assert {rep.name: tuple(rep.rel_error) for rep in reports} == {n: (r,) for n, r in mix.items()}
    for name in names[:3]:
        one, _, _ = quantize_model(tiny_model("llama"), x, make_config("gptq", mix[name], **options), progress=False)
        assert torch.equal(layers[name].codes, one[name].codes) and torch.equal(layers[name].scales, one[name].scales)


@pytest.mark.parametrize(
    "method,bits,widths,match",
    [
        ("matgptq", "4,8", {"a": 4}, "already holds every width"),
        ("gptq", 8, {"a": 4, "b": 9}, "widths are 2..8"),
        ("gptq", 8, {"a": 4, "b": 5}, "widest width of the mix"),
    ],
)
def test_bad_width_mixes_are_clear_errors(method, bits, widths, match):
    with pytest.raises(UserError, match=match):
        make_config(method, bits, layer_bits=tuple(widths.items()))


@pytest.mark.parametrize("model_type,experts", [("qwen3_moe", "num_experts"), ("mixtral", "num_local_experts")])
def test_fused_experts_are_quantized_one_expert_projection_at_a_time(model_type, experts):
    config = AutoConfig.for_model(model_type, **COMMON, **{experts: 4}, num_experts_per_tok=2, moe_intermediate_size=16)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    fp_logits = model(windows()).logits
    layers, _, _ = quantize_model(model, windows(), make_config("gptq", 4, group_size=16), progress=False)
    spec = arch_spec(model)
    assert sorted(layers) == sorted(quantized_layer_names(model, spec)) and len(layers) == 2 * (4 + 2 * 4)
    for i in range(2):
        module = model.model.layers[i].mlp.experts
        assert "forward" not in vars(module) and "0" not in module._modules  # the calibration proxies are gone
        for e in range(4):  # the codes are in the fused tensors, the model's forward unchanged
            for proj in ("gate_up_proj", "down_proj"):
                q = layers[f"model.layers.{i}.mlp.experts.{e}.{proj}"]
                assert torch.equal(getattr(module, proj)[e], q.dequantize())
    rel = (model(windows()).logits - fp_logits).norm() / fp_logits.norm()
    assert 0 < rel < 0.5


def test_nan_weights_are_refused():
    model = tiny_model("llama")
    model.model.layers[0].mlp.up_proj.weight.data[0, 0] = float("nan")
    with pytest.raises(UserError, match="NaN or Inf"):
        quantize_model(model, windows(), make_config("gptq", 4), progress=False)


def test_skip_leaves_matching_linears_unquantized():
    model = tiny_model("llama")
    before = {n: p.clone() for n, p in model.named_parameters() if "down_proj" in n}
    layers, _, _ = quantize_model(model, windows(), make_config("gptq", 4, skip=(r"mlp\.down_proj$",)), progress=False)
    assert not any("down_proj" in n for n in layers) and len(layers) == 2 * 6
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if "down_proj" in n)


def test_a_streamed_run_holds_no_tensor_outside_the_blocks_while_they_are_quantized(tmp_path):
    """With a source (models/lazy.py) the embeddings, final norm and lm_head are on meta from the first block read to
    the last freed, and are back (as from_pretrained loads them) when quantize_model returns."""
    from matgptq.models import load_fp_model
    from matgptq.models.lazy import LazyModel
    from tests.conftest import make_tiny_llama

    path = make_tiny_llama(tmp_path / "m", layers=3)
    lazy = LazyModel.open(path)
    outside = lambda: {p.device.type for n, p in lazy.model.named_parameters() if ".layers." not in n}  # noqa: E731
    seen, load = [], lazy.load_block
    lazy.load_block = lambda i, device: seen.append(outside()) or load(i, device)
    windows = torch.randint(0, 512, (4, 32), generator=torch.Generator().manual_seed(0))
    quantize_model(lazy.model, windows, make_config("gptq", 4, group_size=32), progress=False, source=lazy)
    assert seen == [{"meta"}] * 3
    want = load_fp_model(path).state_dict()
    assert all(torch.equal(p, want[n]) for n, p in lazy.model.named_parameters() if ".layers." not in n)


def test_each_window_is_calibrated_by_exactly_one_rank_and_too_few_are_refused():
    """Under torchrun the ranks' windows partition the calibration set in order (their concatenation is the set), a
    run without data (RTN) or in one process keeps them all, and a set smaller than the world, or a mixture-of-experts
    model under several processes, is refused in one line."""
    from types import SimpleNamespace

    from matgptq.quantization.block_io import this_rank_windows

    windows, dense = torch.arange(7 * 3).reshape(7, 3), SimpleNamespace(experts=())
    for size in (1, 2, 3, 7):
        parts = [this_rank_windows(windows, dense, True, rank, size) for rank in range(size)]
        assert all(len(p) >= 1 for p in parts)
        assert torch.equal(torch.cat(parts), windows)
    assert torch.equal(this_rank_windows(windows, dense, False, 1, 2), windows)
    with pytest.raises(UserError, match="leave some without work"):
        this_rank_windows(windows, dense, True, 0, 8)
    with pytest.raises(UserError, match="one process"):
        this_rank_windows(windows, SimpleNamespace(experts=("experts",)), True, 0, 2)
