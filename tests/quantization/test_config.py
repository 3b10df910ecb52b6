"""QuantConfig's per-method defaults: what a None field becomes, what an old checkpoint's record means, and what
--target gguf changes."""

import re

import pytest

from matgptq.errors import UserError
from matgptq.formats.gguf import KQuantType
from matgptq.quantization.config import GGUF_BLOCK, Method, QuantConfig, Target


def test_gptq_defaults_and_options_that_mean_nothing_stay_off():
    cfg = QuantConfig(method=Method.GPTQ, bits=4)
    assert (cfg.group_size, cfg.group_act_order, cfg.mse, cfg.mse_weighted, cfg.refit_scales) == (128, True, True, True, True)
    assert QuantConfig(bits=4, act_order=True).group_act_order is False  # act-order orders every column itself
    assert QuantConfig(bits=4, mse=False).mse_weighted is False  # no search to weight
    rtn = QuantConfig(method=Method.RTN, bits=4)  # no Hessian: nothing to weight or refit by
    assert (rtn.group_size, rtn.mse_weighted, rtn.refit_scales) == (128, False, False)


def test_a_record_from_before_an_option_existed_reads_without_it():
    """A checkpoint's settings written before group act-order, the weighted search and the refit existed lack those
    keys; it was made without them, whatever today's defaults are."""
    old = {"method": "gptq", "bits": 4, "group_size": -1, "sym": True, "act_order": False, "static_groups": False,
           "mse": False, "damp": 0.01, "block_size": 128, "true_sequential": True}  # fmt: skip
    cfg = QuantConfig.from_json(old)
    assert (cfg.group_size, cfg.group_act_order, cfg.mse_weighted, cfg.refit_scales) == (-1, False, False, False)
    assert QuantConfig.from_json(QuantConfig(bits=3).to_json()) == QuantConfig(bits=3)


def test_target_gguf_shapes_the_grid_for_llama_cpp():
    """--target gguf: Q4_0's signed scale and 32-column block, unless the user said otherwise or it cannot apply."""
    cfg = QuantConfig(bits=4, target=Target.GGUF)
    assert (cfg.signed_scale, cfg.group_size, cfg.mse_weighted, cfg.refit_scales) == (True, GGUF_BLOCK, True, True)
    assert QuantConfig(bits=4).signed_scale is False  # the plain grid without a target
    assert QuantConfig(bits=4, target="gguf", signed_scale=False).signed_scale is False  # said by the user
    assert QuantConfig(bits=4, target="gguf", sym=False).signed_scale is False  # asymmetric: Q4_1's grid, unsigned
    q4k = QuantConfig(bits=4, target="gguf", kquant="q4_k", group_size=32)  # unsigned sub-scales, no signed grid
    assert (q4k.signed_scale, q4k.kquant) == (False, KQuantType.Q4_K)
    assert QuantConfig(bits=6, target="gguf", kquant="q6_k", group_size=16).signed_scale is True  # Q6_K's are signed
    assert QuantConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize("options,message", [
    (dict(group_size=128), "drop --group-size 128"),
    (dict(act_order=True), "add --static-groups"),
    (dict(target="ggml"), "unknown target 'ggml'; use one of any, gguf"),
])  # fmt: skip
def test_target_gguf_refuses_what_llama_cpp_blocks_cannot_hold(options, message):
    with pytest.raises(UserError, match=re.escape(message)):
        QuantConfig(bits=4, **{"target": "gguf", **options})


def test_matgptq_defaults_group_act_order_and_refit_without_the_scale_search():
    """A parent's defaults (scripts/gptq_defaults.py measured them): group act-order and the master's scale refit,
    both free in CPU time; the scale search, which costs a parent ~2.8x, stays off."""
    cfg = QuantConfig(method=Method.MATGPTQ, bits=8, target_bits=(3, 4, 8))
    assert (cfg.group_size, cfg.group_act_order, cfg.refit_scales, cfg.mse, cfg.mse_weighted) == (128, True, True, False, False)
