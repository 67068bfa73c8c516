"""The tally's warnings (``tally.py``): a cached node's epoch gone cold, its rows padded to
each batch's longest, or its keeper bounded below an epoch's rows — each naming the node,
the known cause first, and the fix."""

from __future__ import annotations

from typing import Any

from ..keepers import MemoryKeeper

COLD = 0.1  # an epoch after the first finding fewer of a node's lookups than this is cold
# ... fewer than this, its input rows in several shapes: padded to each batch's longest
PADDED = 0.9


def evicted_note(keepers: list[tuple[Any, int]]) -> str:
    """The known cause first, when there is one: a MemoryKeeper (or a bounded DiskKeeper's
    own gcs) evicted since the fit began, being smaller than what an epoch stores."""
    for keeper, before in keepers:
        stats = keeper.stats()
        if (n := dropped(stats) - before) > 0:
            bound = f"max_bytes={keeper.max_bytes:,}"
            done = "evicted"
            if isinstance(keeper, MemoryKeeper) and keeper.policy == "epochs":
                kind = f"MemoryKeeper({bound}, policy='epochs')"
                done, fix = "evicted or refused", "raise max_bytes, or use a DiskKeeper"
            elif isinstance(keeper, MemoryKeeper):
                kind = f"MemoryKeeper({bound})"
                fix = (
                    "raise max_bytes, give it policy='epochs' (it then keeps its share of a "
                    "shuffled epoch: half of the rows for half of the room), or use a DiskKeeper"
                )
            else:  # (a DiskKeeper whose own gcs keep it under max_bytes)
                kind = f"DiskKeeper({str(keeper.path)!r}, {bound})"
                fix = "raise max_bytes (or leave it out, and run somatize cache gc between runs)"
            return (
                f"The keeper {done} {n:,} entries since this fit began: "
                f"{kind} holds less than an epoch "
                f"stores ({stats.bytes:,} bytes kept now) — {fix}. "
            )
    return ""


def dropped(stats: Any) -> int:
    """Entries a keeper evicted or (``MemoryKeeper(policy="epochs")``) refused, so far."""
    return int(stats.evicted) + int(getattr(stats, "refused", 0))


def bounded_note(node: str, epoch: int, hits: int, lookups: int, lru: bool) -> str:
    why = (
        "a keeper that holds part of an epoch keeps the rows read last, which the next "
        "epoch's misses evict before their turn — it saves less than its share"
        if lru
        else "a keeper that holds part of an epoch finds that part at most"
    )
    return (
        f"node {node!r} is cached, but only {hits:,} of its {lookups:,} lookups of epoch "
        f"{epoch + 1} found what an earlier epoch stored: a shuffled loader reads every row "
        f"once an epoch in a new order, and {why} (docs/caching.md, on a machine with "
        "little memory)"
    )


def row_shapes(layouts: Any) -> tuple[int, str] | None:
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


def padded_note(node: str, epoch: int, hits: int, lookups: int, shapes: tuple[int, str]) -> str:
    share = hits * 100 // lookups  # (rounded down: 89.6% is not said as 90%)
    return (
        f"node {node!r} is cached per example, but epoch {epoch + 1} found only {share}% of "
        f"its {lookups:,} rows ({hits:,}) stored by an earlier epoch, and its input came in "
        f"rows of {shapes[0]} shapes, {shapes[1]}: likely {_PADDING}. The cache costs keys "
        f"and writes for every row and saves little — {_PAD_FIX}, so that every epoch after "
        "the first finds every row."
    )


def cold_note(
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
