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
shuffled loader it keeps fewer than its share), or while its input rows came in several
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
            if not warn or not stored or hits >= _PADDED * lookups or node in self._warned:
                continue
            shapes = _shapes(layouts.get(node, ()))
            evicted = None  # (keepers' stats read only where a warning may follow)
            if hits < _COLD * lookups:
                message = _cold(
                    node, epoch, hits, lookups, node in self._whole, node in self.roots, shapes
                )
            elif shapes is not None:
                message = _padded(node, epoch, hits, lookups, shapes)
            else:  # a middling rate at one row shape: warned only with evictions to name
                if not (evicted := _evicted(self.keepers)):
                    continue
                message = _bounded(node, epoch, hits, lookups)
            self._warned.add(node)
            # (from here: Trainer.fit's caller, past loop.train and Trainer._fit)
            if evicted is None:
                evicted = _evicted(self.keepers)
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


_COLD = 0.1  # an epoch after the first finding fewer of a node's lookups than this is cold
# ... fewer than this, its input rows in several shapes: padded to each batch's longest
_PADDED = 0.9


def _evicted(keepers: list[tuple[Any, int]]) -> str:
    """The known cause first, when there is one: a MemoryKeeper (or a bounded DiskKeeper's
    own gcs) evicted since the fit began, being smaller than what an epoch stores."""
    for keeper, before in keepers:
        stats = keeper.stats()
        if (n := stats.evicted - before) > 0:
            bound = f"max_bytes={keeper.max_bytes:,}"
            if isinstance(keeper, MemoryKeeper):
                kind, fix = f"MemoryKeeper({bound})", "raise max_bytes, or use a DiskKeeper"
            else:  # (a DiskKeeper whose own gcs keep it under max_bytes)
                kind = f"DiskKeeper({str(keeper.path)!r}, {bound})"
                fix = "raise max_bytes (or leave it out, and run somatize cache gc between runs)"
            return (
                f"The keeper evicted {n:,} entries since this fit began: "
                f"{kind} holds less than an epoch "
                f"stores ({stats.bytes:,} bytes kept now) — {fix}. "
            )
    return ""


def _bounded(node: str, epoch: int, hits: int, lookups: int) -> str:
    return (
        f"node {node!r} is cached, but only {hits:,} of its {lookups:,} lookups of epoch "
        f"{epoch + 1} found what an earlier epoch stored: a shuffled loader reads every row "
        "once an epoch in a new order, and a keeper that holds part of an epoch keeps the "
        "rows read last, which the next epoch's misses evict before their turn — it saves "
        "less than its share (docs/caching.md, on a machine with little memory)"
    )


def _shapes(layouts: Any) -> tuple[int, str] | None:
    """How many row shapes a node's input came in (``layouts``: the ``CacheRows.layout`` of
    its batches in an epoch) and their range said — ``(17,) to (64,)``, ``'input_ids' (17,)
    to (64,), ...`` for the fields that vary — or None: one shape, or layouts not the
    torch codec's rows of one structure (no padding to name)."""
    shapes: set[tuple[Any, ...]] = set()
    structures = set()
    for layout in layouts:
        if type(layout) is not tuple or len(layout) != 3:
            return None
        kind, names, leaves = layout
        row = tuple(lay[1] if _shaped(lay) else None for _, lay in leaves)
        if None in row:
            return None
        structures.add((kind, names, len(row)))
        shapes.add(row)
    if len(shapes) < 2 or len(structures) != 1:
        return None
    kind, names, width = structures.pop()
    said = []
    for i in range(width):
        mine = sorted({row[i] for row in shapes})
        if len(mine) > 1:
            field = f"{names[i]!r} " if kind == "dict" else "" if kind == "leaf" else f"[{i}] "
            said.append(f"{field}{mine[0]} to {mine[-1]}")
    return len(shapes), ", ".join(said)


def _shaped(lay: Any) -> bool:
    """Whether ``lay`` is a tensor's row layout: (dtype, shape without the batch dim)."""
    return (
        type(lay) is tuple
        and len(lay) == 2
        and type(lay[1]) is tuple
        and all(type(d) is int for d in lay[1])
    )


_PADDING = (
    "each batch padded to its own longest sequence (pad_sequence in a collate_fn, or Hugging "
    "Face's DataCollatorWithPadding): a row is its bytes, padding included, so an example "
    "is keyed anew at each length its batch pads it to, and hits only at a length it met "
    "before"
)
_PAD_FIX = (
    'pad to one fixed length (tokenizer(..., padding="max_length", max_length=...), or F.pad '
    "after pad_sequence), or to a few bucket lengths each example always meets (batches "
    "grouped by length, each padded to its bucket's)"
)


def _padded(node: str, epoch: int, hits: int, lookups: int, shapes: tuple[int, str]) -> str:
    share = hits * 100 // lookups  # (rounded down: 89.6% is not said as 90%)
    return (
        f"node {node!r} is cached per example, but epoch {epoch + 1} found only {share}% of "
        f"its {lookups:,} rows ({hits:,}) stored by an earlier epoch, and its input came in "
        f"rows of {shapes[0]} shapes, {shapes[1]}: likely {_PADDING}. The cache costs keys "
        f"and writes for every row and saves little — {_PAD_FIX}, so that every epoch after "
        "the first finds every row."
    )


def _cold(
    node: str,
    epoch: int,
    hits: int,
    lookups: int,
    whole: bool,
    root: bool,
    shapes: tuple[int, str] | None = None,
) -> str:
    found = f"only {hits:,} of its" if hits else "none of its"
    batches = (
        "a shuffled DataLoader never repeats a batch — cache it per example, "
        f"g.cache({node!r}, per='example') (rows of a tensor batch; a node of raw text "
        "or of lists: map it over each item, .mapped(), and cache that); "
        if whole
        else ""
    )
    if root:  # (a tower of a two-input model reading x[1], the images augmented)
        batches += (
            "it is a root, so it receives every input of the call (model(a, b), or a dict "
            "batch) and is keyed by all of them, though it may read one: give it its own, "
            "Pick(1) >> node (from somatize import Pick); "
        )
    # padding: said first, with the row shapes seen, when the input came in several
    padding = f"; or {_PADDING} — {_PAD_FIX}" if shapes is None else ""
    lengths = (
        f"Its input came in rows of {shapes[0]} shapes this epoch, {shapes[1]}: likely "
        f"{_PADDING} — {_PAD_FIX}. Other possible causes: "
        if shapes is not None
        else "Likely causes: "
    )
    return (
        f"node {node!r} is cached, but {found} {lookups:,} lookups of epoch {epoch + 1} "
        "found what an earlier epoch stored: the cache costs keys and writes and saves "
        f"{'nothing' if not hits else 'little'}. {lengths}{batches}its input differs "
        "from epoch to epoch (random augmentation or noise before the node: memory pays "
        "only for inputs that repeat — stop caching it, or augment its output instead"
        f"{padding}); its key changed (its weights, code or declaration — a node meant to "
        "be fixed should be frozen); or the keeper dropped the entries (a MemoryKeeper "
        "or a DiskKeeper whose max_bytes is smaller than an epoch, or a gc of the DiskKeeper — "
        "keeper.gc(), somatize cache gc — in another process meanwhile: see keeper.stats()). "
        "g.explain(batch) says which part of the node's key changed."
    )


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
            tally.keepers.append((g.keeper, g.keeper.stats().evicted))
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
