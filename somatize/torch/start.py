"""What a run starts from: the module to train (unwrapping a compiled one), what training
calls (DDP, torch.compile), the trainable parameters, the seeds, the autocast context.
Used by ``Trainer`` (``trainer.py``); plain functions."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from typing import Any

import torch
from torch import nn

from ..errors import add_note
from ..graph import Graph
from ..node import Node
from ..watchers import Watcher
from . import ddp
from .batches import num_examples
from .freezers import _settle_frozen, frozen_any
from .module import GraphModule, module
from .options import check_device

__all__ = [
    "as_module",
    "as_placed",
    "autocast_for",
    "close",
    "compiled",
    "count_examples",
    "dynamic_step",
    "place",
    "seed_everything",
    "trainable",
    "wrap",
]


def as_module(model: Graph | nn.Module, caller: str = "Trainer.fit") -> nn.Module:
    """The ``nn.Module`` to train or run (``caller`` names the method, for its error)."""
    if isinstance(model, Graph):
        return module(model)
    if isinstance(model, nn.Module):
        inner = getattr(model, "_orig_mod", None)  # torch.compile's wrapper: train what it wraps
        model = inner if isinstance(inner, nn.Module) else model
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(model, DistributedDataParallel):  # the caller's: the Trainer wraps
            return as_module(model.module, caller)  # (its state named as in one process)
        return model
    from ..dsl import Expr

    fix = (
        ", a Node; make it a graph first: Graph.somatize(node)"
        if isinstance(model, Node)
        else ", a >> / | expression; make it a graph first: Graph.somatize(a >> b)"
        if isinstance(model, Expr)
        else "; pass a Graph, st.module(g) or any nn.Module"
    )
    raise TypeError(f"{caller} takes a Graph or an nn.Module, got {type(model).__qualname__}{fix}")


def compiled(model: Any) -> nn.Module | None:
    """The ``torch.compile`` wrapper the caller passed (an ``OptimizedModule``), else None;
    a module compiled in place (``m.compile()``) is itself."""
    if isinstance(model, nn.Module):
        if isinstance(getattr(model, "_orig_mod", None), nn.Module):
            return model
        if getattr(model, "_compiled_call_impl", None) is not None:
            return model
    return None


def wrap(
    net: nn.Module,
    compiled: nn.Module | None,
    device: torch.device,
    world: int,
    how: Any,
    find_unused: bool = False,
) -> nn.Module:
    """What training calls: DDP under torchrun (``find_unused``: its
    ``find_unused_parameters``), the caller's compiled module, compiled here."""
    if world > 1:
        wrapped = ddp.wrap(net, device, find_unused)
    else:
        wrapped = compiled if compiled is not None else net
    if how:
        wrapped = torch.compile(wrapped, **(dict(how) if how is not True else {}))  # type: ignore[assignment]
    return wrapped


# What dynamo names ``GraphModule.step`` as forward reads it: through the weak reference its
# own code is bound to (torch.compile(module(g)), Options(compile=...), .compile()), or as
# DDP's ``module``. Exact names, so no other int attribute called ``step`` is touched.
_STEP_SOURCES = ("L['ref']().step", "L['self']._modules['module'].step")


@contextlib.contextmanager
def dynamic_step() -> Iterator[None]:
    """Let torch.compile treat ``GraphModule.step`` (an int attribute that changes every step)
    as dynamic from the first trace: no recompile for the step, even under
    ``compile={"dynamic": False}`` — instead of one per step until dynamo's recompile limit,
    after which the rest of the run went eager, said only in a log line. (A torch without
    ``dynamic_sources``: dynamic from the second step on, and not under ``dynamic=False``.)"""
    import torch._dynamo

    compiler = getattr(torch.compiler, "config", None)
    named = getattr(compiler, "dynamic_sources", None)
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch._dynamo.config.patch(allow_unspec_int_on_nn_module=True))
        if isinstance(named, str):
            extra = [s for s in _STEP_SOURCES if s not in named.split(",")]
            joined = ",".join(([named] if named else []) + extra)
            stack.enter_context(compiler.patch(dynamic_sources=joined))  # type: ignore[union-attr]
        yield


def place(net: nn.Module, requested: Any, world: int) -> torch.device:
    """Where ``fit``, ``evaluate`` and ``predict`` run ``net``: ``Options(device=...)``, else
    (under torchrun with CUDA) this rank's GPU, else where its parameters are. The module
    is moved there (and stays), as ``fit`` has always moved it.

    Raises:
        SettingError: the device asks for CUDA on a machine without it.
    """
    # what .to() would move, each module's parameters and buffers, in one walk (a walk of
    # parameters() and another of buffers() cost several µs each)
    modules = list(net.modules())
    params = [p for m in modules for p in m._parameters.values() if p is not None]
    default = params[0].device if params else torch.device("cpu")
    device = as_placed(ddp.device(requested, world, default))
    buffers = (b for m in modules for b in m._buffers.values() if b is not None)
    if any(t.device != device for t in itertools.chain(params, buffers)):  # (.to() walks all)
        net.to(device)
    return device


