"""models/lazy.py: a model built on the meta device with its blocks read from the safetensors files one at a time
holds, block for block, exactly what transformers' `from_pretrained` loads (the oracle: load_fp_model), and the same
logits once every block is read; a block given back is on meta again (no memory)."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file, save_file

from matgptq.models import load_fp_model
from matgptq.models.lazy import LazyModel
from tests.conftest import make_tiny_llama


def _all_blocks(lazy: LazyModel) -> None:
    for i in range(len(lazy.blocks)):
        lazy.load_block(i, torch.device("cpu"))


def _same_as_from_pretrained(path, dtype=None) -> None:
    lazy = LazyModel.open(path, dtype)
    assert lazy is not None
    assert all(p.device.type == "meta" for b in lazy.blocks for p in b.parameters())  # nothing of the blocks read
    assert all(p.device.type == "cpu" for n, p in lazy.model.named_parameters() if ".layers." not in n)
    _all_blocks(lazy)
    ref = load_fp_model(path, dtype)
    got, want = lazy.model.state_dict(), ref.state_dict()
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert torch.equal(got[name], want[name]), name
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(lazy.model(ids).logits, ref(ids).logits)


def test_untied_llama_matches_from_pretrained(tmp_path):
    _same_as_from_pretrained(make_tiny_llama(tmp_path / "m", layers=3))


def test_requested_dtype_matches_from_pretrained(tmp_path):
    _same_as_from_pretrained(make_tiny_llama(tmp_path / "m"), torch.bfloat16)


def test_tied_embeddings_and_shards(tmp_path):
    """lm_head tied to the embeddings (not in the files) and the tensors spread over two shard files."""
    path = make_tiny_llama(tmp_path / "m")
    cfg = (path / "config.json").read_text().replace('"tie_word_embeddings": false', '"tie_word_embeddings": true')
    (path / "config.json").write_text(cfg)
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["lm_head.weight"]
    names = sorted(tensors)
    (path / "model.safetensors").unlink()
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2 :]}  # fmt: skip
    for file, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, str(path / file), metadata={"format": "pt"})
    weight_map = {k: file for file, keys in halves.items() for k in keys}
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    _same_as_from_pretrained(path)
    lazy = LazyModel.open(path)
    assert lazy.model.lm_head.weight is lazy.model.model.embed_tokens.weight


def test_free_block_releases_the_weights(tmp_path):
    lazy = LazyModel.open(make_tiny_llama(tmp_path / "m"))
    block = lazy.load_block(1, torch.device("cpu"))
    assert all(p.device.type == "cpu" for p in block.parameters())
    lazy.free_block(1)
    assert all(p.device.type == "meta" for p in lazy.blocks[1].parameters())
    assert all(p.device.type == "meta" for p in lazy.blocks[0].parameters())


def test_files_not_covering_the_parameters_are_not_streamable(tmp_path):
    """A weight stored under another name: transformers would warn and initialise it; streaming declines (None)."""
    path = make_tiny_llama(tmp_path / "m")
    tensors = load_file(str(path / "model.safetensors"))
    tensors["renamed.q_proj"] = tensors.pop("model.layers.0.self_attn.q_proj.weight")
    save_file(tensors, str(path / "model.safetensors"))
    assert LazyModel.open(path) is None
