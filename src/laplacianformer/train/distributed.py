"""torch.distributed set-up for ``torchrun --nproc-per-node N laplacianformer train ...``.

torchrun (or any launcher) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; with WORLD_SIZE > 1
the process group is created with gloo on CPU and nccl on CUDA. Rank 0 alone writes files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    initialized_here: bool = False

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(name: str) -> torch.device:
    """``"auto"`` (CUDA when available, else the CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; ValueError naming
    the setting for anything else or for CUDA on a machine without it. Classification and detection runs."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got {name!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {name!r} requested but CUDA is not available")
    return dev


def init_distributed(device: torch.device) -> DistInfo:
    """Joins the process group described by the environment; a no-op for a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), local, False)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, rank=rank, world_size=world)
    return DistInfo(rank, world, local, True)


def init_device(device: torch.device) -> tuple[torch.device, DistInfo]:
    """``init_distributed(device)``; with several ranks on CUDA, the device becomes this rank's GPU
    (``cuda:LOCAL_RANK``, made current)."""
    info = init_distributed(device)
    if device.type == "cuda" and info.enabled:
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
    return device, info


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum of ``t`` over ranks (in place; identity without a process group)."""
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def broadcast_object(obj, info: DistInfo):
    """Rank 0's ``obj`` on every rank."""
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def cleanup(info: DistInfo, threads: int | None = None) -> None:
    """Leaves the process group if this run created it; with ``threads``, restores torch's thread count
    (the end of a classification or detection trainer)."""
    if info.initialized_here and dist.is_initialized():
        dist.destroy_process_group()
    if threads is not None:
        torch.set_num_threads(threads)
