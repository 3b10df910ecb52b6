"""Fused experts' Hessians and codes against an independent oracle: the tokens each expert sees come from routing the
block's MoE input by hand (the router's weights and top-k), the Hessian of expert e is (2/n_e)·X_eᵀX_e of those rows,
and its codes are the solver's (gptq_quantize) on its own weight slice with that Hessian. Also the low-token policy
(quantization/experts.py), on its formula and on a model whose router never picks one expert."""

import copy

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from matgptq.api import make_config
from matgptq.quantization import pipeline
from matgptq.quantization.algorithm.grid import NearestRounding
from matgptq.quantization.algorithm.solver import gptq_quantize
from matgptq.quantization.experts import expert_hessians

SIZES = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=16,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    head_dim=8,
    num_experts_per_tok=2,
)
MOE = {
    "qwen3_moe": dict(num_experts=4, moe_intermediate_size=16),
    "gpt_oss": dict(num_local_experts=4, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
}
CFG = dict(group_size=16)


def tiny(model_type, router_bias=None):
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **SIZES, **MOE[model_type])
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    if router_bias is not None:  # gpt_oss: its router has a bias
        with torch.no_grad():
            model.model.layers[0].mlp.router.bias.copy_(torch.tensor(router_bias))
    return model


def windows(n=8, length=32):
    return torch.randint(0, 96, (n, length), generator=torch.Generator().manual_seed(1))


def quantize_recording(model, monkeypatch, cfg):
    """quantize_model's output and, per layer, the Hessian its solver was given."""
    seen = {}
    solve = pipeline.solve_layer

    def recording(w, h, name, rounding, cfg):
        seen[name] = h
        return solve(w, h, name, rounding, cfg)

    monkeypatch.setattr(pipeline, "solve_layer", recording)
    layers, reports, _ = pipeline.quantize_model(model, windows(), cfg, progress=False)
    return layers, reports, seen


def moe_input(model) -> torch.Tensor:
    """The (now quantized) model's input to block 0's MoE module, one row per token."""
    captured = []
    mlp = model.model.layers[0].mlp
    hook = mlp.register_forward_pre_hook(lambda m, args: captured.append(args[0].reshape(-1, args[0].shape[-1])))
    with torch.no_grad():
        model(windows())
    hook.remove()
    return torch.cat(captured)


def by_hand(model_type, mlp, x):
    """Per expert: (rows routed to it, the input its down projection sees), from the router's weights and top-k."""
    router = mlp.gate if model_type == "qwen3_moe" else mlp.router
    logits = x @ router.weight.T + (router.bias if getattr(router, "bias", None) is not None else 0)
    chosen = logits.topk(2, dim=-1).indices  # softmax (qwen3_moe) keeps the order: the same experts
    out = []
    for e in range(4):
        xe = x[(chosen == e).any(-1)]
        if model_type == "qwen3_moe":
            g, u = (xe @ mlp.experts.gate_up_proj[e].T).chunk(2, dim=-1)
            mid = torch.nn.functional.silu(g) * u
        else:  # gpt_oss: transposed storage, bias, gate/up interleaved, clamped swiglu
            gu = xe @ mlp.experts.gate_up_proj[e] + mlp.experts.gate_up_proj_bias[e]
            g, u = gu[:, ::2].clamp(max=7.0), gu[:, 1::2].clamp(-7.0, 7.0)
            mid = (u + 1) * (g * torch.sigmoid(g * 1.702))
        out.append((xe, mid))
    return out


def gram(x: torch.Tensor) -> torch.Tensor:
    return (2 / x.shape[0]) * x.double().T @ x.double()


