"""Samplers that give a DDP rank its share of a DataLoader's own sampler.

``ddp.shard`` replaces only a DataLoader's default sampler by a ``DistributedSampler``.
Any other sampler (a ``SubsetRandomSampler`` holding out rows, a
``WeightedRandomSampler``...) is wrapped in a ``RankShare``, and a batch sampler of
your own in a ``BatchShare``: every rank draws the inner sampler's whole sequence and
keeps every ``world``-th element of it, as Lightning's ``DistributedSamplerWrapper``
does. That is sound only if every rank draws the same sequence, so an inner sampler
with a ``generator`` attribute gets one seeded from ``(seed, epoch)`` (which also makes
a resumed epoch draw as the interrupted one did), and the ranks compare a digest of
each epoch's draw once, before the first batch.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Sampler

from ..errors import SettingError
from . import ddp

__all__ = ["BatchShare", "RankShare", "epoch_generator", "rank_share", "reads_share"]


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator an epoch's order is drawn from: seeded by ``(seed, epoch)``."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


def reads_share(sampler: Any) -> bool:
    """Whether ``sampler`` already yields only this rank's share: a ``DistributedSampler``
    (Lightning's wrapper is one), one of ours, or any sampler that says which rank it
    samples for by ``DistributedSampler``'s attributes ``num_replicas`` and ``rank``."""
    from torch.utils.data.distributed import DistributedSampler

    if isinstance(sampler, (DistributedSampler, RankShare, BatchShare)):
        return True
    return hasattr(sampler, "num_replicas") and hasattr(sampler, "rank")


def rank_share(loader: Any) -> Any | None:
    """The sampler or batch sampler of ``loader`` that reads only this rank's share, if any."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    for s in (
        getattr(loader, "sampler", None),
        batch_sampler,
        getattr(batch_sampler, "sampler", None),
    ):
        if s is not None and reads_share(s):
            return s
    return None


class _Share:
    """What both wrappers share: the inner sampler, who reads, and the epoch's seeding."""

    def __init__(self, inner: Any, rank: int, world: int, seed: int) -> None:
        self.inner, self.rank, self.world, self.seed = inner, rank, world, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Draw the next ``iter()`` as epoch ``epoch`` (the Trainer calls it each epoch)."""
        self.epoch = epoch

    def _draw(self) -> list[Any]:
        """The inner sampler's whole sequence for this epoch, the same on every rank."""
        holder = self.inner
        if not hasattr(holder, "generator"):
            holder = getattr(holder, "sampler", None)  # a BatchSampler over a RandomSampler
        if holder is not None and hasattr(holder, "generator"):
            holder.generator = epoch_generator(self.seed, self.epoch)
        drawn = list(self.inner)
        digests = ddp.gather(_digest(drawn))
        if len(set(digests)) > 1:
            name = type(self.inner).__qualname__
            raise SettingError(
                f"the training DataLoader's {name} drew a different sequence on each rank in "
                f"epoch {self.epoch} ({len(set(digests))} different draws over {self.world} "
                f"ranks); under DDP each rank takes every {self.world}-th element of the "
                f"{name}'s draw, so every rank must draw the same one. Give the {name} a "
                "`generator` attribute that it draws from (the Trainer seeds it from (seed, "
                "epoch)), seed what it draws from alike on every rank, or pass a sampler that "
                "shards by rank itself (a DistributedSampler, or one with num_replicas and rank)"
            )
        return drawn


def _digest(drawn: list[Any]) -> str:
    """A short digest of a draw (indices, or batches of them), cheap for a long list of ints."""
    try:
        t = torch.tensor(drawn)
        raw = f"{t.dtype}{tuple(t.shape)}".encode() + t.numpy().tobytes()
    except (TypeError, ValueError, RuntimeError):  # ragged batches, keys that are no numbers
        raw = pickle.dumps(drawn)
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


class RankShare(_Share, Sampler[Any]):
    """This rank's share of another sampler's draw: every ``world``-th index, starting at
    ``rank``, the draw first padded from its start to a multiple of ``world`` (as a
    ``DistributedSampler`` pads), so every rank reads the same number of indices.

    Example:
        >>> from torch.utils.data import SubsetRandomSampler
        >>> share = RankShare(SubsetRandomSampler(range(32)), rank=0, world=2, seed=0)
        >>> len(share)
        16
    """

    def __len__(self) -> int:
        return -(-len(self.inner) // self.world)

    def __iter__(self) -> Iterator[Any]:
        drawn = self._draw()
        if drawn and len(drawn) % self.world:
            pad = self.world - len(drawn) % self.world
            drawn += (drawn * -(-pad // len(drawn)))[:pad]
        return iter(drawn[self.rank :: self.world])


class BatchShare(_Share, Sampler[list[Any]]):
    """This rank's share of a batch sampler's draw: every ``world``-th batch, starting at
    ``rank``, the last ``len % world`` batches dropped so every rank takes as many steps
    (as for a sequence of batches; a batch cannot be padded without changing its size).

    Example:
        >>> from torch.utils.data import BatchSampler, SequentialSampler
        >>> inner = BatchSampler(SequentialSampler(range(10)), batch_size=2, drop_last=False)
        >>> len(BatchShare(inner, rank=1, world=2, seed=0))
        2
    """

    def __len__(self) -> int:
        return len(self.inner) // self.world

    def __iter__(self) -> Iterator[list[Any]]:
        drawn = self._draw()
        return iter(drawn[: len(drawn) - len(drawn) % self.world][self.rank :: self.world])
