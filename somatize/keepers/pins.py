"""Unpinning a node's entries: which keys they are, as a graph's runs meet them.

A keeper stores bytes under keys and does not know which node an entry came from;
a graph does, while it runs. ``PinLog`` is the watcher a graph adds to its runs while
some node is pinned: it records the key of each hit and miss of a pinned node (a
per-item entry is reported as ``node[i]``, a per-example batch by its row keys). ``Graph.pin(node, False)`` then hands
those keys to the keeper's ``unpin``. Entries this process never met (pinned by an
earlier run) keep their pin.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

__all__ = ["PinLog", "unpin"]


class PinLog:
    """A watcher: the keys of pinned nodes' entries seen in this process, by node."""

    def __init__(self) -> None:
        self.seen: dict[str, set[str]] = {}
        self.pinned: Collection[str] = ()

    def watching(self, pinned: Collection[str]) -> PinLog:
        """This log, recording entries of the nodes in ``pinned`` from now on."""
        self.pinned = pinned
        return self

    def on_event(self, event: Any) -> None:
        node = getattr(event, "node", None)
        if type(node) is not str:
            return
        key, keys = getattr(event, "key", None), getattr(event, "keys", None)
        if type(key) is str:  # CacheHit, CacheMiss
            node = node.split("[", 1)[0]
            if node in self.pinned:
                self.seen.setdefault(node, set()).add(key)
        elif type(keys) is tuple and node in self.pinned:  # CacheRows: a batch's row keys
            self.seen.setdefault(node, set()).update(keys)

    def take(self, node: str) -> set[str]:
        """The keys recorded for ``node``, forgotten here."""
        return self.seen.pop(node, set())


def unpin(keeper: Any, keys: Collection[str]) -> None:
    """Unpin ``keys`` in ``keeper`` (all at once where it can; a keeper without
    ``unpin`` has no pins to drop)."""
    if not keys:
        return
    many = getattr(keeper, "unpin_many", None)
    if many is not None:
        many(sorted(keys))
        return
    one = getattr(keeper, "unpin", None)
    if one is not None:
        for key in sorted(keys):
            one(key)
