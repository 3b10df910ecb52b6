"""formats/quantized.py: QuantizedWeight's own methods beyond dequantize and slice (tested in test_slicing.py)."""


def test_quantized_weight_to_moves_every_tensor_and_keeps_one_already_there():
    """QuantizedWeight.to (the pipeline's device moves): every tensor, per-width scales and perm included, goes to
    the device; on its own device the weight is returned as it is."""
    import torch

    from tests.conftest import random_parent

    q = random_parent(8, 64, 32, act_order=True, width_scales=True)
    q = type(q)(**{**q.__dict__, "perm": torch.randperm(64)})
    assert q.to("cpu") is q
    meta = q.to("meta")
    tensors = [meta.codes, meta.scales, meta.zeros, meta.g_idx, meta.perm, *meta.width_scales.values()]
    assert all(t.device.type == "meta" for t in tensors) and set(meta.width_scales) == set(q.width_scales)
    assert meta.bits == q.bits and meta.shift == q.shift and meta.to("meta") is meta