def as_placed(device: torch.device) -> torch.device:
    """``device`` as the tensors put there report theirs, so that a module or batch already
    there compares equal and is not moved: ``cpu:0`` is ``cpu`` (CPU tensors have no index),
    ``cuda`` the current CUDA device (``cuda:0``). CUDA is asked only for a CUDA device.

    Raises:
        SettingError: the device asks for CUDA on a machine without it.
    """
    check_device(device)
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def trainable(net: nn.Module, fresh: bool = False) -> list[nn.Parameter]:
    """``net``'s parameters that train. ``fresh``: ``module(g)`` has just made or refreshed
    it (``as_module`` of a graph), so it is not refreshed again."""
    if isinstance(net, GraphModule):
        if not fresh:
            net._refresh()  # the graph may have changed since the module was made
        if frozen_any():  # (only a parameter freezing marked can need settling)
            _settle_frozen(net)
    params = [p for p in net.parameters() if p.requires_grad]
    if not params:
        raise ValueError(
            "nothing to train: every node is frozen or holds no parameters "
            "(unfreeze a node with g.freeze(id, False), or give a node an nn.Module)"
        )
    return params


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    if accelerator is not None and not accelerator.is_available():
        # torch.manual_seed also queues a lazy seed for each absent accelerator backend,
        # formatting a stack trace for each: 0.3 ms, half the Trainer's setup
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)
    with contextlib.suppress(ImportError):
        import numpy as np

        np.random.seed(seed % 2**32)


def autocast_for(precision: str, device: torch.device) -> Callable[[], Any]:
    if precision in ("bf16", "fp16"):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        return lambda: torch.autocast(device_type=device.type, dtype=dtype)
    return contextlib.nullcontext


def count_examples(
    train: Iterable[Any], world: int, count: Callable[[Any], int] = num_examples
) -> int | None:
    """Examples one epoch trains on, over all ranks (None when the data cannot say).

    A DataLoader's are what its sampler draws an epoch (a ``SubsetRandomSampler`` its
    indices, a ``WeightedRandomSampler`` its ``num_samples``), less the last incomplete
    batch under ``drop_last``; a sampler reading one rank's share counts once per rank.
    Without a sampler that says (a batch sampler of its own), the dataset's length. A
    loader that does not batch (``batch_size=None``: each item a batch) cannot say."""
    if isinstance(train, Sequence):
        return sum(count(train[i]) for i in range(len(train) - len(train) % world))
    from .samplers import reads_share

    dataset = getattr(train, "dataset", None)
    if dataset is None or not hasattr(dataset, "__len__"):
        return None
    if getattr(train, "batch_size", 0) is None and getattr(train, "batch_sampler", 0) is None:
        return None  # its dataset's items are batches: counted as the first epoch reads them
    sampler, size = getattr(train, "sampler", None), getattr(train, "batch_size", None)
    if not isinstance(size, int) or not isinstance(sampler, Sized):
        return len(dataset)
    drawn = len(sampler)
    if getattr(train, "drop_last", False):
        drawn -= drawn % size
    if world > 1 and reads_share(sampler):
        return drawn * world - _padded(
            sampler, len(dataset), size, getattr(train, "drop_last", False)
        )
    return drawn


def _padded(sampler: Any, rows: int, size: int, drop_last: bool) -> int:
    """The rows a ``DistributedSampler`` repeats to give every rank as many (it pads the
    end of its draw, one to a rank, each rank's last row): counted as examples once only.
    Under the loader's ``drop_last`` a rank's last partial batch, pad included, is dropped."""
    from torch.utils.data.distributed import DistributedSampler

    if not isinstance(sampler, DistributedSampler) or sampler.drop_last:
        return 0
    if drop_last and sampler.num_samples % size:
        return 0
    return max(0, sampler.total_size - rows)


def close(watchers: list[Watcher], failing: BaseException | None = None) -> None:
    """Close every watcher that has ``close``, each even when one before it raised. While
    ``failing`` (the fit's own error) propagates, a watcher's error is a note on it, never
    in its place; else the first is raised once all are closed."""
    errors: list[tuple[Watcher, Exception]] = []
    for w in watchers:
        close = getattr(w, "close", None)
        if close is not None:
            try:
                close()
            except Exception as e:
                errors.append((w, e))
    if not errors:
        return
    said = [f"closing watcher {w!r} failed too: {type(e).__name__}: {e}" for w, e in errors]
    if failing is not None:
        for note in said:
            add_note(failing, note)
        return
    first = errors[0][1]
    for note in said[1:]:
        add_note(first, note)
    raise first
