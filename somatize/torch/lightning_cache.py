"""What a ``LightningGraph``'s remembered nodes found, under ``lightning.Trainer``: each
training epoch's counts (``EpochEnd.cache``, taken once whichever asks first: the module's
hook or ``Watch``'s), logged as ``cache/<node>/hit_rate`` over every rank's lookups.

Used by ``somatize.torch.lightning``; the counting itself is ``tally.py``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import tally

if TYPE_CHECKING:
    from .lightning import LightningGraph

__all__ = ["epoch_counts", "log_hit_rates"]


def epoch_counts(lg: LightningGraph) -> dict[str, dict[str, int]]:
    """This rank's counts of the epoch ending now; {} for a graph that remembers nothing."""
    epoch = lg.current_epoch
    if lg._tally is None:
        return {}
    if lg._epoch_counts[0] != epoch:  # (each rank counts its own share)
        lg._epoch_counts = (epoch, lg._tally.end_epoch(epoch, warn=lg.global_rank == 0))
    return lg._epoch_counts[1]


def log_hit_rates(lg: LightningGraph, counts: dict[str, dict[str, int]]) -> None:
    """``cache/<node>/hit_rate`` for the epoch: hits over lookups, every rank's summed."""
    if lg._tally is None:
        return
    run = tally.over_ranks(counts, lg.trainer.world_size)  # all ranks' lookups
    for node, c in sorted(run.items()):  # (the same names and values on every rank)
        if total := c["hits"] + c["misses"]:
            # synced by "max", the rate stays as it is (and Lightning does not advise
            # sync_dist=True for an epoch-level value, as it does without it)
            name = f"cache/{node}/hit_rate"
            lg.log(name, c["hits"] / total, on_epoch=True, sync_dist=True, reduce_fx="max")
