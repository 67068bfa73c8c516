"""What a graph's remembered nodes found during a fit: ``TrainResult.cache``, ``EpochEnd.cache``.

For the length of ``fit``, the Trainer (and ``LightningGraph``, under Lightning's) adds a
``CacheTally`` to the watchers of each graph in the model that remembers a node (the
model's own, or those of graph modules inside a module of the user's). It counts, per node, what each lookup of the training steps
found: rows for a node cached per example (``CacheRows``), items for a cached
``.mapped()`` node, calls for a node cached whole (``CacheHit``/``CacheMiss``).
Evaluations are not counted. A checkpoint keeps the counts (``CacheTally.state``, one per
rank), so the counts of a resumed fit are those of the whole run. After each epoch the Trainer takes that epoch's counts
(``EpochEnd.cache``), and warns once per node when an epoch after the first found fewer than
one in ten of its lookups although an earlier epoch counted since the fit started (or
resumed) stored them: the cache then costs its keys and writes and saves little or nothing.
It also warns, once, about a node cached per example whose epoch found fewer than nine
rows in ten while its keeper evicted entries (bounded below an epoch's rows: under a
shuffled loader it keeps fewer than its share, unless ``policy="epochs"``), or while its input rows came in several
shapes (each ``CacheRows.layout`` of the epoch, one set add a batch): batches padded to
their own longest sequence, whose examples hit only at a length they met before.
(A resumed fit's first epoch is not compared with the epochs before the resume: a new
process's ``MemoryKeeper`` starts empty, so that epoch stores what it looks up, as a run's
first epoch does.)
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from ..keepers import DiskKeeper, MemoryKeeper
from ..stack import outside
from ..watchers import CacheHit, CacheMiss, CacheRows, Event
from .module import GraphModule
from .tally_messages import (
    COLD,
    PADDED,
    bounded_note,
    cold_note,
    dropped,
    evicted_note,
    padded_note,
    row_shapes,
)

__all__ = ["CacheTally", "Counts", "over_ranks", "resumed", "state"]


Counts = dict[str, dict[str, int]]  # node -> {"hits": ..., "misses": ...}


def _node(label: str) -> str:
    """The node of a lookup's label: a mapped node's item ``enc[3]`` counts as ``enc``."""
    if label.endswith("]"):
        base, _, index = label[:-1].rpartition("[")
        if base and index.isdigit():
            return base
    return label


class CacheTally:
    """Counts hits and misses of remembered nodes, by node, since it was made and per epoch."""

    def __init__(self, since: Mapping[str, Any] | None = None) -> None:
        """A tally counting on from ``since``, a checkpoint's ``state()`` (None: from 0)."""
        since = since or {}
        self.total: Counts = _counts(since.get("total"))
        self._epoch: Counts = _counts(since.get("epoch"))
        self._warned: set[str] = set(since.get("warned") or ())
        self._whole: set[str] = set(since.get("whole") or ())  # nodes cached whole (a call)
        self._paused = False
        self._missed: set[str] = set()  # nodes whose lookups missed (stored) this epoch
        # node cached per example -> the layouts of its input rows this epoch (shapes)
        self._layouts: dict[str, set[tuple[Any, ...]]] = {}
        self._stored: set[str] = set()  # ... in an earlier epoch, each since looked up
        # the MemoryKeepers of the graphs, and what each had evicted when the fit began
        self.keepers: list[tuple[Any, int]] = []
        self.roots: set[str] = set()  # roots of graphs with several: each gets every input

    def state(self) -> dict[str, Any]:
        """The counts so far — the run's, the epoch's — and the nodes warned about, as
        plain dicts, lists, strings and ints (a checkpoint loads them with weights_only)."""
        return {
            "total": _counts(self.total),
            "epoch": _counts(self._epoch),
            "warned": sorted(self._warned),
            "whole": sorted(self._whole),
        }

    def on_event(self, event: Event) -> None:
        if self._paused:
            return
        kind = type(event)
        if kind is CacheRows:
            node, layout = event.node, event.layout  # type: ignore[attr-defined]
            self._add(node, event.hits, event.misses)  # type: ignore[attr-defined]
            seen = self._layouts.get(node)
            if seen is None:
                self._layouts[node] = {layout}
            else:
                seen.add(layout)
        elif kind is CacheHit or kind is CacheMiss:
            label: str = event.node  # type: ignore[attr-defined]
            node = _node(label)
            if node == label:
                self._whole.add(node)
            self._add(node, int(kind is CacheHit), int(kind is CacheMiss))

    def _add(self, node: str, hits: int, misses: int) -> None:
        if misses:
            self._missed.add(node)
        for counts in (self._epoch, self.total):
            c = counts.get(node)
            if c is None:
                counts[node] = {"hits": hits, "misses": misses}
            else:
                c["hits"] += hits
                c["misses"] += misses

    def pause(self, paused: bool) -> None:
        """Stop counting (``True``: an evaluation begins), or count again."""
        self._paused = paused

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Nothing is counted inside (the Trainer's evaluations)."""
        was = self._paused
        self.pause(True)
        try:
            yield
        finally:
            self.pause(was)

    def end_epoch(self, epoch: int, warn: bool = True) -> Counts:
        """The counts of the epoch just ended, warning about nodes gone cold, or missing
        rows padded to each batch's longest sequence."""
        counts, self._epoch = self._epoch, {}  # (its own dicts: ``total`` holds others)
        layouts, self._layouts = self._layouts, {}
        for node, c in counts.items():
            hits, lookups = c["hits"], c["hits"] + c["misses"]
            # an earlier epoch counted here missed, so wrote: not ``total``, which holds a
            # resumed checkpoint's counts too (their entries may be in no keeper of this process)
            stored = node in self._stored
            if not warn or not stored or hits >= PADDED * lookups or node in self._warned:
                continue
            shapes = row_shapes(layouts.get(node, ()))
            evicted = None  # (keepers' stats read only where a warning may follow)
            if hits < COLD * lookups:
                message = cold_note(
                    node, epoch, hits, lookups, node in self._whole, node in self.roots, shapes
                )
            elif shapes is not None:
                message = padded_note(node, epoch, hits, lookups, shapes)
            else:  # a middling rate at one row shape: warned only with evictions to name
                if not (evicted := evicted_note(self.keepers)):
                    continue
                lru = any(getattr(k, "policy", "lru") == "lru" for k, _ in self.keepers)
                message = bounded_note(node, epoch, hits, lookups, lru)
            self._warned.add(node)
            # (from here: Trainer.fit's caller, past loop.train and Trainer._fit)
            if evicted is None:
                evicted = evicted_note(self.keepers)
            warnings.warn(evicted + message, RuntimeWarning, stacklevel=outside())
        # a node not looked up this epoch (unfrozen, or its cache off) starts afresh when it
        # is again: its first epoch then, under new weights, finds nothing, as a first epoch
        self._stored = (self._stored & counts.keys()) | self._missed
        self._missed = set()
        return counts


def _counts(counts: Any) -> Counts:
    """A copy of ``counts``, node -> {"hits", "misses"} ({} for None)."""
    return {
        str(node): {"hits": int(c["hits"]), "misses": int(c["misses"])}
        for node, c in (counts or {}).items()
    }


def _graphs(net: Any) -> list[Any]:
    """The graphs in ``net`` that remember a node: its own, or those of the graph modules
    inside a module of the user's."""
    found = [m.graph for m in net.modules() if isinstance(m, GraphModule)]
    return [g for g in found if g.program().keyed]


def attach(net: Any, since: Mapping[str, Any] | None = None) -> CacheTally | None:
    """A tally watching the graphs in ``net`` for the fit, counting on from ``since`` (a
    resumed run's, ``resumed``), or None when none remembers a node."""
    graphs = _graphs(net)
    if not graphs:
        return None
    tally = CacheTally(since)
    for g in graphs:
        g.watchers.append(tally)
        if len(roots := g.topology.roots) > 1:  # (towers: each reading its part, perhaps)
            tally.roots.update(roots)
        if isinstance(g.keeper, MemoryKeeper) or (
            isinstance(g.keeper, DiskKeeper) and g.keeper.max_bytes is not None
        ):
            tally.keepers.append((g.keeper, dropped(g.keeper.stats())))
    return tally


def detach(net: Any, tally: CacheTally | None) -> None:
    """Take ``tally`` off the graphs in ``net`` again (by identity: other watchers stay)."""
    if tally is None:
        return
    for m in net.modules():
        if isinstance(m, GraphModule):
            watchers = m.graph.watchers
            watchers[:] = [w for w in watchers if w is not tally]


def state(tally: CacheTally | None) -> dict[str, Any]:
    """What a checkpoint keeps of ``tally`` (``CacheTally.state``; nothing counted without one)."""
    return tally.state() if tally is not None else CacheTally().state()


def resumed(saved: Any, rank: int, world: int) -> Mapping[str, Any] | None:
    """This rank's part of a checkpoint's counts (``saved``: one ``state`` per rank of the
    run that wrote it). From a run of another number of processes, rank 0 takes their sum
    and the other ranks none, so the counts over all ranks are still the run's. None for a
    checkpoint from before the counts were kept: a resumed fit then counts from 0."""
    if not isinstance(saved, list) or not saved:
        return None
    if len(saved) == world:
        return dict(saved[rank])
    if rank:
        return None
    total: Counts = {}
    for part in saved:
        for node, c in _counts(part.get("total")).items():
            mine = total.setdefault(node, {"hits": 0, "misses": 0})
            mine["hits"] += c["hits"]
            mine["misses"] += c["misses"]
    return {"total": total}


def totals(tally: CacheTally | None) -> Mapping[str, dict[str, int]]:
    """The fit's counts, for ``TrainResult.cache`` (empty without a tally)."""
    return {node: dict(c) for node, c in tally.total.items()} if tally is not None else {}


def over_ranks(counts: Mapping[str, dict[str, int]], world: int) -> Mapping[str, dict[str, int]]:
    """``counts`` summed over every rank's, on every rank (under DDP each rank counts its own
    share of the batches): ``TrainResult.cache`` is the run's, as ``num_examples`` is.
    Collective: every rank calls it."""
    if world <= 1:
        return counts
    from . import ddp

    out: dict[str, dict[str, int]] = {}
    for mine in ddp.gather({node: dict(c) for node, c in counts.items()}):
        for node, c in mine.items():
            summed = out.setdefault(node, {})
            for k, v in c.items():
                summed[k] = summed.get(k, 0) + v
    return out
