"""Limiting batches: ``Options(limit_train_batches=, limit_val_batches=)``, as in Lightning.

A limit is a count (an int: at most that many batches) or a fraction of the data's length
(a float in (0, 1]: ``int(length * fraction)`` batches, rounded down as Lightning rounds).
A training epoch takes the first batches of its order — with shuffling, another subset each
epoch — and an evaluation the first of the validation data. Under DDP a limit is per rank,
of the rank's own share (Lightning's "per device"). Limits are resolved against the data
when ``fit`` starts, so a fraction the data cannot honour is an error before any step.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from typing import Any

from ..errors import SettingError
from .samplers import rank_share

__all__ = [
    "batches_per_epoch",
    "check_limit",
    "epoch_examples",
    "length",
    "limited",
    "one_epoch",
    "share",
    "steps_per_epoch",
]


def check_limit(name: str, value: Any) -> None:
    """``Options(<name>=value)``: None, a count >= 1, or a fraction in (0, 1]."""
    if value is None:
        return
    what = "train on" if name == "limit_train_batches" else "evaluate on"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SettingError(
            f"Options({name}={value!r}) must be a count of batches (an int, {name}=10), a "
            f"fraction of the data's batches (a float in (0, 1], {name}=0.25), or None for all"
        )
    if isinstance(value, int) and value < 1:
        hint = (
            "to train nothing, do not call fit()"
            if name == "limit_train_batches"
            else "to evaluate nothing, fit without val="
        )
        raise SettingError(
            f"Options({name}={value}) would {what} no batch; pass at least 1 ({hint}), or "
            "None for all batches"
        )
    if isinstance(value, float) and not 0.0 < value <= 1.0:
        count = (
            f"; for a count of batches pass an int ({name}={int(value)})"
            if math.isfinite(value) and value > 1 and value == int(value)
            else ""
        )
        raise SettingError(
            f"Options({name}={value}) is a fraction of the data's batches and must be in "
            f"(0, 1], e.g. {name}=0.25{count}"
        )


def length(data: Any) -> int | None:
    """``len(data)``, or None when it has none (a generator; a DataLoader over an
    ``IterableDataset``, whose ``len`` raises)."""
    if not isinstance(data, Sized):
        return None
    try:
        return len(data)
    except TypeError:
        return None


def share(data: Any, rank: int, world: int, *, even: bool) -> int | None:
    """Batches this rank reads of ``data`` in one pass (None when the data has no length).

    A DataLoader whose sampler reads only this rank's share (``samplers.reads_share``) is
    that share; anything else is read every ``world``-th batch — dropping the last
    ``len % world`` for training (``even``), none for an evaluation (see
    ``batches.epoch_batches``)."""
    size = length(data)
    if size is None or world == 1 or rank_share(data) is not None:
        return size
    return size // world if even else len(range(rank, size, world))


def batches_per_epoch(
    name: str, limit: int | float | None, data: Iterable[Any], rank: int, world: int, *, even: bool
) -> int | None:
    """How many batches ``limit`` lets a pass over ``data`` take (None: every batch, also
    when the limit is at least the data's length).

    Raises:
        SettingError: a fraction other than 1.0 of data without a length, or a fraction so
            small it takes no batch.
    """
    if limit is None:
        return None
    size = share(data, rank, world, even=even)
    if isinstance(limit, int):
        return limit if size is None or limit < size else None
    if size is None:
        if limit == 1.0:
            return None
        raise SettingError(
            f"Options({name}={limit}) is a fraction of the data's length, but the "
            f"{type(data).__qualname__} given has none (a generator, an IterableDataset); "
            f"pass a count of batches ({name}=100), or 1.0 for all"
        )
    if size == 0:
        return None  # no batches at all: the Trainer's own error for empty data says so
    n = int(size * limit)
    if n == 0:
        raise SettingError(
            f"Options({name}={limit}) takes int({size} * {limit}) = 0 of the {size} batches"
            f"{' this rank reads' if world > 1 else ''}; pass a fraction of at least 1/{size}, "
            f"or a count of batches ({name}=1)"
        )
    return n if n < size else None


def limited(batches: Iterator[Any], n: int | None) -> Iterator[Any]:
    """The first ``n`` of ``batches`` (all of them for None); the rest is never read."""
    return batches if n is None else itertools.islice(batches, n)


def steps_per_epoch(
    data: Iterable[Any], limit: int | None, accumulate: int, rank: int, world: int
) -> int | None:
    """Optimizer steps in one training epoch (None when the data cannot say): its batches —
    as many as ``limit`` lets it take — in groups of ``accumulate``, the last maybe smaller."""
    size = share(data, rank, world, even=True)
    batches = limit if size is None else (size if limit is None else min(size, limit))
    return None if batches is None else -(-batches // accumulate)


def epoch_examples(
    data: Iterable[Any],
    n: int | None,
    seed: int,
    shuffle: bool,
    world: int,
    count: Callable[[Any], int] | None = None,
) -> int | None:
    """Examples one epoch trains on, over all ranks (None when the data cannot say);
    ``count``: a batch's examples, as the steps count them (of ``split``'s inputs).

    Unlimited (``n`` None): the data's (``start.count_examples``). Limited to ``n`` batches
    a rank: for a sequence, those of the first epoch's first ``n`` batches of each rank;
    for a DataLoader with a ``batch_size``, ``n`` full batches a rank, at most what its
    sampler draws an epoch.
    """
    from .start import count_examples

    if count is None:
        from .batches import num_examples

        count = num_examples
    if n is None:
        return count_examples(data, world, count)

    if isinstance(data, Sequence):
        from .batches import epoch_batches

        return sum(
            count(b)
            for rank in range(world)
            for b in itertools.islice(epoch_batches(data, 0, seed, shuffle, rank, world), n)
        )
    size = getattr(data, "batch_size", None)
    full = count_examples(data, world, count)  # (an oversampling sampler draws more)
    if isinstance(size, int) and full is not None:
        return min(n * size * world, full)
    return None


def one_epoch(n: int | None, s: Any) -> int:
    """A result's ``num_examples``: ``n``, what one epoch of the data holds
    (``epoch_examples``); when the data cannot say, the examples the run's first epoch
    trained on (``RunState.epoch_examples``), or those of a run that stopped within it."""
    if n is not None:
        return n
    return int(s.epoch_examples if s.epoch_examples is not None else s.examples_seen)
