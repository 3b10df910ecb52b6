"""quantization/narrow.py: the bfloat16 twin of a block and the first block's inputs cast for it (the whole path,
against a bfloat16 model as the oracle: tests/test_api.py)."""

import torch
from torch import nn

from matgptq.quantization.narrow import cast_inputs, twin


def test_cast_inputs_casts_floats_and_keeps_masks_and_positions():
    hidden = torch.randn(2, 5, 8)
    cos, sin = torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    low = torch.finfo(torch.float32).min
    additive = torch.tensor([[0.0, low], [0.0, 0.0]])
    kwargs = {
        "position_embeddings": (cos, sin),
        "attention_mask": additive,
        "causal": torch.ones(5, 5).bool(),
        "position_ids": torch.arange(5)[None],
        "use_cache": False,
    }
    [(h, kw)] = cast_inputs([(hidden, kwargs)], torch.bfloat16)
    assert h.dtype is torch.bfloat16 and torch.equal(h, hidden.to(torch.bfloat16))
    assert isinstance(kw["position_embeddings"], tuple)
    assert all(torch.equal(a, b.to(torch.bfloat16)) for a, b in zip(kw["position_embeddings"], (cos, sin)))
    # float32's finfo.min is beyond bfloat16's largest finite value: cast plainly it would become -inf
    assert torch.isinf(torch.tensor(low).to(torch.bfloat16))
    assert (
        kw["attention_mask"].dtype is torch.bfloat16 and kw["attention_mask"][0, 1] == torch.finfo(torch.bfloat16).min
    )
    assert (
        kw["causal"] is kwargs["causal"] and kw["position_ids"] is kwargs["position_ids"] and kw["use_cache"] is False
    )
    assert cast_inputs([(hidden, kwargs)], None)[0][0] is hidden


def test_twin_is_a_copy_in_the_dtype_and_leaves_the_block_alone():
    block = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    before = {k: v.clone() for k, v in block.state_dict().items()}
    assert twin(block, None) is block and twin(block, torch.float32) is block
    copy = twin(block, torch.bfloat16)
    assert copy is not block and all(p.dtype is torch.bfloat16 for p in copy.parameters())
    for k, v in block.state_dict().items():
        assert v.dtype is torch.float32 and torch.equal(v, before[k])
        assert torch.equal(copy.state_dict()[k], v.to(torch.bfloat16))
