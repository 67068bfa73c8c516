"""Data-parallel training under ``torchrun``: process group, DDP wrapping, reductions.

When ``WORLD_SIZE`` > 1 the Trainer initialises the process group (gloo on CPU,
nccl on GPU) unless the caller already did, and keeps it for later fits, wraps the module in
``DistributedDataParallel``, gives each rank its share of the batches, reduces
losses and metrics, and checkpoints and logs from rank 0 only.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "barrier",
    "device",
    "finish",
    "gather",
    "mean",
    "rank_world",
    "setup",
    "shard",
    "total",
    "wrap",
]


def setup() -> tuple[int, int, bool]:
    """(rank, world size, whether the Trainer made the process group — in this call or an
    earlier ``fit``'s).

    A group the Trainer makes lives until the process exits, for every later ``fit`` to
    use: destroying it and making another in the same job (a sweep of fits under one
    ``torchrun``) hung gloo's rendezvous about one time in two.
    """
    global _made
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, False
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        if not _made:
            atexit.register(_destroy)
        _made = True
    return dist.get_rank(), dist.get_world_size(), _made


_made = False  # whether this process's group was made by setup() (destroyed at exit)


def _destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def finish(failed: bool) -> None:
    """After a ``fit`` on a group ``setup`` made. Done: wait until every rank has got here,
    keeping the group for the next ``fit``. Failed: destroy it, so that peers waiting on
    this rank fail at once instead of waiting out the timeout (a later ``fit`` makes a new
    one)."""
    global _made
    if not dist.is_initialized():
        return
    if not failed:
        dist.barrier()
        return
    dist.destroy_process_group()
    _made = False


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


def gather(value: Any) -> list[Any]:
    """Every rank's ``value`` (picklable: RNG states), in rank order, on every rank."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def shard(data: Any, rank: int, world: int, seed: int) -> Any:
    """A DataLoader that reads only this rank's share: the same loader over a
    ``DistributedSampler`` (shuffled as the original was, seeded by ``seed``; the Trainer
    calls ``set_epoch`` each epoch). Anything else is returned as it is: a sequence of
    batches, an iterable dataset, a custom batch sampler, or a loader already sharded."""
    from torch.utils.data import DataLoader, RandomSampler
    from torch.utils.data.distributed import DistributedSampler

    if world <= 1 or type(data) is not DataLoader:
        return data
    if isinstance(data.sampler, DistributedSampler) or data.batch_size is None:
        return data
    dataset = data.dataset
    if not hasattr(dataset, "__len__") or isinstance(dataset, torch.utils.data.IterableDataset):
        return data
    sampler: DistributedSampler[Any] = DistributedSampler(
        dataset,
        num_replicas=world,
        rank=rank,
        shuffle=isinstance(data.sampler, RandomSampler),
        seed=seed,
    )
    extra: dict[str, Any] = {}
    if data.num_workers > 0:
        extra = {
            "prefetch_factor": data.prefetch_factor,
            "persistent_workers": data.persistent_workers,
        }
    return DataLoader(
        dataset,
        batch_size=data.batch_size,
        sampler=sampler,
        num_workers=data.num_workers,
        collate_fn=data.collate_fn,
        pin_memory=data.pin_memory,
        drop_last=data.drop_last,
        timeout=data.timeout,
        worker_init_fn=data.worker_init_fn,
        multiprocessing_context=data.multiprocessing_context,
        **extra,
    )
