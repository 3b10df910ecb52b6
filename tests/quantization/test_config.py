"""QuantConfig's per-method defaults: what a None field becomes, and what an old checkpoint's record means."""

from matgptq.quantization.config import Method, QuantConfig


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
