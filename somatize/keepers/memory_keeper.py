"""MemoryKeeper: entries in this process, bounded by bytes, least recently used evicted —
or, with ``policy="epochs"``, kept while they are still read (a shuffled loader's epochs)."""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from .protocol import KeeperStats, as_bytes, check_key, check_name, not_bytes

__all__ = ["DEFAULT_MAX_BYTES", "MemoryKeeper"]

#: The default budget: 1 GiB. Large enough for the features of a typical frozen
#: backbone over a dataset that fits in RAM, small enough that a long run on a
#: laptop cannot grow without bound; past it, entries are evicted and counted.
DEFAULT_MAX_BYTES = 1 << 30

# policy="epochs": the keeper is cold after twice as many lookups as it holds entries (at
# least this many) without a hit — more than the misses in a row of an epoch read in the
# order of the one before (shuffle=False, or a sweep's fits replaying one order)
_COLD = 64
_STALE = 1.5  # ... and an entry unread for this many times the longest gap seen is stale


class MemoryKeeper:
    """Entries kept in this process, bounded by bytes; least recently used evicted first.

    ``get`` and ``put`` cost O(1) whatever the number of entries: unpinned entries sit
    in one recency-ordered dict, pinned ones in another, and eviction pops from the
    old end. What was evicted is counted in ``stats()`` (``evicted``, ``evicted_bytes``).

    A keeper smaller than what a shuffled loader's epoch stores keeps, under least recently
    used eviction, the rows the epoch read last — which the next epoch's misses evict
    before their turn (half an epoch's room finds about 15% of a warm epoch).
    ``policy="epochs"`` keeps its entries while they are still read instead: once full, a
    new entry replaces the least recently used one only when that one is *stale* — unread
    for 1.5 times the longest gap yet seen between two reads of an entry (the rows of
    weights since changed, of a finished run) — or when the keeper is *cold* (nothing
    found in twice as many lookups as it holds entries: a new key set, as a sweep's next
    backbone); otherwise the new entry is not kept (counted in ``stats().refused``). Half
    an epoch's room then finds half of every warm epoch, shuffled or not. Least recently used suits access whose favourites
    drift (a service's queries); ``"epochs"`` suits data read over and over in any order.

    Args:
        max_bytes: the most bytes kept (default 1 GiB). Pinned entries are never
            evicted, so they may hold more than this on their own.
        policy: ``"lru"`` (the default) or ``"epochs"``, as above.

    Raises:
        ValueError: ``max_bytes`` is not an int of 1 or more, or ``policy`` is neither.

    Example:
        >>> k = MemoryKeeper(max_bytes=1 << 20)
        >>> k.put("0" * 64, b"abc"); k.get("0" * 64)
        b'abc'
    """

    def __init__(
        self, max_bytes: int = DEFAULT_MAX_BYTES, *, policy: Literal["lru", "epochs"] = "lru"
    ) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(
                f"MemoryKeeper(max_bytes={max_bytes!r}): give the most bytes to keep, an int of "
                "1 or more (e.g. 1 << 30 for 1 GiB); a keeper that keeps nothing would make "
                "every cached node a miss: leave the graph without a keeper instead"
            )
        if policy not in ("lru", "epochs"):
            raise ValueError(
                f"MemoryKeeper(policy={policy!r}): give 'lru' (least recently used evicted) "
                "or 'epochs' (entries kept while still read: data read every epoch in a "
                "shuffled order)"
            )
        self.max_bytes = max_bytes
        self.policy = policy
        # policy="epochs": lookups so far (the clock), each unpinned entry's last read (or
        # store) on it, the last lookup that found one, the longest gap between two reads
        self._epochs = policy == "epochs"
        self._clock = 0
        self._used: dict[str, int] = {}
        self._last_hit = 0  # (a new keeper keeps what comes first, until it is cold)
        self._longest = 0
        self._refused = 0
        self._lru: OrderedDict[str, bytes] = OrderedDict()  # unpinned, oldest first
        self._held: dict[str, bytes] = {}  # pinned entries
        self._pins: set[str] = set()  # pinned keys, stored or not yet
        self._names: dict[str, str] = {}
        self._size = 0
        self._evicted = 0
        self._evicted_bytes = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- reading ------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        with self._lock:
            data = self._lru.get(key)
            if self._epochs:
                self._clock += 1
                if data is not None:
                    self._read((key,))
            if data is not None:
                self._lru.move_to_end(key)
                return data
            return self._held.get(key)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        # (no Python loop per key where all are found: a warm batch of per-example rows)
        with self._lock:
            lru = self._lru
            out: list[bytes | None] = list(map(lru.get, keys))
            if self._epochs:
                self._clock += len(keys)
                found = list(filter(lru.__contains__, keys))
                if found:
                    self._read(found)
                deque(map(lru.move_to_end, found), maxlen=0)
            else:
                deque(map(lru.move_to_end, filter(lru.__contains__, keys)), maxlen=0)
            if None in out:  # pinned entries, and misses
                held = self._held
                out = [held.get(k) if d is None else d for k, d in zip(keys, out)]
        return out

    def _read(self, found: Sequence[str]) -> None:
        """policy="epochs": entries found now, read on the clock (the gaps since their last
        reads measured: the longest tells a live entry from a stale one)."""
        used, now = self._used, self._clock
        self._longest = max(self._longest, now - min(map(used.__getitem__, found)))
        used.update(dict.fromkeys(found, now))
        self._last_hit = now

    def _admits(self, key: str, size: int) -> bool:
        """policy="epochs": whether a new entry of ``size`` bytes is kept, the stale (or, the
        keeper cold, the least recently used) entries it needs the room of evicted."""
        if key in self._lru or key in self._held or key in self._pins:
            return True  # (a new value for a key kept, or a pinned one: stored as asked)
        lru, used, now = self._lru, self._used, self._clock
        cold = now - self._last_hit > max(2 * len(lru), _COLD)
        while self._size + size > self.max_bytes and lru:
            oldest = next(iter(lru))
            if not cold and not (self._longest and now - used[oldest] > _STALE * self._longest):
                self._refused += 1
                return False
            self._drop(oldest)
        return self._size + size <= self.max_bytes or not lru

    def _drop(self, key: str) -> None:
        data = self._lru.pop(key)
        self._used.pop(key, None)
        self._size -= len(data)
        self._evicted += 1
        self._evicted_bytes += len(data)

    def lookup(self, name: str) -> bytes | None:
        key = self._names.get(name)
        return self.get(key) if key is not None else None

    # -- writing ------------------------------------------------------------------------

    def _store(self, key: str, data: bytes, pinned: bool, method: str = "put") -> None:
        if type(data) is not bytes:  # bytes are shared as they are
            try:  # a copy of a buffer (bytearray, memoryview); never bytes(3) or bytes([1, 2])
                data = as_bytes(data)
            except TypeError as e:  # (the old entry, if any, kept)
                raise not_bytes(self, [(key, data)], e, method) from e
        old = self._lru.pop(key, None)
        if old is None:
            old = self._held.pop(key, None)
        if old is not None:
            self._size -= len(old)
        if pinned:
            self._pins.add(key)
        if key in self._pins:
            self._held[key] = data
        else:
            self._lru[key] = data
            if self._epochs:
                self._used[key] = self._clock
        self._size += len(data)

    def put(self, key: str, data: bytes, *, pinned: bool = False) -> None:
        check_key(key)
        with self._lock:
            if self._epochs and not pinned and not self._admits(key, len(data)):
                return
            self._store(key, data, pinned)
            self._evict(self.max_bytes)

    def put_many(self, items: Sequence[tuple[str, bytes]], *, pinned: bool = False) -> None:
        for key, _ in items:
            check_key(key)
        with self._lock:
            for key, data in items:
                if self._epochs and not pinned and not self._admits(key, len(data)):
                    continue
                self._store(key, data, pinned, "put_many")
            self._evict(self.max_bytes)

    def _evict(self, max_bytes: int) -> int:
        freed = 0
        lru = self._lru
        while self._size > max_bytes and lru:
            key, data = lru.popitem(last=False)
            self._used.pop(key, None)
            self._size -= len(data)
            freed += len(data)
            self._evicted += 1
            self._evicted_bytes += len(data)
        return freed

    def discard(self, key: str) -> None:
        """Forget ``key`` (its bytes did not decode): the next run recomputes it."""
        with self._lock:
            data = self._lru.pop(key, None)
            self._used.pop(key, None)
            if data is None:
                data = self._held.pop(key, None)
            if data is not None:
                self._size -= len(data)

    def name(self, name: str, key: str) -> None:
        check_name(name)
        with self._lock:
            self._names[name] = key

    def pin(self, key: str) -> None:
        """Keep ``key`` through eviction and ``gc`` (also if it is stored later)."""
        with self._lock:
            self._pins.add(key)
            data = self._lru.pop(key, None)
            self._used.pop(key, None)
            if data is not None:
                self._held[key] = data

    def unpin(self, key: str) -> None:
        """Let ``key`` be evicted again (as the most recently used entry)."""
        self.unpin_many((key,))

    def unpin_many(self, keys: Iterable[str]) -> None:
        """``unpin`` for many keys at once."""
        with self._lock:
            for key in keys:
                self._pins.discard(key)
                data = self._held.pop(key, None)
                if data is not None:
                    self._lru[key] = data
                    if self._epochs:
                        self._used[key] = self._clock
            self._evict(self.max_bytes)

    def gc(self, max_bytes: int) -> int:
        """Evict unpinned entries until at most ``max_bytes`` remain; returns bytes freed."""
        with self._lock:
            return self._evict(max_bytes)

    # -- counting -----------------------------------------------------------------------

    def stats(self) -> KeeperStats:
        with self._lock:
            return KeeperStats(
                entries=len(self._lru) + len(self._held),
                bytes=self._size,
                pinned=len(self._held),
                names=len(self._names),
                evicted=self._evicted,
                evicted_bytes=self._evicted_bytes,
                refused=self._refused,
            )

    def keys(self) -> list[str]:
        """The keys stored: unpinned ones least recently used first, then pinned ones."""
        with self._lock:
            return [*self._lru, *self._held]

    def __contains__(self, key: str) -> bool:
        return key in self._lru or key in self._held

    def __len__(self) -> int:
        return len(self._lru) + len(self._held)

    def __repr__(self) -> str:
        policy = ", policy='epochs'" if self._epochs else ""
        return f"MemoryKeeper(max_bytes={self.max_bytes}{policy})"
