"""A DiskKeeper's read cache: the verified entries of whole packs, held in memory by bytes.

A shuffled epoch over per-example entries asks for a few rows of every pack, batch
after batch. When all of a store's packs fit in the cache's budget, the first read of a
pack reads it whole (one ``pread``, every entry verified) and keeps its entries; later
reads of any of its rows, in this epoch or the next, cost one dict lookup. When they do
not fit, packs are read a span at a time as before, so a store larger than the budget is
never read whole pack by pack for one row each.

A key names one value, so a kept entry stays right while its pack is gone from disk;
an entry ``discard``ed (it did not decode) is dropped with the packs that hold it, and a
pack the index forgets (removed or rewritten) is dropped with it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

__all__ = ["DEFAULT_READ_CACHE", "PackCache"]

#: The default budget of a DiskKeeper's read cache, per process: 256 MiB.
DEFAULT_READ_CACHE = 256 << 20


class PackCache:
    """Verified entries of whole packs; the oldest packs dropped past ``max_bytes``.

    Attributes:
        rows: key -> entry, for every pack kept.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.rows: dict[str, bytes] = {}
        self._packs: OrderedDict[str, tuple[Sequence[str], int]] = OrderedDict()
        self.size = 0
        self._touched = time.time()

    def add(self, name: str, keys: Sequence[str], payloads: Sequence[bytes]) -> None:
        """Keep the entries of pack ``name`` (every one verified), if they fit the budget."""
        size = sum(map(len, payloads))
        if name in self._packs or size > self.max_bytes:
            return
        self._packs[name] = (keys, size)
        self.rows.update(zip(keys, payloads))
        self.size += size
        while self.size > self.max_bytes:
            self.drop(next(iter(self._packs)))

    def drop(self, name: str) -> None:
        got = self._packs.pop(name, None)
        if got is not None:
            rows = self.rows
            for key in got[0]:
                rows.pop(key, None)
            self.size -= got[1]

    def touch(self, path: Callable[[str], str], after: float) -> None:
        """Move the mtime of every kept pack, at most once per ``after`` seconds: their
        entries are being read from memory, and gc ranks packs by mtime."""
        now = time.time()
        if now - self._touched < after:
            return
        self._touched = now
        for name in list(self._packs):  # (a copy: another thread may add meanwhile)
            with contextlib.suppress(OSError):
                os.utime(path(name))
