"""Under DDP, every rank must have been given the same data: the Trainer shards it itself.

A rank given data of another length would train another number of steps, and DDP's
gradient all-reduce would wait on the rank that stopped until the process group's
timeout (30 minutes, silently); a validation set of another length gives each rank's
share of another set, and a metric over neither. So ``fit`` compares, once, the length
of every rank's training data and validation sets (one ``all_gather`` of a few integers),
and ``evaluate()`` that of its data; where they differ, every rank raises the same
``SettingError``, naming each rank's length and the fix. ``fit`` compares the Trainer's
``seed`` in the same collective: it orders what the ranks take their shares of (the
``DistributedSampler``'s permutation, a shuffled sequence, a wrapped sampler's draw), so
ranks with other seeds would read overlapping shares — some rows twice an epoch, others
never — silently.

Data without a length (an iterable, a loader over an ``IterableDataset``) is not
compared: the ranks agree on it each round (``batches.epoch_batches``). Nor is a
validation loader whose sampler reads only this rank's share (its shares may differ).

What the sharding drops of a sequence of batches, or of a batch sampler of the user's,
each epoch — the last round that is not full — is warned of once a fit (``warn_dropped``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..errors import SettingError, add_note
from ..stack import outside
from .limits import length
from .samplers import BatchShare, epoch_generator, rank_share

__all__ = ["agree", "warn_dropped"]

_NONE = -1  # no length: not compared (the ranks agree per round)
_OWN = -2  # a validation loader reading this rank's share: not compared


def agree(
    train: Iterable[Any] | None,
    val: Any,
    world: int,
    *,
    val_label: str = "fit()'s val data",
    seed: int | None = None,
) -> None:
    """Raise on every rank where the ranks' ``train`` (after ``ddp.shard``) or validation
    sets (``val``: one, or a dict of them) differ in length, or their ``seed`` (the
    Trainer's, given by ``fit``) differs. One collective; nothing in one process."""
    if world <= 1:
        return
    named: list[tuple[str, Any, bool]] = []
    if train is not None:
        named.append(("fit()'s training data", train, True))
    if val is not None:
        sets = val.items() if isinstance(val, Mapping) else [("", val)]
        for name, data in sets:
            named.append((f"val set {name!r}" if name else val_label, data, False))
    if not named and seed is None:
        return
    mine = [n for _, data, training in named for n in _measure(data, training)]
    t = torch.tensor([-1 if seed is None else seed, *mine], dtype=torch.int64)
    if dist.get_backend() == "nccl":  # nccl's tensors are on the GPU
        t = t.to("cuda")
    every = [torch.empty_like(t) for _ in range(world)]
    try:
        dist.all_gather(every, t)
    except Exception as e:  # (gloo: "Connection closed by peer ... a remote worker crashing")
        add_note(e, _collective("fit()" if train is not None else "evaluate()", world))
        raise
    seeds, ranks = [int(r[0]) for r in every], [r[1:].tolist() for r in every]
    if len(set(seeds)) > 1:
        raise SettingError(_seeds_differ(seeds))
    for j, (label, data, training) in enumerate(named):
        counts = [r[2 * j] for r in ranks]
        if len(set(counts)) == 1 or _OWN in counts or (_NONE in counts and not training):
            continue
        rows = [r[2 * j + 1] for r in ranks]
        raise SettingError(_differ(label, data, training, counts, rows, world))


def _collective(call: str, world: int) -> str:
    return (
        f"under DDP {call} is collective: every one of the {world} ranks must call it (each "
        "takes its share of the data, and the metrics are over all of them); a rank that "
        "skipped it (an `if rank == 0:` around it), exited or failed leaves its peers here. "
        f"Call {call} on every rank; the Trainer logs and checkpoints from rank 0 alone"
    )


def _seeds_differ(seeds: list[int]) -> str:
    each = ", ".join(f"rank {r}: {s}" for r, s in enumerate(seeds))
    return (
        f"under DDP every rank must give the Trainer the same seed, but it differs: {each}. "
        "The seed orders the data every rank takes its share of (the DistributedSampler's "
        "permutation, a shuffled list of batches), so with other seeds the ranks' shares "
        "overlap: some rows are trained on twice an epoch, others never. Pass one seed on "
        "every rank (st.Trainer(seed=0), not a seed from the rank, the time or "
        "random); randomness that should differ by rank can be seeded in your own code from "
        "torch.distributed.get_rank()"
    )


def _measure(data: Any, training: bool) -> tuple[int, int]:
    """(batches — of a sequence, all it holds; of a loader, what this rank reads an epoch —
    and the rows of a loader's dataset, -1 where unknown)."""
    dataset = getattr(data, "dataset", None)
    rows = length(dataset) if dataset is not None else None
    if not training and not isinstance(data, Sequence) and rank_share(data) is not None:
        return _OWN, -1
    n = length(data)
    return (_NONE if n is None else n), (-1 if rows is None else rows)


def _differ(
    label: str, data: Any, training: bool, counts: list[int], rows: list[int], world: int
) -> str:
    def one(r: int) -> str:
        n = "no length" if counts[r] == _NONE else f"{counts[r]} batch{'es' * (counts[r] != 1)}"
        return f"rank {r}: {n}" + (f" (of {rows[r]} rows)" if rows[r] >= 0 else "")

    each = ", ".join(one(r) for r in range(world))
    share = (
        f"a sequence of batches is dealt out, each rank taking one batch in {world}; a "
        "DataLoader's default sampler becomes a DistributedSampler"
    )
    if training:
        why = (
            "the ranks would train different numbers of steps, and DDP would wait on the "
            "rank that stopped until the process group's timeout"
        )
        stream = (
            "; or pass an IterableDataset (or an iterable without a length), on which the "
            "ranks agree each round and stop together"
        )
    else:
        why = "each rank would evaluate its share of another set: a metric of neither"
        stream = ""
    return (
        f"under DDP every rank must be given the same {label}, but its length differs: "
        f"{each}; {why}. Give every rank the same data — the Trainer shards it itself ({share}"
        f"; docs/trainer.md, 'Data-parallel training (DDP)'){stream}"
    )


def warn_dropped(
    train: Iterable[Any], world: int, seed: int, shuffle: bool, count: Callable[[Any], int]
) -> None:
    """Warn (call on rank 0) that a sequence of batches whose length is not a multiple of
    ``world`` loses its last round each epoch: ``len % world`` batches, and how many examples
    they held in the first epoch; so does a batch sampler of the user's (``BatchShare``)."""
    if world <= 1:
        return
    share = getattr(train, "batch_sampler", None)
    if isinstance(share, BatchShare) and len(share.inner) % world:
        n, dropped = len(share.inner), len(share.inner) % world
        name = type(share.inner).__qualname__
        warnings.warn(
            f"under DDP the {world} ranks take turns at the {n} batches your {name} draws "
            f"and must step together, so each epoch drops the last {dropped} "
            f"batch{'es' if dropped > 1 else ''} of its draw. To train on every example, "
            f"make it draw a number of batches that is a multiple of {world}, or give the "
            "DataLoader a batch_size instead (its DistributedSampler pads the last rows)",
            UserWarning,
            stacklevel=outside(),
        )
        return
    if not isinstance(train, Sequence) or not len(train) % world:
        return
    n = len(train)
    dropped = n % world
    order = torch.randperm(n, generator=epoch_generator(seed, 0)).tolist() if shuffle else range(n)
    lost = sum(count(train[i]) for i in list(order)[n - dropped :])
    which = "another each epoch, as shuffled" if shuffle else "the last of the list"
    warnings.warn(
        f"under DDP the {world} ranks take turns at the {n} training batches and must step "
        f"together, so each epoch drops {dropped} batch{'es' if dropped > 1 else ''} ({which}; "
        f"{lost} examples in epoch 0). To train on every example, give a number of batches "
        f"that is a multiple of {world} (a batch size that divides the rows among the "
        "ranks), or a DataLoader, whose DistributedSampler pads the last rows instead",
        UserWarning,
        stacklevel=outside(),
    )
