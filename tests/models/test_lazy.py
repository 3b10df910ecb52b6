"""models/lazy.py: a model built on the meta device with its blocks read from the safetensors files one at a time
holds, block for block, exactly what transformers' `from_pretrained` loads (the oracle: load_fp_model), and the same
logits once every block is read; a block given back is on meta again (no memory)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from matgptq.models import load_fp_model
from matgptq.models.lazy import LazyModel
from tests.conftest import TINYSTORIES, make_tiny_llama


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
    halves = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
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


def test_outside_tensors_released_and_read_again(tmp_path):
    """free_outside puts the embeddings, final norm and (tied) lm_head on meta and lets go of their memory;
    load_outside reads them again as `open` did (the oracle: from_pretrained) and ties lm_head again."""
    path = make_tiny_llama(tmp_path / "m")
    cfg = (path / "config.json").read_text().replace('"tie_word_embeddings": false', '"tie_word_embeddings": true')
    (path / "config.json").write_text(cfg)
    lazy = LazyModel.open(path)
    lazy.load_block(0, torch.device("cpu"))
    lazy.free_outside()
    outside = [(n, p) for n, p in lazy.model.named_parameters(remove_duplicate=False) if ".layers." not in n]
    assert {n for n, _ in outside} >= {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    assert all(p.device.type == "meta" for _, p in outside)
    assert all(p.device.type == "cpu" for p in lazy.blocks[0].parameters())  # the blocks are left alone
    lazy.load_outside()
    assert lazy.model.lm_head.weight is lazy.model.model.embed_tokens.weight
    want = load_fp_model(path).state_dict()
    for n, p in lazy.model.named_parameters():
        if ".layers." not in n:
            assert torch.equal(p, want[n]), n


def test_files_not_covering_the_parameters_are_not_streamable(tmp_path):
    """A weight stored under another name: transformers would warn and initialise it; streaming declines (None)."""
    path = make_tiny_llama(tmp_path / "m")
    tensors = load_file(str(path / "model.safetensors"))
    tensors["renamed.q_proj"] = tensors.pop("model.layers.0.self_attn.q_proj.weight")
    save_file(tensors, str(path / "model.safetensors"))
    assert LazyModel.open(path) is None


_PEAK = """
import re, sys, torch
torch.set_num_threads(1)
import matgptq
model, out, stream = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
matgptq.quantize(model, out, calib={calib!r}, calib_range=(0.6, 1.0), method="gptq", bits=4, nsamples=2, seqlen=32,
                 group_size=128, progress=False, stream=stream, shard_bytes=4 << 20)
print(int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024)
"""


def _peak_rss(model, out, stream: bool) -> int:
    code = _PEAK.format(calib=str(TINYSTORIES))
    # glibc otherwise raises its mmap threshold after large frees and keeps later large buffers in a heap that
    # fragments: the peak then drifts up with the number of allocations (measured once: 567 → 615 MiB over the 10
    # blocks of the deep model; flat within 2 MiB with the fixed threshold), not
    # with what is alive. A fixed threshold returns every large buffer to the OS when freed, so ru_maxrss is the
    # largest live set, which is what the bound is about.
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(sys.path),
        "MALLOC_MMAP_THRESHOLD_": "131072",
    }
    done = subprocess.run(
        [sys.executable, "-c", code, str(model), str(out), "1" if stream else "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split()[-1])


def test_peak_memory_does_not_grow_with_depth(tmp_path):
    """Quantizing a 2- and a 10-block model (8.6 MB of float32 weights per block) in fresh processes: streamed, the
    peak resident memory (VmHWM: this process image's own high-water mark; ru_maxrss would carry the parent's peak
    over fork and exec) of the deep one exceeds the shallow one's by less than 2 blocks' worth, where
    loading the model whole adds the 8 extra blocks (69 MB); that control run checks the measurement can see it.

    Bound: streamed memory = interpreter + embeddings/head + one block + activations + one 4 MB shard being written,
    none of which depends on depth; what may grow is per-block bookkeeping (reports, a few KB) and the allocator's
    fragmentation, which we allow up to 2 blocks (17 MB). The control grows by the 8 blocks' pages (file pages the
    model's weights map, then the dequantized weights written into them), so at least 6 blocks (52 MB)."""
    block = 4 * (2 * 384 * 384 + 2 * 384 * 128 + 3 * 384 * 1536)  # float32 bytes: q,o 384², k,v 384×128, MLP
    peaks = {}
    for layers in (2, 10):
        model = make_tiny_llama(
            tmp_path / f"m{layers}", hidden=384, intermediate=1536, layers=layers, heads=6, kv_heads=2
        )
        for stream in (True, False):
            peaks[layers, stream] = _peak_rss(model, tmp_path / f"out{layers}{stream}", stream)
    streamed, whole = peaks[10, True] - peaks[2, True], peaks[10, False] - peaks[2, False]
    print({k: f"{v / 2**20:.1f} MiB" for k, v in peaks.items()}, f"block {block / 2**20:.1f} MiB")
    assert streamed < 2 * block, (
        f"streamed peak grew by {streamed / 2**20:.1f} MiB over 8 blocks of {block / 2**20:.1f}"
    )
    assert whole > 6 * block, f"the whole-model control grew by only {whole / 2**20:.1f} MiB: the measurement is blind"


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_fused_experts_stream_from_per_expert_files(model_type, tmp_path):
    """transformers saves qwen3_moe's and mixtral's experts one at a time (`experts.<e>.gate_proj`, mixtral's
    `block_sparse_moe.experts.<e>.w1`), gpt_oss' fused: the streamed blocks assemble what from_pretrained merges."""
    from tests.models.test_arch import tiny_dir
    from tests.models.test_moe import MOE

    _same_as_from_pretrained(tiny_dir(tmp_path / "m", model_type, **MOE[model_type]))