@pytest.mark.parametrize("model_type", sorted(MOE))
def test_each_expert_hessian_and_codes_match_a_hand_routed_oracle(model_type, monkeypatch):
    model = tiny(model_type)
    fp = copy.deepcopy(model)
    cfg = make_config("gptq", 4, **CFG)
    layers, reports, seen = quantize_recording(model, monkeypatch, cfg)
    mlp, fp_mlp = model.model.layers[0].mlp, fp.model.layers[0].mlp
    with torch.no_grad():
        routed = by_hand(model_type, mlp, moe_input(model))
    assert sum(xe.shape[0] for xe, _ in routed) == 2 * windows().numel()
    tokens = {r.name: r.tokens for r in reports}
    for e, (xe, mid) in enumerate(routed):
        for proj, rows in (("gate_up_proj", xe), ("down_proj", mid)):
            name = f"model.layers.0.mlp.experts.{e}.{proj}"
            assert tokens[name] == rows.shape[0] >= rows.shape[1]  # enough tokens: the expert's own Hessian
            torch.testing.assert_close(seen[name].double(), gram(rows), rtol=1e-4, atol=1e-5)
            slot = getattr(fp_mlp.experts, proj)[e]
            w = (slot.T if model_type == "gpt_oss" else slot).detach().float()
            ref = gptq_quantize(
                w,
                seen[name],
                NearestRounding(4),
                group_size=cfg.group_size,
                sym=cfg.sym,
                act_order=cfg.act_order,
                static_groups=cfg.static_groups,
                mse=cfg.mse,
                damp=cfg.damp,
                block_size=cfg.block_size,
                signed=cfg.signed_scale,
                mse_weighted=cfg.mse_weighted,
                group_order=cfg.group_act_order,
            )  # the settings of the pipeline's cfg
            assert torch.equal(layers[name].codes, ref.codes)  # (its scales are refit afterwards: refit.py)
            # the codes landed in the fused tensor itself
            now = getattr(mlp.experts, proj)[e]
            assert torch.equal(now.T if model_type == "gpt_oss" else now, layers[name].dequantize())
    router = "gate" if model_type == "qwen3_moe" else "router"
    assert torch.equal(getattr(mlp, router).weight, getattr(fp_mlp, router).weight)  # the router stays float


def test_the_low_token_policy_shrinks_towards_the_token_weighted_mean():
    from matgptq.models.experts import FusedExperts

    experts = (FusedExperts("mlp.experts", ("gate_up_proj", "down_proj"), 3, False),)
    names = tuple(f"mlp.experts.{e}.gate_up_proj" for e in range(3))
    h = [torch.eye(4) * (e + 1) for e in range(3)]
    hessians, rows = dict(zip(names, h)), dict(zip(names, (10, 2)))  # expert 2 saw no token, expert 1 two (< K = 4)
    info = expert_hessians(hessians, rows, names, experts)
    mean = (10 * h[0] + 2 * h[1]) / 12
    assert info == {names[0]: (10, False), names[1]: (2, True), names[2]: (0, True)}
    assert hessians[names[0]] is h[0]
    torch.testing.assert_close(hessians[names[1]], (2 * h[1] + 2 * mean) / 4)
    torch.testing.assert_close(hessians[names[2]], mean)


def test_an_expert_the_router_never_picks_gets_the_mean_hessian_and_is_reported(monkeypatch):
    model = tiny("gpt_oss", router_bias=[0.0, 0.0, 0.0, -1e4])
    layers, reports, seen = quantize_recording(model, monkeypatch, make_config("gptq", 4, **CFG))
    report = {r.name: r for r in reports}
    for proj in ("gate_up_proj", "down_proj"):
        names = [f"model.layers.0.mlp.experts.{e}.{proj}" for e in range(4)]
        n = [report[name].tokens for name in names]
        assert n[3] == 0 and report[names[3]].starved and not any(report[m].starved for m in names[:3])
        mean = sum(seen[m] * (k / sum(n)) for m, k in zip(names[:3], n[:3]))
        torch.testing.assert_close(seen[names[3]], mean)
        assert names[3] in layers  # quantized with the policy's Hessian, not left out
