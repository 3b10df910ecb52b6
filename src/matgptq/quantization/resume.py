"""Resumable quantization: after every block, what the run needs to go on from the next one.

A run writing OUT keeps its progress in the sibling directory `.OUT.resume/` (OUT itself appears only when the
whole checkpoint is written, fsutil.atomic_output):

    state.json              {"format", "version", "settings", "done": d, "reports": [...], "checksum"}: blocks
                            0..d−1 are finished; the checksum (CRC-32 of the rest) refuses a damaged state
    block-<i>.safetensors   block i's checkpoint tensors, as the output stores them (formats/staged.py: the pipeline
                            writes them there before the state names the block finished; the checkpoint is
                            assembled from them at the end)
    hidden-<d>.safetensors  block d's input hidden states, one tensor per calibration batch

Each file is written under a temporary name and renamed; state.json is renamed last, after the block's file and the
hidden file it goes with, so a kill at any point leaves either the previous state or the new one, complete (a block
file newer than the state is written again). The pipeline is a
function of the block inputs, so a run resumed from block d computes what the uninterrupted run computed (tested
bit for bit, same threads and CPU: float summation order is part of that). The other arguments of the blocks
(masks, position embeddings) are the same for every block and are recomputed from the windows. A state made with
other settings (model, calibration, quantization options) is refused; without --resume an existing state is
refused too, so nothing is silently thrown away or mixed.
"""

from __future__ import annotations

import json
import shutil
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..errors import UserError
from ..fsutil import replace_file
from ..untrusted import read_json, read_tensors

STATE_FORMAT = "matgptq-quantize-state"
STATE_VERSION = 2  # v2: the finished blocks' files are the checkpoint's own tensors (v1 states are refused)


@dataclass
class Restored:
    done: int  # finished blocks
    reports: list[dict]
    hidden: list[torch.Tensor]


def _atomic_write(path: Path, write) -> None:
    replace_file(path, write, "run the same command with --resume to continue from the last finished block")


def _checksum(body: dict) -> str:
    """CRC-32 of the state's JSON (its keys sorted, without the checksum itself), as 8 hex digits."""
    text = json.dumps({k: v for k, v in body.items() if k != "checksum"}, sort_keys=True)
    return f"{zlib.crc32(text.encode()):08x}"


def _is_report(r) -> bool:
    """A LayerReport as `save` wrote it (asdict), with the types the pipeline rebuilds one from."""
    num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    return (
        isinstance(r, dict)
        and isinstance(r.get("name"), str)
        and isinstance(r.get("shape"), list)
        and len(r["shape"]) == 2
        and all(isinstance(d, int) and not isinstance(d, bool) for d in r["shape"])
        and isinstance(r.get("rel_error"), dict)
        and all(k.isdigit() and num(v) for k, v in r["rel_error"].items())
        and num(r.get("damp"))
        and num(r.get("seconds"))
        and (r.get("tokens") is None or isinstance(r["tokens"], int) and not isinstance(r["tokens"], bool))
        and r.get("starved") in (None, True, False)
    )


def resume_dir(out: str | Path) -> Path:
    """Where a run writing `out` keeps its progress: the sibling `.OUT.resume/`."""
    out = Path(out)
    return out.parent / f".{out.name}.resume"


