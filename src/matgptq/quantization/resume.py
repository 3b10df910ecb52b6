"""Resumable quantization: after every block, what the run needs to go on from the next one.

A run writing OUT keeps its progress in the sibling directory `.OUT.resume/` (OUT itself appears only when the
whole checkpoint is written, fsutil.atomic_output):

    state.json              {"format", "version", "settings", "done": d, "reports": [...]}: blocks 0..d−1 are finished
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
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..errors import UserError
from ..untrusted import read_json

STATE_FORMAT = "matgptq-quantize-state"
STATE_VERSION = 2  # v2: the finished blocks' files are the checkpoint's own tensors (v1 states are refused)


@dataclass
class Restored:
    done: int  # finished blocks
    reports: list[dict]
    hidden: list[torch.Tensor]


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


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

    def load(self, n_blocks: int, n_batches: int) -> Restored | None:
        """What a killed run finished, checked against this run's settings; None when there is nothing."""
        path = self.dir / "state.json"
        if not path.exists():
            return None
        fix = f"delete {self.dir} to start afresh"
        body = read_json(path, fix)
        if body.get("format") != STATE_FORMAT or body.get("version") != STATE_VERSION:
            raise UserError(f"{path} is not a matgptq quantization state (v{STATE_VERSION}); {fix}")
        if body.get("settings") != self.settings:
            theirs = body.get("settings") if isinstance(body.get("settings"), dict) else {}
            diff = sorted(k for k in set(theirs) | set(self.settings) if theirs.get(k) != self.settings.get(k))
            raise UserError(f"{self.dir} was made with other settings ({', '.join(diff[:4]) or 'unreadable'}); resume "
                            f"with the same model, calibration and options, or {fix}")  # fmt: skip
        try:
            done, reports = int(body["done"]), list(body["reports"])
            missing = [i for i in range(done) if not (self.dir / f"block-{i}.safetensors").is_file()]
            if missing:
                raise FileNotFoundError(f"block-{missing[0]}.safetensors")
            hidden = load_file(str(self.dir / f"hidden-{done}.safetensors")) if n_batches else {}
            hidden_list = [hidden[f"batch_{b}"] for b in range(n_batches)]
        except (KeyError, TypeError, ValueError, OSError) as e:
            raise UserError(f"{self.dir} is damaged ({type(e).__name__}: {str(e)[:80]}); {fix}") from None
        if not 0 <= done <= n_blocks:
            raise UserError(f"{self.dir} records {done} finished blocks of {n_blocks}; {fix}")
        return Restored(done, reports, hidden_list)

    def save(self, done: int, reports: list, hidden: list[torch.Tensor]) -> None:
        """Block done−1 is finished (its file is written): `hidden` are the inputs of block `done`."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if hidden:
            batches = {f"batch_{b}": h.contiguous().cpu() for b, h in enumerate(hidden)}
            _atomic_write(self.dir / f"hidden-{done}.safetensors", lambda p: save_file(batches, str(p)))
        body = {"format": STATE_FORMAT, "version": STATE_VERSION, "settings": self.settings, "done": done,
                "reports": [asdict(r) if not isinstance(r, dict) else r for r in reports]}  # fmt: skip
        _atomic_write(self.dir / "state.json", lambda p: p.write_text(json.dumps(body)))
        (self.dir / f"hidden-{done - 1}.safetensors").unlink(missing_ok=True)

    def finish(self) -> None:
        """The checkpoint is written: the state is no longer needed."""
        shutil.rmtree(self.dir, ignore_errors=True)
