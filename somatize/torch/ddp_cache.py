"""Per-example memory under DDP needs a keeper the ranks share.

A ``DistributedSampler`` deals each epoch's rows to the ranks afresh, so a rank meets in
epoch 2 rows another rank computed in epoch 1: with a keeper in each process's memory (a
``MemoryKeeper``, the default), each rank hits only about ``1 / world`` of its rows in
the second epoch (more later, as its memory fills), where one process hits them all.
``fit`` warns once (rank 0) naming the nodes and the fix, a ``DiskKeeper`` on a path every
rank reads. Nodes cached per example inside a subgraph count too (``enc/a``): they use the
outer graph's keeper.
"""

from __future__ import annotations

import warnings
from typing import Any

from ..graph import Graph
from ..keepers import MemoryKeeper, TieredKeeper
from ..stack import outside

__all__ = ["per_example_nodes", "warn_private_rows"]


def per_example_nodes(g: Graph, prefix: str = "") -> list[str]:
    """The nodes ``g`` caches per example, those of its subgraphs too (named ``enc/a``, as
    ``TrainResult.cache`` names them)."""
    found = [prefix + n for n in g.memory.per_example]
    for sub_id, sub in g._subgraphs().items():
        found += per_example_nodes(sub, f"{prefix}{sub_id}/")
    return sorted(found)


def _private(keeper: Any) -> bool:
    """Whether ``keeper`` keeps its entries in this process alone: none yet (a
    ``MemoryKeeper`` is made on first need), a ``MemoryKeeper``, or a ``TieredKeeper``
    whose tiers are both such."""
    if keeper is None or type(keeper) is MemoryKeeper:
        return True
    if type(keeper) is TieredKeeper:
        return _private(keeper.fast) and _private(keeper.slow)
    return False  # (a DiskKeeper, a TieredKeeper over one, a keeper of the user's: shared)


def warn_private_rows(model: Any, world: int) -> None:
    """Warn when ``model``, a graph trained on ``world`` > 1 ranks, caches a node per
    example (its own or a subgraph's) in a keeper of this process's memory alone."""
    if world < 2 or not isinstance(model, Graph) or not _private(model.keeper):
        return
    nodes = per_example_nodes(model)
    if not nodes:
        return
    warnings.warn(
        f"node{'s' * (len(nodes) > 1)} {', '.join(repr(n) for n in nodes)} cached per "
        f"example under DDP ({world} ranks) with a keeper in each process's memory: the "
        "sampler deals rows to the ranks afresh each epoch, so each rank finds only about "
        f"1/{world} of its rows cached in the second epoch (more later, as its memory "
        "fills), where one process finds them all. Give the graph a keeper the ranks share: "
        "Graph.somatize(..., keeper=DiskKeeper(path)) on a path every rank reads",
        UserWarning,
        stacklevel=outside(),
    )
