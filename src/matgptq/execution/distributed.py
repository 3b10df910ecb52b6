"""Scale-out on torch.distributed: `torchrun --nproc-per-node N -m matgptq quantize ...`, over one
node or several, NCCL with CUDA and gloo without.

Work split, every rank ending with the full result:
- calibration: the windows are cut into N contiguous parts; each rank runs the blocks on its own part only;
- Hessians: each rank's running mean H_r over its n_r rows (quantization/passes.py) is combined as
  H = Σ_r n_r·H_r / Σ_r n_r with one all-reduce per distinct input, so every rank holds the same H;
- solver: the Linears of a group are dealt out (layer j to rank j mod N), solved, and broadcast from their owner.
The combined Hessian is the single-process one up to float summation order (a sum of per-rank sums instead of one
running sum: relative differences of ~1e-7), so a code can differ where a weight lies that close to a rounding
boundary — and GPTQ's error feedback carries such a flip along its row (tests/quantization/test_distributed.py
measures how many).
"""

from __future__ import annotations

import atexit
import os

import torch
import torch.distributed as dist


def init_from_env(device: torch.device | None = None) -> None:
    """Under torchrun (WORLD_SIZE > 1) join the process group once: NCCL when computing on a GPU (each process on
    its own, devices.resolve_device), gloo on CPUs."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        cuda = device.type == "cuda" if device is not None else torch.cuda.is_available()
        if cuda and device is not None:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if cuda else "gloo")
        atexit.register(_leave)


def _leave() -> None:
    """Leave the process group before the interpreter ends: left to teardown, a rank's communication threads can
    be destroyed while still running (std::terminate, SIGABRT); every collective has completed by then."""
    if dist.is_initialized():
        dist.destroy_process_group()


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside torch.distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def dist_backend() -> str:
    return str(dist.get_backend())


def shard(windows: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """This rank's calibration windows: the rank-th of `size` contiguous, near-equal parts."""
    n = windows.shape[0]
    return windows[rank * n // size : (rank + 1) * n // size]


def combine_hessians(hessians: dict[str, torch.Tensor], rows: int) -> None:
    """In place: every rank's running-mean Hessians → Σ_r n_r·H_r / Σ_r n_r (layers sharing an input share one)."""
    total = torch.tensor([float(rows)], dtype=torch.float64, device=next(iter(hessians.values())).device)
    dist.all_reduce(total)
    seen = set()
    for h in hessians.values():
        if id(h) in seen:
            continue
        seen.add(id(h))
        h.mul_(rows)
        dist.all_reduce(h)
        h.div_(float(total))


def share(results: list, owners: list[int]) -> list:
    """Entry j of `results` (computed on rank owners[j], None elsewhere) on every rank."""
    out = []
    for item, src in zip(results, owners):
        box = [item]
        dist.broadcast_object_list(box, src=src)
        out.append(box[0])
    return out
