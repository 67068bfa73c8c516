"""Per-example memory under DDP needs a keeper the ranks share.

A ``DistributedSampler`` deals each epoch's rows to the ranks afresh, so a rank meets in
epoch 2 rows another rank computed in epoch 1: with a keeper in each process's memory (a
``MemoryKeeper``, the default), each rank hits only about ``1 / world`` of its rows, where
one process hits them all. ``fit`` warns once (rank 0) naming the nodes and the fix, a
``DiskKeeper`` on a path every rank reads.
"""

from __future__ import annotations

import warnings
from typing import Any

from ..graph import Graph
from ..keepers import MemoryKeeper
from ..stack import outside

__all__ = ["warn_private_rows"]


def warn_private_rows(model: Any, world: int) -> None:
    """Warn when ``model``, a graph trained on ``world`` > 1 ranks, caches a node per
    example in a keeper of this process's memory alone."""
    if world < 2 or not isinstance(model, Graph) or not model.memory.per_example:
        return
    if model.keeper is not None and type(model.keeper) is not MemoryKeeper:
        return  # (a DiskKeeper, a TieredKeeper over one, a keeper of the user's: shared)
    nodes = ", ".join(repr(n) for n in sorted(model.memory.per_example))
    warnings.warn(
        f"node{'s' * (len(model.memory.per_example) > 1)} {nodes} cached per example "
        f"under DDP ({world} ranks) with a keeper in each process's memory: the sampler "
        "deals rows to the ranks afresh each epoch, so each rank finds only about "
        f"1/{world} of its rows cached. Give the graph a keeper the ranks share: "
        "Graph.somatize(..., keeper=DiskKeeper(path)) on a path every rank reads",
        UserWarning,
        stacklevel=outside(),
    )
