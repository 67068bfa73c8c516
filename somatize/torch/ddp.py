"""Data-parallel training under ``torchrun``: process group, DDP wrapping, reductions.

When ``WORLD_SIZE`` > 1 the Trainer initialises the process group (gloo on CPU,
nccl on GPU, each rank's GPU made its current device) and keeps it for later fits; a
group the caller made is used as it is, with or without ``WORLD_SIZE`` (``mp.spawn``
and ``init_process_group(..., world_size=N)`` set none). It wraps the module in
``DistributedDataParallel``, gives each rank its share of the batches, reduces losses
and metrics, evaluates and returns rank 0's buffers, and checkpoints and logs from rank
0 only.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "barrier",
    "broadcast_buffers",
    "device",
    "explain",
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
    global _made, _at_exit
    if dist.is_available() and dist.is_initialized():  # the caller's group, or an earlier fit's
        world = dist.get_world_size()
    else:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return 0, 1, False
        _check_launch(world)
        if torch.cuda.is_available():  # "cuda" is then this rank's GPU (nccl's tensors)
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        _init_group("nccl" if torch.cuda.is_available() else "gloo", world)
        _made = True
    if not _at_exit:
        atexit.register(_exit)
        _at_exit = True
    return dist.get_rank(), world, _made


def _check_launch(world: int) -> None:
    """``WORLD_SIZE`` > 1 without the other variables ``torchrun`` sets: a shell that kept
    ``WORLD_SIZE`` from an earlier job, a script run with ``python`` instead of ``torchrun``.
    torch's own error names one variable and not the launcher."""
    from ..errors import SettingError

    missing = [v for v in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
    if missing:
        raise SettingError(
            f"WORLD_SIZE={world} is set, so fit() would train data-parallel, but "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not: this process "
            f"was not started by torchrun. Launch the script with `torchrun "
            f"--nproc_per_node={world} script.py` (it sets them all), or unset WORLD_SIZE "
            "to train in one process"
        )


_WAIT_NOTE_S = 30.0  # how long init_process_group waits for peers before saying so


def _init_group(backend: str, world: int) -> None:
    """``init_process_group``, saying on standard error when it has waited ``_WAIT_NOTE_S``
    seconds: torch waits for every rank until its timeout, silently (a rank started with
    ``python`` and torchrun's variables, the other ranks never started)."""
    note = threading.Timer(_WAIT_NOTE_S, _still_waiting, args=(world,))
    note.daemon = True
    note.start()
    try:
        dist.init_process_group(backend)
    finally:
        note.cancel()


def _still_waiting(world: int) -> None:
    env = os.environ
    by = "was" if "TORCHELASTIC_RUN_ID" in env else "was not"
    print(
        f"somatize: rank {env.get('RANK')} of {world} has waited {_WAIT_NOTE_S:g} s in "
        f"torch.distributed.init_process_group for the other ranks at "
        f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')} (this process {by} started by "
        f"torchrun); every rank must start and call fit(), not only this one: `torchrun "
        f"--nproc_per_node={world} script.py` starts them all; to train in one process, "
        "unset WORLD_SIZE",
        file=sys.stderr,
        flush=True,
    )


_made = False  # whether this process's group was made by setup() (destroyed at exit)
_at_exit = False  # whether _exit is registered


def _exit() -> None:
    """At exit, while the interpreter is whole: collect, then destroy the group ``setup``
    made. What a fit leaves in reference cycles until a collection (a fit that raised: its
    graph and parameters, with DDP's hooks on them), freed during the interpreter's
    teardown instead, after the group, aborted the process ("terminate called without an
    active exception"): on the group the Trainer made, and on one the caller made and
    destroyed alike (2 of 6 jobs of a repro with three fits that raised; 0 of 18 since)."""
    gc.collect()
    if _made and dist.is_initialized():
        dist.destroy_process_group()


def settle_gloo(limit: float = 2.0) -> None:
    """At exit, wait (at most ``limit`` seconds) until gloo's worker threads are idle.

    A gloo worker frees a collective's work after the caller's ``wait()`` has returned; a
    tensor the caller has dropped since (``all_gather_object``'s buffers) is then freed by
    the worker, taking the GIL. Preempted until the interpreter is finalizing, the worker
    is ended by Python inside a C++ destructor: "terminate called without an active
    exception", the rank aborted after all its work (4 of 94 jobs of a DDP test script on
    a loaded 2-core machine, 0 of 93 with this wait; torch 2.13, pytorch/pytorch#190489).
    ``destroy_process_group`` would join the workers, but once a ``DistributedDataParallel``
    has been made torch keeps the group, and its threads, alive until the process ends.
    So: poll the states of
    the threads gloo names ``pt_gloo_runloop`` (Linux's ``/proc``; elsewhere, and in a
    process without them, nothing is done) until none has been running or runnable for
    three polls, sleeping between polls so that a worker waiting for the GIL gets it.
    Registered at exit when this module is imported (after ``_exit``, so it runs last):
    the Trainer's runs, and Lightning's under ``LightningGraph``, alike."""
    import time

    deadline, quiet = time.monotonic() + limit, 0
    while quiet < 3 and time.monotonic() < deadline:
        busy = _gloo_busy()
        if busy is None:
            return
        quiet = 0 if busy else quiet + 1
        time.sleep(0.001)


def _gloo_busy() -> bool | None:
    """Whether a gloo worker thread of this process is running or runnable; None when it
    has none (or the OS does not say)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    found = None
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # (a thread that ended)
        if stat[stat.find("(") + 1 : stat.rfind(")")] == "pt_gloo_runloop":
            if stat[stat.rfind(")") + 2 :][:1] == "R":
                return True
            found = False
    return found


atexit.register(settle_gloo)  # (atexit runs last what it was given first: after _exit)


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


def planned() -> tuple[int, int]:
    """(rank, world size) a ``fit`` started now would train with: the process group's, else
    torchrun's environment (``RANK``, ``WORLD_SIZE``), else one process."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def device(requested: Any, world: int, default: torch.device) -> torch.device:
    """The training device: as requested; under torchrun with CUDA, this rank's GPU;
    else ``default`` (where the model already is)."""
    if requested is not None:
        return torch.device(requested)
    if world > 1 and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return default


def wrap(net: nn.Module, dev: torch.device, find_unused: bool = False) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    ids = [dev.index] if dev.type == "cuda" else None
    return DistributedDataParallel(net, device_ids=ids, find_unused_parameters=find_unused)


def explain(e: BaseException) -> None:
    """A note on DDP's error for parameters no loss reached (a node that is not run, a
    module it holds but does not call): the DDP wrapper is the Trainer's, so torch's advice
    (``find_unused_parameters=True`` to ``DistributedDataParallel``) is given as
    ``Options(find_unused_parameters=True)``."""
    from ..errors import add_note

    if isinstance(e, RuntimeError) and "find_unused_parameters" in str(e):
        add_note(
            e,
            "the Trainer wraps the model in DistributedDataParallel: pass "
            "st.Options(find_unused_parameters=True) to let some parameters get no gradient "
            "in a step (or freeze them, g.freeze(node), or drop what the forward never uses)",
        )


def broadcast_buffers(net: nn.Module) -> None:
    """Rank 0's buffers (BatchNorm's running statistics) on every rank, as DDP sends them
    before each training forward: each rank's forward then updated them with its own batch,
    so without this an evaluation would mix models the ranks alone hold, and the ranks'
    ``TrainResult.state`` would differ from each other and from rank 0's checkpoint."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for b in net.buffers():
        groups.setdefault((b.device, b.dtype), []).append(b)
    for same in groups.values():  # one broadcast per device and dtype
        flat = torch.cat([b.detach().reshape(-1) for b in same])
        if dist.get_backend() == "nccl":  # nccl's tensors are on the GPU
            flat = flat.to("cuda")
        dist.broadcast(flat, src=0)
        with torch.no_grad():
            for b, part in zip(same, flat.split([b.numel() for b in same])):
                b.copy_(part.view_as(b))


def total(t: torch.Tensor) -> torch.Tensor:
    """The sum of ``t`` over ranks (on the GPU when the backend is nccl)."""
    home = t.device
    t = t.to("cuda") if dist.get_backend() == "nccl" else t.clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.to(home)


def largest(t: torch.Tensor) -> torch.Tensor:
    """The elementwise largest of ``t`` over ranks (on the GPU when the backend is nccl)."""
    home = t.device
    t = t.to("cuda") if dist.get_backend() == "nccl" else t.clone()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
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
    """A DataLoader that reads only this rank's share (as Lightning does it):

    * its default sampler (``shuffle=True`` or not) becomes a ``DistributedSampler``,
      shuffled as the loader was, seeded by ``seed`` (the Trainer ``set_epoch``-s it);
    * a sampler that already shards by rank (``samplers.reads_share``) is kept;
    * any other sampler is wrapped in a ``samplers.RankShare``, a batch sampler of your
      own in a ``samplers.BatchShare``: each rank keeps every ``world``-th element of
      the inner sampler's draw, which must be the same on every rank.

    Anything else is returned as it is: a sequence of batches, an iterable, a loader over
    an ``IterableDataset`` or of a ``DataLoader`` subclass (``batches.epoch_batches``
    gives each rank every ``world``-th batch of those)."""
    if world <= 1:  # (one process: nothing to shard, nothing to import)
        return data
    from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler
    from torch.utils.data.distributed import DistributedSampler

    from .samplers import BatchShare, RankShare, rank_share

    if world <= 1 or type(data) is not DataLoader or isinstance(data.dataset, IterableDataset):
        return data
    if rank_share(data) is not None:
        return data
    if data.batch_size is None and data.batch_sampler is not None:  # a batch sampler of yours
        return _rebuilt(data, batch_sampler=BatchShare(data.batch_sampler, rank, world, seed))
    sampler = data.sampler
    default = type(sampler) is SequentialSampler or (
        type(sampler) is RandomSampler
        and not sampler.replacement
        and sampler._num_samples is None
        and getattr(sampler, "data_source", None) is data.dataset
    )
    if not default:
        wrapped = RankShare(sampler, rank, world, seed)
        return _rebuilt(data, batch_size=data.batch_size, sampler=wrapped, drop_last=data.drop_last)
    distributed: DistributedSampler[Any] = DistributedSampler(
        data.dataset,
        num_replicas=world,
        rank=rank,
        shuffle=isinstance(sampler, RandomSampler),
        seed=seed,
    )
    return _rebuilt(data, batch_size=data.batch_size, sampler=distributed, drop_last=data.drop_last)


def _rebuilt(data: Any, **how: Any) -> Any:
    """The same DataLoader (dataset, workers, collate function...) with another sampler."""
    from torch.utils.data import DataLoader

    if data.num_workers > 0:
        how["prefetch_factor"] = data.prefetch_factor
        how["persistent_workers"] = data.persistent_workers
    if hasattr(data, "in_order"):  # torch >= 2.6
        how["in_order"] = data.in_order
    return DataLoader(
        data.dataset,
        num_workers=data.num_workers,
        collate_fn=data.collate_fn,
        pin_memory=data.pin_memory,
        timeout=data.timeout,
        worker_init_fn=data.worker_init_fn,
        multiprocessing_context=data.multiprocessing_context,
        pin_memory_device=data.pin_memory_device,
        **how,
    )
