"""The typed configs: each method's defaults (what a None field becomes), what an old checkpoint's record means,
what --target gguf changes, the checks each config makes in its own terms, and the metadata round trip."""

import re

import pytest

from matgptq.api import make_config
from matgptq.errors import UserError
from matgptq.formats.gguf import KQuantType
from matgptq.quantization import GPTQConfig, MatGPTQConfig, RTNConfig, config_for, config_from_json
from matgptq.quantization.config import GGUF_BLOCK, Method, Target
from matgptq.quantization.method_configs import METHOD_DEFAULTS


def test_gptq_defaults_and_options_that_mean_nothing_stay_off():
    cfg = GPTQConfig(bits=4)
    assert (
        cfg.group_size,
        cfg.act_order,
        cfg.static_groups,
        cfg.group_act_order,
        cfg.mse,
        cfg.mse_weighted,
        cfg.refit_scales,
    ) == (128, True, True, False, True, True, True)
    gar = GPTQConfig(bits=4, group_act_order=True)  # asked for: GAR instead of act order, as before it was default
    assert (gar.act_order, gar.static_groups, gar.group_act_order) == (False, False, True)
    assert GPTQConfig(bits=4, act_order=False).group_act_order is True  # without act order, GAR's order
    assert GPTQConfig(bits=4, act_order=True).group_act_order is False  # act-order orders every column itself
    g_idx = GPTQConfig(bits=4, act_order=True, static_groups=False)  # act order's own g_idx layout, when asked for
    assert (g_idx.act_order, g_idx.static_groups) == (True, False)
    assert GPTQConfig(bits=4, mse=False).mse_weighted is False  # no search to weight
    rtn = RTNConfig(bits=4)  # no Hessian: nothing to weight, order or refit by, so no such fields
    assert rtn.group_size == 128 and not any(hasattr(rtn, k) for k in ("mse_weighted", "refit_scales", "damp"))


def test_the_defaults_table_is_read_from_the_configs():
    """--help and docs/guide/quantize.md show METHOD_DEFAULTS; it is what each config resolves to, per method."""
    assert METHOD_DEFAULTS[Method.GPTQ] == {
        "group_size": 128,
        "act_order": True,
        "static_groups": True,
        "group_act_order": False,
        "mse": True,
        "mse_weighted": True,
        "refit_scales": True,
        "damp": 0.01,
    }
    assert METHOD_DEFAULTS[Method.MATGPTQ] == METHOD_DEFAULTS[Method.GPTQ]  # a parent takes GPTQ's options
    assert METHOD_DEFAULTS[Method.RTN] == {
        "group_size": 128,
        "act_order": False,
        "static_groups": False,
        "group_act_order": False,
        "mse": False,
        "mse_weighted": False,
        "refit_scales": False,
    }


def test_a_record_from_before_an_option_existed_reads_without_it():
    """A checkpoint's settings written before group act-order, the weighted search and the refit existed lack those
    keys; it was made without them, whatever today's defaults are. Older records wrote every key for every method."""
    old = {
        "method": "gptq",
        "bits": 4,
        "group_size": -1,
        "sym": True,
        "act_order": False,
        "static_groups": False,
        "mse": False,
        "damp": 0.01,
        "block_size": 128,
        "true_sequential": True,
    }
    cfg = config_from_json(old)
    assert (cfg.group_size, cfg.group_act_order, cfg.mse_weighted, cfg.refit_scales) == (-1, False, False, False)
    old_rtn = {"method": "rtn", "bits": 3, "group_size": 64, "act_order": False, "damp": 0.01, "target_bits": [3]}
    assert config_from_json(old_rtn) == RTNConfig(bits=3, group_size=64)


@pytest.mark.parametrize(
    "cfg",
    [
        RTNConfig(bits=3, group_size=32, sym=False, skip=("mlp",)),
        GPTQConfig(bits=4, act_order=True, static_groups=True, layer_bits=(("a", 3), ("b", 4))),
        GPTQConfig(bits=3, group_size=32, kquant="q3_k"),
        MatGPTQConfig(bits=8, target_bits=(3, 4, 8), bit_weights=(1.0, 2.0, 4.0), variant="paper"),
        MatGPTQConfig(bits=6, target="gguf"),
    ],
)
def test_every_config_round_trips_through_its_record(cfg):
    assert config_from_json(cfg.to_json()) == cfg and type(config_from_json(cfg.to_json())) is type(cfg)