class BlockState:
    """The resume directory of one output; `load` what a killed run left, `save` after each block, `finish`."""

    def __init__(self, out: str | Path, settings: dict, resume: bool) -> None:
        self.dir = resume_dir(out)
        self.settings = json.loads(json.dumps(settings, default=str))
        self.fix = f"run with --resume to continue it, or delete {self.dir} to start afresh"
        if self.dir.exists() and not resume:
            raise UserError(f"{self.dir} holds the state of an unfinished run for {out}; {self.fix}")

    def load(self, n_blocks: int, n_batches: int, like: list[torch.Tensor] | None = None) -> Restored | None:
        """What a killed run finished, checked against this run's settings; None when there is nothing. `like`: this
        run's block inputs, whose shapes and dtypes the restored hidden states must have."""
        path = self.dir / "state.json"
        if not path.exists():
            return None
        fix = f"delete {self.dir} to start afresh"
        body = read_json(path, fix)
        if body.get("format") != STATE_FORMAT or body.get("version") != STATE_VERSION:
            raise UserError(f"{path} is not a matgptq quantization state (v{STATE_VERSION}); {fix}")
        if "checksum" in body and body["checksum"] != _checksum(body):  # a state written before it had none
            raise UserError(f"{path} does not match its checksum (the state is damaged); {fix}")
        if body.get("settings") != self.settings:
            theirs = body.get("settings") if isinstance(body.get("settings"), dict) else {}
            diff = sorted(k for k in set(theirs) | set(self.settings) if theirs.get(k) != self.settings.get(k))
            raise UserError(
                f"{self.dir} was made with other settings ({', '.join(diff[:4]) or 'unreadable'}); resume "
                f"with the same model, calibration and options, or {fix}"
            )
        done, reports = body.get("done"), body.get("reports")
        if not isinstance(done, int) or isinstance(done, bool) or not 0 <= done <= n_blocks:
            raise UserError(f"{path} records {done!r:.40} finished blocks, not a count of 0..{n_blocks}; {fix}")
        if not isinstance(reports, list) or not all(_is_report(r) for r in reports):
            raise UserError(f"{path}: `reports` must be a list of layer reports; the state is damaged, {fix}")
        missing = [i for i in range(done) if not (self.dir / f"block-{i}.safetensors").is_file()]
        if missing:
            raise UserError(f"{self.dir} is damaged (block-{missing[0]}.safetensors is missing); {fix}")
        return Restored(done, reports, self._hidden(done, n_batches, like, fix))

    def _hidden(self, done: int, n_batches: int, like: list[torch.Tensor] | None, fix: str) -> list[torch.Tensor]:
        """Block `done`'s inputs: exactly batch_0..batch_{n−1}, floating-point, shaped as `like` where given."""
        if not n_batches:
            return []
        path = self.dir / f"hidden-{done}.safetensors"
        hidden = read_tensors(path, fix)
        names = [f"batch_{b}" for b in range(n_batches)]
        if sorted(hidden) != sorted(names):
            raise UserError(f"{path} does not hold exactly the batches batch_0..batch_{n_batches - 1}; {fix}")
        out = [hidden[n] for n in names]
        for b, h in enumerate(out):
            want = like[b] if like is not None else None
            if not h.is_floating_point() or want is not None and (h.shape != want.shape or h.dtype != want.dtype):
                shape = f"{want.dtype} {list(want.shape)}" if want is not None else "floating point"
                raise UserError(f"{path}: batch_{b} is {h.dtype} {list(h.shape)}, expected {shape}; {fix}")
        return out

    def save(self, done: int, reports: list, hidden: list[torch.Tensor]) -> None:
        """Block done−1 is finished (its file is written): `hidden` are the inputs of block `done`."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if hidden:
            batches = {f"batch_{b}": h.contiguous().cpu() for b, h in enumerate(hidden)}
            _atomic_write(self.dir / f"hidden-{done}.safetensors", lambda p: save_file(batches, str(p)))
        body = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "settings": self.settings,
            "done": done,
            "reports": [asdict(r) if not isinstance(r, dict) else r for r in reports],
        }
        body["checksum"] = _checksum(json.loads(json.dumps(body)))  # of the JSON as it will be read back
        _atomic_write(self.dir / "state.json", lambda p: p.write_text(json.dumps(body)))
        (self.dir / f"hidden-{done - 1}.safetensors").unlink(missing_ok=True)

    def finish(self) -> None:
        """The checkpoint is written: the state is no longer needed."""
        shutil.rmtree(self.dir, ignore_errors=True)
