"""TieredKeeper: a fast keeper in front of a lasting one (a MemoryKeeper over a DiskKeeper).

A ``DiskKeeper`` verifies every entry it reads (a read and a checksum, a few µs a row);
a sweep or a federated loop in one process reads the same rows epoch after epoch. In
front of it, a ``MemoryKeeper`` serves those reads at memory speed: reads go to the
fast keeper first and fill it from the slow one; writes go to both (the slow one
first, so what the fast one holds is always on disk too). Other processes still share
the slow keeper's directory. Names, pins and ``stats()`` are the slow keeper's.

An entry the fast keeper holds was verified when it was read or written; if the file
behind it is damaged afterwards, this process keeps returning the verified bytes (the
right value for the key) until the fast keeper evicts it.

Example:
    >>> import tempfile
    >>> from somatize import DiskKeeper, MemoryKeeper
    >>> k = TieredKeeper(MemoryKeeper(max_bytes=64 << 20), DiskKeeper(tempfile.mkdtemp()))
    >>> k.put_many([("a" * 64, b"row")]); k.get_many(["a" * 64, "b" * 64])
    [b'row', None]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .protocol import Keeper, KeeperStats, check_keeper

__all__ = ["TieredKeeper"]


class TieredKeeper:
    """Reads from ``fast`` first, then ``slow`` (filling ``fast``); writes to both.

    Args:
        fast: a keeper in this process (``MemoryKeeper(max_bytes=...)``: its budget bounds
            the memory used).
        slow: the lasting, shared keeper on disk: ``DiskKeeper(path, read_cache=0)``, whose
            own read cache would hold in memory again what ``fast`` holds.

    Raises:
        TypeError: ``fast`` or ``slow`` is not a keeper (None, a class, another object).
    """

    def __init__(self, fast: Keeper, slow: Keeper) -> None:
        for where, keeper in (("fast", fast), ("slow", slow)):
            if keeper is None:  # (check_keeper lets None through: a Graph may have no keeper)
                raise TypeError(
                    f"TieredKeeper({where}=None): both tiers are keepers; e.g. "
                    "TieredKeeper(MemoryKeeper(), DiskKeeper(path)), or use the one keeper alone"
                )
            check_keeper(keeper, f"TieredKeeper({where}=...)")
        self.fast, self.slow = fast, slow

    @property
    def path(self) -> Any:
        """The slow keeper's directory, if it has one (``g.explain`` keeps its notes there)."""
        return getattr(self.slow, "path", None)

    def get(self, key: str) -> bytes | None:
        data = self.fast.get(key)
        if data is None:
            data = self.slow.get(key)
            if data is not None:
                self.fast.put(key, data)
        return data

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        out = self.fast.get_many(keys)
        missing = [i for i, data in enumerate(out) if data is None]
        if missing:
            found = self.slow.get_many([keys[i] for i in missing])
            fill = []
            for i, data in zip(missing, found):
                if data is not None:
                    out[i] = data
                    fill.append((keys[i], data))
            if fill:
                self.fast.put_many(fill)
        return out

    def put(self, key: str, data: bytes, *, pinned: bool = False) -> None:
        self.slow.put(key, data, pinned=pinned)
        self.fast.put(key, data)

    def put_many(self, items: Sequence[tuple[str, bytes]], *, pinned: bool = False) -> None:
        self.slow.put_many(items, pinned=pinned)
        self.fast.put_many(items)

    def discard(self, key: str) -> None:
        for keeper in (self.fast, self.slow):
            drop = getattr(keeper, "discard", None)
            if drop is not None:
                drop(key)

    def name(self, name: str, key: str) -> None:
        self.slow.name(name, key)

    def lookup(self, name: str) -> bytes | None:
        return self.slow.lookup(name)

    def pin(self, key: str) -> None:
        self.slow.pin(key)  # type: ignore[attr-defined]

    def unpin(self, key: str) -> None:
        unpin = getattr(self.slow, "unpin", None)
        if unpin is not None:
            unpin(key)

    def unpin_many(self, keys: Iterable[str]) -> None:
        """The slow keeper's ``unpin_many`` with every key at once (a DiskKeeper rewrites
        each pinned pack once), or its ``unpin`` one key at a time where it has none."""
        many = getattr(self.slow, "unpin_many", None)
        if many is not None:
            many(list(keys))
            return
        for key in keys:
            self.unpin(key)

    def stats(self) -> KeeperStats:
        stats: KeeperStats = self.slow.stats()  # type: ignore[attr-defined]
        return stats

    def __repr__(self) -> str:
        return f"TieredKeeper({self.fast!r}, {self.slow!r})"