def test_target_gguf_shapes_the_grid_for_llama_cpp():
    """--target gguf: Q4_0's signed scale and 32-column block, unless the user said otherwise or it cannot apply."""
    cfg = GPTQConfig(bits=4, target=Target.GGUF)
    assert (cfg.signed_scale, cfg.group_size, cfg.mse_weighted, cfg.refit_scales) == (True, GGUF_BLOCK, True, True)
    assert GPTQConfig(bits=4).signed_scale is False  # the plain grid without a target
    assert GPTQConfig(bits=4, target="gguf", signed_scale=False).signed_scale is False  # said by the user
    assert GPTQConfig(bits=4, target="gguf", sym=False).signed_scale is False  # asymmetric: Q4_1's grid, unsigned
    q4k = GPTQConfig(bits=4, target="gguf", kquant="q4_k", group_size=32)  # unsigned sub-scales, no signed grid
    assert (q4k.signed_scale, q4k.kquant) == (False, KQuantType.Q4_K)
    assert GPTQConfig(bits=6, target="gguf", kquant="q6_k", group_size=16).signed_scale is True  # Q6_K's are signed
    assert RTNConfig(bits=4, target="gguf").group_size == GGUF_BLOCK


@pytest.mark.parametrize(
    "options,message",
    [
        (dict(group_size=128), "drop --group-size 128"),
        (dict(act_order=True, static_groups=False), "drop --no-static-groups"),
        (dict(target="ggml"), "unknown target 'ggml'; use one of any, gguf"),
    ],
)
def test_target_gguf_refuses_what_llama_cpp_blocks_cannot_hold(options, message):
    with pytest.raises(UserError, match=re.escape(message)):
        GPTQConfig(bits=4, **{"target": "gguf", **options})


def test_matgptq_defaults_are_gptqs_with_a_master_weight_of_four():
    """A parent's defaults (docs/decisions/matgptq-defaults.md): GPTQ's options (act order with static groups, the
    weighted scale search, the refit) and λ = 1 for each target width but 4 for the master."""
    cfg, gptq = MatGPTQConfig(bits=8, target_bits=(3, 4, 8)), GPTQConfig(bits=8)
    options = ("group_size", "act_order", "static_groups", "group_act_order", "mse", "mse_weighted", "refit_scales")
    assert (
        [getattr(cfg, k) for k in options]
        == [getattr(gptq, k) for k in options]
        == [128, True, True, False, True, True, True]
    )
    assert cfg.bit_weights == (1.0, 1.0, 4.0) and cfg.widths == (3, 4, 8)
    assert MatGPTQConfig(bits=8, target_bits=(3, 4, 8), variant="paper").bit_weights == (1.0, 1.0, 1.0)


@pytest.mark.parametrize(
    "build,message",
    [
        (lambda: config_for("rtn", bits=4, refit_scales=True), "--refit-scales fits scales on the calibration Hessian"),
        (lambda: config_for("rtn", bits=4, mse_weighted=True), "--mse-weighted weights the calibration Hessian"),
        (lambda: config_for("rtn", bits=4, act_order=True), "--act-order orders columns by the calibration Hessian"),
        (lambda: config_for("gptq", bits=4, mse=False, mse_weighted=True), "drop --no-mse"),
        (lambda: GPTQConfig(bits=4, damp=0.0), "damping must be in (0, 1]"),
        (lambda: GPTQConfig(bits=9), "bits must be between 2 and 8"),
        (lambda: MatGPTQConfig(bits=4, target_bits=(3, 5)), "target width 5 must be between 2 and the master width 4"),
        (lambda: MatGPTQConfig(bits=4, layer_bits=(("a", 4),)), "a per-layer width mix is for --method gptq or rtn"),
        (lambda: make_config("gptq", (3, 4)), "use --method matgptq for several"),
        (lambda: make_config("awq", 4), "unknown method 'awq'; use one of gptq, rtn, matgptq"),
        (lambda: config_from_json({"method": "gptq", "bits": 4, "damp": "x"}), "`quantization` record is not valid"),
    ],
)
def test_each_config_checks_its_own_options(build, message):
    with pytest.raises(UserError, match=re.escape(message)):
        build()


def test_options_a_method_does_not_have_are_dropped_when_unset():
    """The CLI passes every option; those a method does not have are dropped when off or unset."""
    cfg = config_for("rtn", bits=4, act_order=False, damp=None, block_size=128, variant="per-width-scales", mse=None)
    assert cfg == RTNConfig(bits=4)
    with pytest.raises(TypeError, match="unknown quantization option"):
        config_for("gptq", bits=4, dampening=0.1)
