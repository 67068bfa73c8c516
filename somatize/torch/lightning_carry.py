"""State a ``LightningGraph``'s nodes carry from batch to batch (``st.Carry``), handled as
the somatize Trainer handles it: checked when training starts (a shuffled DataLoader,
DDP), reset at each training epoch's start and at the start of each loader a validation,
test or predict reads, training's own given back after a validation.

Used by ``somatize.torch.lightning``; needs the ``lightning`` extra there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch.utils.data import RandomSampler

from .carry import Carry, carries, check_carried, named_carries, reset

if TYPE_CHECKING:
    from .lightning import LightningGraph

__all__ = ["check", "give_back", "keep", "start_set"]


def check(lg: LightningGraph) -> None:
    """``on_train_start``: warn, as ``st.Trainer`` warns, when the model carries state and
    the training DataLoader shuffles or DDP deals the batches out to several ranks.
    (Lightning accumulates whole batches, in order: nothing is chunked, so no
    ``micro_batches`` to refuse.)"""
    named = named_carries(lg.net)
    if not named:
        return
    loaders = _loaders(lg.trainer.train_dataloader)
    shuffled = [d for d in loaders if isinstance(getattr(d, "sampler", None), RandomSampler)]
    check_carried(named, 1, shuffled[0] if shuffled else None, False, lg.trainer.world_size)


def _loaders(data: Any) -> list[Any]:
    """The DataLoaders in what Lightning trains on (one, or a list or dict of them)."""
    if isinstance(data, Mapping):
        return [d for v in data.values() for d in _loaders(v)]
    if isinstance(data, (list, tuple)):
        return [d for v in data for d in _loaders(v)]
    return [data] if data is not None else []


def start_set(lg: LightningGraph, batch_idx: int) -> None:
    """At the first batch of each loader an evaluation or a predict reads: start afresh, as
    each of ``st.Trainer``'s validation sets does (``trainer.predict`` too, as
    ``st.Trainer.predict``: never from the state training left)."""
    if batch_idx == 0:
        reset(carries(lg.net))


def keep(lg: LightningGraph) -> list[tuple[Carry, Any]]:
    """``on_validation_epoch_start``: training's carried values, given back after."""
    return [(c, c.value) for c in carries(lg.net)]


def give_back(kept: list[tuple[Carry, Any]]) -> None:
    """``on_validation_epoch_end``: training goes on from the state it had."""
    for c, value in kept:
        c.value = value
