"""Data-parallel training under ``torchrun``: process group, DDP wrapping, reductions.

When ``WORLD_SIZE`` > 1 the Trainer initialises the process group (gloo on CPU,
nccl on GPU) unless the caller already did, wraps the module in
``DistributedDataParallel``, gives each rank its share of the batches, reduces
losses and metrics, and checkpoints and logs from rank 0 only.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["barrier", "device", "mean", "rank_world", "setup", "teardown", "total", "wrap"]


def setup() -> tuple[int, int, bool]:
    """(rank, world size, whether this call created the process group)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, False
    created = False
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        created = True
    return dist.get_rank(), dist.get_world_size(), created


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def device(requested: Any, world: int, default: torch.device) -> torch.device:
    """The training device: as requested; under torchrun with CUDA, this rank's GPU;
    else ``default`` (where the model already is)."""
    if requested is not None:
        return torch.device(requested)
    if world > 1 and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return default


def wrap(net: nn.Module, dev: torch.device) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    ids = [dev.index] if dev.type == "cuda" else None
    return DistributedDataParallel(net, device_ids=ids)


def total(t: torch.Tensor) -> torch.Tensor:
    """The sum of ``t`` over ranks (on the GPU when the backend is nccl)."""
    home = t.device
    t = t.to("cuda") if dist.get_backend() == "nccl" else t.clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.to(home)


def mean(t: torch.Tensor) -> torch.Tensor:
    """The mean of ``t`` over ranks."""
    return total(t) / dist.get_world_size()


def barrier() -> None:
    dist.barrier()
