"""DiskKeeper: a content store on disk, shared by several processes at once.

Layout under the store's directory::

    objects/ab/<key>     one entry per file (single ``put``): checksummed header, bytes
    packs/<digest>.pack  many entries per file (``put_many``): an index, each entry
                         checksummed (see ``somatize.keepers.packs``)
    names/<name>         a key, as text
    pins/<key>           an empty marker: ``gc`` keeps this entry
    quarantine/          what was found where an entry should be and was not a file

Every file appears whole or not at all (temp file, rename), so a process killed at any
instant leaves the old state or the new one; every read is verified, so a torn or
altered entry (after a power failure: entries are not fsynced) is a miss, never
returned. Processes append packs and loose files; a reader finds what others wrote by
relisting ``packs/`` when it changed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import KeeperError
from . import listing, loose, upkeep, verifying
from .atomic import replace_with
from .packread import read_packed
from .packs import (
    FLAG_PINNED,
    MAX_PACK_BYTES,
    RACY_NS,
    NotRegular,
    PackIndex,
    build,
    open_regular,
)
from .protocol import KeeperStats, as_bytes, check_key, check_name, fail, is_key, is_name, not_bytes
from .readcache import DEFAULT_READ_CACHE, PackCache
from .verifying import Removed

__all__ = ["DiskKeeper"]


def _reopen(path: Path, read_cache: int, max_bytes: int | None = None) -> DiskKeeper:
    return DiskKeeper(path, read_cache=read_cache, max_bytes=max_bytes)


class DiskKeeper:
    """A content store on disk, safe for several processes at once.

    Single ``put``s write one file per entry; ``put_many`` writes a batch as one pack
    file (one write and one rename for the whole batch) and ``get_many`` reads
    a batch through an in-memory index of the packs: one ``pread`` per run of nearby
    rows, from packs kept open. ``get`` and ``get_many`` see both kinds. While every
    pack fits in ``read_cache`` bytes, a pack is read whole and its verified entries are
    kept in memory, so the epochs after the first read no file at all.

    A key names one value (it is a recipe's digest). Writing other bytes under a stored
    key replaces them for ``get`` when both are loose files; where a loose copy and a
    packed copy differ, ``get`` prefers the loose one and ``get_many`` the packed one.

    Args:
        path: the store's directory.
        create: make the directory and its layout if missing (default). With
            ``create=False`` nothing is created, and a directory that is not a store
            raises ``KeeperError`` — for tools that only look.
        read_cache: bytes of verified pack entries kept in this process (default
            256 MiB; 0 turns it off). Packs this handle writes are kept too.
        max_bytes: keep the store near this size: a handle that writes runs
            ``gc(max_bytes)`` at its first write and after each eighth of it written, so the
            least recently used unpinned entries go (``stats().evicted`` counts them).
            None (default): it grows until a gc.

    Raises:
        KeeperError: the layout cannot be created, or (``create=False``) ``path`` is
            not a store, or one of its folders is a symbolic link (with
            ``create=False``: ``objects/ab`` too; gc and verify never follow one).

    Example:
        >>> import tempfile
        >>> k = DiskKeeper(tempfile.mkdtemp())
        >>> k.put("a" * 64, b"xyz"); k.get("a" * 64)
        b'xyz'
        >>> k.put_many([("b" * 64, b"row 1"), ("c" * 64, b"row 2")])
        >>> k.get_many(["c" * 64, "d" * 64, "b" * 64])
        [b'row 2', None, b'row 1']
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        read_cache: int = DEFAULT_READ_CACHE,
        max_bytes: int | None = None,
    ) -> None:
        self._bound = upkeep.SizeBound(max_bytes)
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(
                f"DiskKeeper({path!r:.60}): the cache directory is a path (a str or a "
                f"pathlib.Path), got {type(path).__qualname__}; e.g. "
                "DiskKeeper('.somatize-cache')"
            )
        if not os.fspath(path):
            raise ValueError(
                "DiskKeeper(''): the cache directory is an empty path, which would fill the "
                "current directory with objects/, packs/, names/ ...; give a directory, e.g. "
                "DiskKeeper('.somatize-cache') (an unset environment variable gives '')"
            )
        self.path = Path(path)
        self._root = os.fspath(self.path)
        if create:
            for sub in ("objects", "names", "pins", "packs"):
                try:
                    os.makedirs(f"{self._root}/{sub}", exist_ok=True)
                except OSError as e:
                    raise fail("create the cache directory", f"{self._root}/{sub}", e) from e
        elif not os.path.isdir(f"{self._root}/objects"):
            what = (
                "the directory does not exist"
                if not os.path.exists(self._root)
                else "it is not a cache (it has no objects/, which every DiskKeeper writes)"
            )
            raise KeeperError(
                f"no cache at {self._root}: {what}; give the directory a DiskKeeper wrote "
                "(for the somatize command: --dir or $SOMATIZE_CACHE)"
            )
        listing.refuse_links(self._root, deep=not create)
        self._index = PackIndex(f"{self._root}/packs")
        self._cache = PackCache(read_cache)
        self._index.forget = self._cache.drop  # a pack the index drops leaves the cache
        self._folders: tuple[int, int, frozenset[str]] = (0, 0, frozenset())

    max_bytes = property(lambda self: self._bound.max_bytes, doc="The bound (None: none).")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen, (self.path, self._cache.max_bytes, self._bound.max_bytes))

    def _object(self, key: str) -> str:
        check_key(key)
        return f"{self._root}/objects/{key[:2]}/{key}"

    # -- reading ------------------------------------------------------------------------

    def _get_loose(self, key: str) -> bytes | None:
        path = self._object(key)
        try:
            payload, inode = loose.read(path)
        except loose.Hostile as e:
            loose.quarantine(self._root, path, e.inode)
            return None
        except OSError as e:
            raise fail("read cache entry", path, e) from e
        if payload is None and inode:
            loose.remove_if_same(path, inode)  # corrupt: recomputed and written afresh
        return payload

    def get(self, key: str) -> bytes | None:
        payload = self._get_loose(key)
        if payload is None:
            self._index.refresh()  # one stat of packs/, unless another process wrote
            if key in self._index.where:
                payload = self._read_packed([key])[0]
        return payload

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if keys and set(map(type, keys)) != {str}:  # (at C speed: a batch's rows every step)
            for key in keys:  # a KeeperError naming it, as get's (not a bare TypeError)
                check_key(key)
        self._index.refresh()  # packs others wrote or removed: one stat of packs/ if none
        out = self._read_packed(keys)
        missing = [i for i, got in enumerate(out) if got is None]
        if missing:
            folders = self._fanout()
            for i in missing:
                key = keys[i]
                if key[:2] in folders:
                    out[i] = self._get_loose(key)
                else:
                    check_key(key)
        return out

    def _fanout(self) -> frozenset[str]:
        """The folders of ``objects/`` (a miss in a folder that does not exist costs no
        open), relisted only when ``objects/`` may have changed, as ``packs/`` is."""
        try:
            st = os.stat(f"{self._root}/objects")
        except FileNotFoundError:
            return frozenset()
        seen, listed_ns, folders = self._folders
        if st.st_mtime_ns == seen and listed_ns - st.st_mtime_ns > RACY_NS:
            return folders
        now = time.time_ns()
        with os.scandir(f"{self._root}/objects") as it:
            folders = frozenset(e.name for e in it if len(e.name) == 2)
        self._folders = (st.st_mtime_ns, now, folders)
        return folders

    def _read_packed(self, keys: Sequence[str]) -> list[bytes | None]:
        return read_packed(self._index, self._cache, self._root, keys)

    def lookup(self, name: str) -> bytes | None:
        check_name(name)
        key = self._read_small(f"{self._root}/names/{name}")
        if key is None or not is_key(key):
            return None
        found = self.get(key)
        if found is None and key not in self._index.where:  # named, so stored: look again
            self._index.refresh(force=True)  # (a pack another process wrote, not listed yet)
            found = self.get(key)
        return found

    @staticmethod
    def _read_small(path: str) -> str | None:
        """A small text file's content; None if absent or not a regular file."""
        try:
            fd, _ = open_regular(path)
        except (FileNotFoundError, NotRegular):
            return None
        try:
            return os.read(fd, 4096).decode("ascii", "replace").strip()
        finally:
            os.close(fd)

    # -- writing ------------------------------------------------------------------------

    def put(self, key: str, data: bytes, *, pinned: bool = False) -> None:
        path = self._object(key)
        if pinned:
            self.pin(key)  # first: gc never sees the new entry unpinned
        try:
            data = as_bytes(data)  # (a bytearray or memoryview: copied, its length its size)
            replace_with(path, [loose.header(data), data], durable=False)
        except OSError as e:
            raise fail("write cache entry", path, e) from e
        except TypeError as e:  # data is not bytes (asked only now: a put of bytes pays nothing)
            raise not_bytes(self, [(key, data)], e) from e
        self._bound.wrote(self._root, self._index, len(data))

    def put_many(self, items: Sequence[tuple[str, bytes]], *, pinned: bool = False) -> None:
        """Store a batch as pack files (one per 64 MiB), each written atomically.

        Raises:
            KeeperError: the pack could not be written (the cause chained); nothing
                already stored is touched.
        """
        latest = {}
        for key, data in items:
            check_key(key)
            latest[key] = data  # the last of repeated keys wins
        batch: list[tuple[str, bytes]] = []
        size = 0
        try:
            for key, data in latest.items():
                if type(data) is not bytes:  # a copy: its length its size, the caller's own
                    latest[key] = as_bytes(data)  # buffer never in the read cache
            for item in latest.items():
                if batch and size + len(item[1]) > MAX_PACK_BYTES:
                    self._write_pack(batch, pinned)
                    batch, size = [], 0
                batch.append(item)
                size += len(item[1])
            if batch:
                self._write_pack(batch, pinned)
        except TypeError as e:  # a value is not bytes (asked only now)
            raise not_bytes(self, latest.items(), e, "put_many") from e
        self._bound.wrote(self._root, self._index, sum(len(d) for d in latest.values()))

    def _write_pack(self, items: Sequence[tuple[str, bytes]], pinned: bool) -> None:
        pack, chunks = build(items, FLAG_PINNED if pinned else 0)
        path = self._index.path(pack.name)
        try:
            replace_with(path, chunks, durable=False)
        except OSError as e:
            raise fail("write cache pack", path, e) from e
        self._index.add(pack)
        if self._cache.max_bytes:
            with self._index.lock:
                self._cache.add(pack.name, pack.keys, [data for _, data in items])

    def _marker(self, what: str, path: str, content: bytes) -> None:
        try:
            replace_with(path, [content])
        except OSError as e:
            raise fail(what, path, e) from e

    def name(self, name: str, key: str) -> None:
        check_name(name)
        check_key(key)
        self._marker("record cache name", f"{self._root}/names/{name}", key.encode())

    def pin(self, key: str) -> None:
        """Keep ``key`` through ``gc``."""
        check_key(key)
        with upkeep.pins_locked(self._root, exclusive=False):  # not inside a gc's removals
            self._marker("pin cache entry", f"{self._root}/pins/{key}", b"")

    def unpin(self, key: str) -> None:
        """Let ``gc`` remove ``key`` again (its marker goes; a pinned pack is rewritten)."""
        self.unpin_many([key])

    def unpin_many(self, keys: Iterable[str]) -> None:
        """``unpin`` for many keys: each pinned pack holding some is rewritten once."""
        upkeep.unpin(self._root, self._index, list(keys))

    def discard(self, key: str) -> None:
        """Forget ``key`` (its bytes verified but did not decode): it is recomputed.

        Raises:
            KeeperError: a file could not be removed or a pack rewritten.
        """
        with self._index.lock:
            for pack in self._index.holding(key):
                self._cache.drop(pack.name)
            self._cache.rows.pop(key, None)
        upkeep.discard(self._root, self._index, self._object(key), key)

    # -- listing (listing.py) -----------------------------------------------------------

    def _markers(self, sub: str) -> list[str]:
        return listing.markers(self._root, sub)

    def names(self) -> dict[str, str]:
        """Every recorded name and the key it points to (a file in ``names/`` that is no
        name ``name`` writes, or holds no key, is not one: ``cache ls`` prints these)."""
        out = {}
        for name in sorted(self._markers("names")):
            key = self._read_small(f"{self._root}/names/{name}") if is_name(name) else None
            if key is not None and is_key(key):
                out[name] = key
        return out

    def keys(self) -> Iterator[str]:
        """The keys of every entry, sorted (temp files excluded)."""
        return listing.keys(self._root, self._index)

    def sizes(self) -> Iterator[tuple[str, int]]:
        """Every entry's key and the bytes it takes, sorted by key: a loose entry's file
        size, or a packed entry's payload with its checksum and index slot."""
        return listing.sizes(self._root, self._index)

    def stats(self) -> KeeperStats:
        """Counts read from one listing: a stat per loose entry, a stat per pack; and
        ``evicted``: what this handle's ``max_bytes`` removed since it was made."""
        found = listing.stats(self._root, self._index)
        bound = self._bound
        return replace(found, evicted=bound.evicted, evicted_bytes=bound.evicted_bytes)

    def __repr__(self) -> str:
        return f"DiskKeeper({self._root!r})"

    # -- verify and gc ----------------------------------------------------------------

    def verify(self, decode: Callable[[bytes], object] | None = None) -> Removed:
        """Check every entry; remove the bad ones and return their keys.

        Bad: a checksum that fails (torn, truncated, altered), something other than a
        regular file where an entry should be (moved to ``quarantine/``), or, given
        ``decode``, a payload it raises on. A pack is checked entry by entry and
        rewritten without its bad entries; a pack whose index is damaged is removed
        with all its entries and reported as ``packs/<name>``. The list's ``entries``
        counts the entries lost (such a pack's as its header says).
        """
        return verifying.verify(self._root, self._index, decode)

    def gc(self, max_bytes: int) -> int:
        """Remove the least recently used unpinned entries until at most ``max_bytes``
        remain; returns the bytes freed.

        Loose entries and packs are ranked together by mtime (a hit refreshes it, at
        most once a minute). A loose entry goes as one file. A pack goes whole: an
        unpinned pack is removed, or — when some of its entries carry a pin marker —
        rewritten as a pinned pack of just those; a pinned pack stays. Temp files over
        an hour old (left by killed writers) and packs whose index is damaged go too.
        One listing and one stat per file (a second listing, under the lock, where it
        removes: gcs run at once by several processes shrink the store to ``max_bytes``
        together): no entry is opened.

        Raises:
            ValueError: ``max_bytes`` is not an int of 0 or more (``-5`` would empty it).
            KeeperError: a file could not be removed (read-only disk); what was
                removed before stays removed, nothing else is touched.
        """
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(
                f"DiskKeeper.gc(max_bytes={max_bytes!r}): give the size to shrink to, an int "
                "of 0 or more (0 removes every entry not pinned)"
            )
        return upkeep.gc(self._root, self._index, max_bytes)[0]
