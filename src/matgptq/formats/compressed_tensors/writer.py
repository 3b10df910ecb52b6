"""compressed-tensors checkpoints written from matgptq weights: a weight-only `pack-quantized` checkpoint
(llm-compressor's layout, read by transformers + compressed-tensors and vLLM's WNA16 path) of one width or a per-layer
mix, 2 to 8 bits; each layer's tensors, the `quantization_config` and the directory. exporters/compressed_tensors.py
chooses what to write; reader.py reads it back.

An r-bit slice of a c-bit parent is W = s_r·(S·2^d − z), d = c − r (docs/formats.md §1.7). compressed-tensors
stores signed codes q_ct in [−2^(r−1), 2^(r−1) − 1] and dequantizes W = scale·(q_ct − zp). Per layer:

    q_ct  = S − 2^(r−1)         stored unsigned, u = q_ct + 2^(r−1) = S: our slice codes as they are
    scale = s_r · 2^d           float32: an fp16 value times a power of two, exact (no fp16 overflow either)
    zp    = z / 2^d − 2^(r−1)   symmetric layers (z = 2^(c−1)) have zp = 0 and store none; an asymmetric zero
                                that 2^d does not divide has no integer zp: refused, never rounded

Both readers compute (q_ct − zp)·scale in the scale's dtype: an integer of at most 8 bits times an 11-bit
significand, exact in float32. So float32 scales give exactly our float32 weight, and one cast to the model dtype
gives exactly `matgptq.load(..., dtype)`'s weight. (transformers' default load casts the scale to the model dtype
first: still exact for float32 and float16 models, one more rounding for bfloat16 ones.)

Tensors per quantized Linear `<name>`; every other tensor as the source holds it:
  <name>.weight_packed      int32 [N, ceil(K·r/32)]  per row a little-endian bit stream: u[n, k] at stream bits
                                                    [k·r, (k+1)·r), stream bit j = bit j mod 32 of word j // 32
                                                    (codes straddle words at 3/5/6/7 bits: packing.py)
  <name>.weight_scale       float32 [N, G]           G = K / group size (1 per channel)
  <name>.weight_zero_point  int32 [ceil(N·r/32), G]  asymmetric only: zp + 2^(r−1), packed the same way along dim 0
  <name>.weight_shape       int64 [2]                [N, K]

Groups: compressed-tensors at CT_VERSION has no g_idx (actorder "group" was removed) and no ragged groups (its
decompressor needs K % group_size == 0). A layer whose groups are contiguous runs is written with the largest g'
dividing K that keeps every block of g' columns inside one of our groups: our group size g when it divides K, else
gcd(g, K) with each scale repeated g/g' times; a layer of one group is per channel (unless K = g: then group g, to share
the config group of the other layers). Exact in every case. Act-order groups (g_idx decreasing somewhere) are refused.
Config: `quantization_config` as compressed-tensors' ModelCompressor writes it (CT_VERSION); one config group per
(width, symmetric, group size) with exact module names as targets (disjoint; exact names beat any other target);
every other Linear (lm_head, `--skip` layers) in `ignore`.
Mixture-of-experts parents (qwen3_moe, mixtral, gpt_oss): each expert's fused projections are written as the
per-expert Linears llm-compressor writes, `<p>.experts.<e>.gate_proj / up_proj / down_proj`, the routers float and
in `ignore` (experts.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from ...errors import UserError
from ...fsutil import atomic_output, copy_tokenizer_files
from ..quantized import QuantizedWeight
from .constants import CT_VERSION, FORMAT, QUANT_METHOD, WEIGHTS_FILE
from .packing import pack_int32


@dataclass(frozen=True)
class CtLayer:
    """One layer in compressed-tensors terms: unsigned codes u, float32 scales, unsigned zero points (None = sym)."""

    bits: int
    codes: torch.Tensor  # uint8 [N, K], u = q_ct + 2^(r−1)
    scales: torch.Tensor  # float32 [N, G']
    zeros: torch.Tensor | None  # uint8 [N, G'], zp + 2^(r−1); None for symmetric
    group_size: int  # g' (−1: per channel)
    ragged_from: int | None = None  # our group size where it does not divide K

    @property
    def scheme(self) -> tuple[int, bool, int]:
        return self.bits, self.zeros is None, self.group_size

    def tensors(self, name: str) -> dict[str, torch.Tensor]:
        n, k = self.codes.shape
        out = {
            f"{name}.weight_packed": torch.from_numpy(pack_int32(self.codes.numpy(), self.bits)),
            f"{name}.weight_scale": self.scales.contiguous(),
            f"{name}.weight_shape": torch.tensor([n, k], dtype=torch.int64),
        }
        if self.zeros is not None:
            zp = pack_int32(self.zeros.numpy().T, self.bits).T
            out[f"{name}.weight_zero_point"] = torch.from_numpy(np.ascontiguousarray(zp))
        return out


def column_block(g_idx: torch.Tensor) -> int | None:
    """The largest g' dividing K with g_idx constant on every block of g' columns, for contiguous groups in order
    (g_idx non-decreasing); None for act-order groups."""
    if bool((g_idx[1:] < g_idx[:-1]).any()):
        return None
    starts = (torch.nonzero(g_idx[1:] != g_idx[:-1]).flatten() + 1).tolist()
    return math.gcd(len(g_idx), *starts)


def _zero_points(name: str, q: QuantizedWeight) -> torch.Tensor | None:
    """zp + 2^(r−1) = z / 2^d per row and group (uint8), None for a symmetric layer; a fractional one is refused."""
    zeros, d = q.zeros.to(torch.int32), q.shift
    if bool((zeros == 1 << (q.master_bits - 1)).all()):
        return None
    if bool((zeros % (1 << d)).any()):
        bad = int((zeros % (1 << d) != 0).sum())
        raise UserError(
            f"{name}: {bad} asymmetric zero point(s) of the {q.master_bits}-bit parent are not multiples of 2^{d}, so "
            f"the {q.bits}-bit slice has no integer compressed-tensors zero point; export {q.master_bits} bits, use a "
            "symmetric parent (--sym), or export GGUF (Q4_1/Q5_1 hold an offset)"
        )
    return (zeros >> d).to(torch.uint8)


def ct_layer(name: str, q: QuantizedWeight, group_size: int | None = None) -> CtLayer:
    """The compressed-tensors form of the (sliced) weight `q`, equal to it exactly (module docstring), or a refusal.
    `group_size`: the checkpoint's; a layer that is one group of exactly that size stays a group (so it shares the
    config group of the other layers), any other single-group layer is per channel."""
    k = q.shape[1]
    block = column_block(q.g_idx)
    if block is None:
        raise UserError(
            f"{name} has act-order groups (g_idx is not k // group size), which compressed-tensors {CT_VERSION} cannot "
            "store (no g_idx: actorder 'group' was removed); re-quantize without --no-static-groups, or export "
            "--format gptq_v2 or gguf"
        )
    zp = _zero_points(name, q)
    cols = q.g_idx[::block].long()  # our group of each g'-block
    scales = q.scales.float()[:, cols] * float(1 << q.shift)
    ours = int(torch.unique_consecutive(q.g_idx, return_counts=True)[1][0])  # columns in our first group
    ragged = ours if block not in (k, ours) else None
    size = -1 if block == k and group_size != k else block
    return CtLayer(q.bits, q.codes, scales, None if zp is None else zp[:, cols], size, ragged)


def weights_args(bits: int, sym: bool, group_size: int, actorder: str | None) -> dict:
    """A `weights` QuantizationArgs dict, every field as compressed-tensors (CT_VERSION) serializes it."""
    return {
        "num_bits": bits,
        "type": "int",
        "symmetric": sym,
        "group_size": None if group_size == -1 else group_size,
        "strategy": "channel" if group_size == -1 else "group",
        "block_structure": None,
        "dynamic": False,
        "actorder": actorder,
        "scale_dtype": None,
        "zp_dtype": None if sym else "torch.int8",
        "observer": None,
        "observer_kwargs": {},
    }


Groups = dict[tuple[int, bool, int], list[str]]  # (bits, symmetric, group size or −1) -> layer names


def quantization_config(groups: Groups, ignore: list[str], actorder: str | None) -> dict:
    """config.json's `quantization_config`: what compressed-tensors' ModelCompressor.update_config writes."""
    config_groups = {
        f"group_{i}": {
            "targets": names,
            "weights": weights_args(*scheme, actorder),
            "input_activations": None,
            "output_activations": None,
            "format": FORMAT,
        }
        for i, (scheme, names) in enumerate(sorted(groups.items(), key=lambda kv: (kv[0][0], not kv[0][1], kv[0][2])))
    }
    return {
        "config_groups": config_groups,
        "format": FORMAT,
        "global_compression_ratio": None,
        "ignore": ignore,
        "kv_cache_scheme": None,
        "quant_method": QUANT_METHOD,
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
        "version": CT_VERSION,
    }


def save_compressed_tensors(
    out: str | Path, tensors: dict[str, torch.Tensor], config: dict, qc: dict, tokenizer_dir: Path, overwrite: bool
) -> Path:
    """The compressed-tensors directory `out`, written atomically: the tensors, config.json with `qc` as its
    quantization_config and the tokenizer files of `tokenizer_dir`."""
    with atomic_output(out, overwrite, size=sum(t.nbytes for t in tensors.values())) as tmp:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", "producer": "matgptq"})
        (tmp / "config.json").write_text(json.dumps(dict(config, quantization_config=qc), indent=2, default=str))
        copy_tokenizer_files(tokenizer_dir, tmp)
    return Path(out)
