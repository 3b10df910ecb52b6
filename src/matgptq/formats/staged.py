"""A parent checkpoint written block by block: bounded memory for models of any depth (docs/formats.md §1.1).

`quantize` hands each finished decoder block to `StagedCheckpoint.write_block`, which writes that block's checkpoint
tensors (parent.layer_tensors for its quantized Linears, and its other tensors: norms, biases, skipped layers) to
`DIR/block-<i>.safetensors` at once — under a temporary name, renamed when complete — so no finished layer stays in
memory. In a single-process run DIR is the resume directory (quantization/resume.py): the block files are what a
killed run keeps of its finished blocks.

`assemble` writes the checkpoint directory when every block is done, atomically (fsutil.atomic_output): the tensors
outside the blocks (embeddings, final norm, an untied lm_head) first, then the block files in order, grouped
greedily into shards of at most `shard_bytes` (a block file larger than that is a shard of its own). Memory: one
block's tensors at a time (streamed.py writes a shard's header first, then one block after another). One shard →
`model.safetensors`, the layout `save_checkpoint` writes, with the same tensors; more → Hugging Face's
`model-0000k-of-0000N.safetensors` and `model.safetensors.index.json`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

from ..errors import UserError
from ..fsutil import atomic_output, replace_file
from ..untrusted import read_header, read_tensors
from . import checksums
from .parent import INDEX_FILE, TENSOR_METADATA, WEIGHTS_FILE, layer_tensors, read_layer, write_dir
from .quantized import QuantizedWeight
from .streamed import Entry, Group, entries_of, write_streamed

SHARD_BYTES = 512 << 20  # default largest shard


class StagedCheckpoint:
    """Block files in `dir`; see the module docstring."""

    def __init__(self, dir: str | Path, dtype: torch.dtype | None = None) -> None:
        self.dir = Path(dir)
        self.dtype = dtype  # the floating tensors besides the quantized layers are written in it (None: as given)
        self.fix = f"delete {self.dir} and run the quantization again"

    def _stored(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        cast = lambda t: t.to(self.dtype) if self.dtype is not None and t.is_floating_point() else t  # noqa: E731
        return {k: cast(v).contiguous() for k, v in tensors.items()}

    def path(self, block: int) -> Path:
        return self.dir / f"block-{block}.safetensors"

    def write_block(self, block: int, layers: dict[str, QuantizedWeight], tensors: dict[str, torch.Tensor]) -> None:
        """Block `block`'s quantized `layers` (full names) and its other `tensors` (full names), on the CPU."""
        out = self._stored(tensors)
        for name, q in layers.items():
            out.update(layer_tensors(name, q))
        self.dir.mkdir(parents=True, exist_ok=True)
        replace_file(
            self.path(block),
            lambda tmp: save_file(out, str(tmp), metadata=TENSOR_METADATA),
            "run the same command with --resume to continue from the last finished block",
        )

    def read_layers(self, block: int, width: Callable[[str], int]) -> dict[str, QuantizedWeight]:
        """The quantized layers of a written block (`width(name)`: a layer's stored width), checked as a
        checkpoint's are."""
        where = self.path(block)
        raw = read_tensors(where, self.fix)
        names = sorted(k[: -len(".codes")] for k in raw if k.endswith(".codes"))
        return {
            n: read_layer(where, raw, n, raw[f"{n}.codes"].shape[0], raw[f"{n}.g_idx"].shape[0], width(n), 0)
            for n in names
            if f"{n}.g_idx" in raw
        }

    def assemble(
        self,
        out: str | Path,
        n_blocks: int,
        config: dict,
        tensors: dict[str, torch.Tensor],
        layers: dict[str, list[int]],
        layer_bits: dict[str, int],
        meta: dict,
        tokenizer_dir: str | Path | None,
        overwrite: bool = False,
        shard_bytes: int = SHARD_BYTES,
    ) -> Path:
        """The checkpoint directory `out` from the tensors outside the blocks and blocks 0..n_blocks−1's files.
        `layers`: each quantized layer's [out, in] shape, in pipeline order (the parent's layer order);
        `layer_bits`: its stored width."""
        missing = [i for i in range(n_blocks) if not self.path(i).is_file()]
        if missing:
            raise UserError(f"{self.path(missing[0])} is missing: block {missing[0]} was never written; {self.fix}")
        headers = [read_header(self.path(i), self.fix) for i in range(n_blocks)]
        outside = self._stored(tensors)
        sums: dict[str, str] = {}  # each tensor's checksum, taken as it is written

        def summed(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            sums.update({k: checksums.tensor_checksum(t) for k, t in tensors.items()})
            return tensors

        groups = [Group(entries_of(outside), lambda: summed(outside))] + [
            Group(
                [Entry(k, dtype, shape) for k, (dtype, shape) in h.items()],
                lambda i=i: summed(read_tensors(self.path(i), self.fix)),
            )
            for i, h in enumerate(headers)
        ]
        sizes = [sum(e.nbytes for e in g.entries) for g in groups]
        shards: list[list[int]] = []  # source 0 = `tensors`, source i + 1 = block i
        size = 0
        for source, n in enumerate(sizes):
            if not shards or size + n > shard_bytes:
                shards.append([])
                size = 0
            shards[-1].append(source)
            size += n
        names = (
            [WEIGHTS_FILE]
            if len(shards) == 1
            else [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
        )
        weight_map: dict[str, str] = {}
        total = 0
        with atomic_output(out, overwrite, size=sum(sizes)) as tmp:
            for name, sources in zip(names, shards):
                total += write_streamed(tmp / name, [groups[s] for s in sources], TENSOR_METADATA)
                weight_map.update({e.name: name for s in sources for e in groups[s].entries})
            if len(shards) > 1:
                index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
                (tmp / INDEX_FILE).write_text(json.dumps(index, indent=2))
            write_dir(tmp, config, meta, layers, layer_bits, 0, checksums.record(sums), tokenizer_dir)
        return Path(out)
