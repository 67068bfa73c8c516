"""Upkeep of a DiskKeeper: gc, unpin, discard, and the rewriting of packs (``verify`` is
in ``verifying``).

A pack never changes once written. To drop an entry (corrupt, undecodable, discarded)
or to change whose entries are pinned, the pack is *rewritten*: the entries that stay
are written as new packs (atomically, under new names), then the old file is removed
— only if it is still the very file that was read (same inode), so a concurrent
rewrite by another process never loses what that one wrote. A reader that had the old
pack open keeps reading it; one that looks later finds the new packs on relisting.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from collections.abc import Callable, Collection, Iterator

from . import loose
from .atomic import replace_with
from .locks import close_lock, open_lock
from .packs import (
    FLAG_PINNED,
    CorruptPack,
    NotRegular,
    PackIndex,
    build,
    entries,
    open_regular,
    read_index,
)
from .protocol import check_key, fail

_STALE = 3600.0  # seconds: a temp file this old belongs to no live writer
# an entry's temp file, ".<key>.<pid>-<n>.tmp" (".<key>.<random>.tmp" before): no other
# dotfile is a killed writer's (a ".bashrc" is not ours to remove)
_ENTRY_TEMP = re.compile(r"\A\.[0-9a-f]{64}\..+\.tmp\Z")

__all__ = [
    "SizeBound",
    "decodes",
    "discard",
    "gc",
    "pins_locked",
    "remove_bad",
    "rewrite",
    "unpin",
]


class SizeBound:
    """``DiskKeeper(max_bytes=)``: when a handle that writes should ``gc(max_bytes)``.

    At its first write, then each time it has written an eighth of the bound since the
    last gc: one listing per eighth, and the store passes the bound by at most that
    (and a pack) per writing process. None: never (the store grows until a gc)."""

    def __init__(self, max_bytes: int | None) -> None:
        if max_bytes is not None and (
            isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1
        ):
            raise ValueError(
                f"DiskKeeper(max_bytes={max_bytes!r}): give the most bytes the store may hold, "
                "an int of 1 or more (1 << 30 for 1 GiB), or None to let it grow until "
                "keeper.gc(n) or `somatize cache gc --max-bytes N`"
            )
        self.max_bytes = max_bytes
        self.evicted = self.evicted_bytes = 0  # what this handle's own gcs removed
        self._every = max(max_bytes // 8, 1) if max_bytes is not None else 0
        self._written = self._every  # the first write checks the store as it was found

    def wrote(self, root: str, index: PackIndex, size: int) -> None:
        """Count ``size`` bytes written to the store at ``root``; gc it when due, counting
        what that removed (``DiskKeeper.stats().evicted``)."""
        if self.max_bytes is None:
            return
        self._written += size
        if self._written < self._every:
            return
        self._written = 0
        freed, entries = gc(root, index, self.max_bytes)
        self.evicted += entries
        self.evicted_bytes += freed


def _write(index: PackIndex, items: list[tuple[str, bytes]], flags: int) -> int:
    """Write ``items`` as one pack; the bytes it adds to the store (none where a pack of
    that name, so of that content, was there already: two packs holding one pinned key
    rewrite to the same pack)."""
    if not items:
        return 0
    pack, chunks = build(items, flags)
    there = pack.name in index.packs
    path = index.path(pack.name)
    try:
        replace_with(path, chunks, durable=False)
    except OSError as e:
        raise fail("write cache pack", path, e) from e
    index.add(pack)
    return 0 if there else sum(len(c) for c in chunks)


def rewrite(
    index: PackIndex,
    root: str,
    name: str,
    *,
    drop: Collection[str] = (),
    unpin: Collection[str] = (),
    keep_only: Collection[str] | None = None,
    decode: Callable[[bytes], object] | None = None,
) -> tuple[list[str], int]:
    """Rewrite pack ``name`` without ``drop`` (and without entries that fail their
    checksum or ``decode``), moving ``unpin`` out of its pinned set; with
    ``keep_only``, only those keys stay (pinned). Returns the keys found bad and the
    bytes freed (the old size less what was written again).
    """
    path = index.path(name)
    try:
        fd, st = open_regular(path)
    except FileNotFoundError:
        index.drop([name])
        return [], 0
    except NotRegular as e:
        loose.quarantine(root, path, e.inode)
        index.drop([name])
        return [], 0
    try:
        pack = read_index(fd, name, st)
        got = entries(fd, st.st_size, pack.slots)
    except CorruptPack:
        pack, got = None, []
    except OSError as e:
        raise fail("read cache pack", path, e) from e
    finally:
        os.close(fd)
    if pack is None:
        if loose.remove_if_same(path, st.st_ino):
            index.drop([name])
        return [f"packs/{name}"], st.st_size
    bad: list[str] = []
    stay, loosen = [], []
    for key, payload in zip(pack.keys, got, strict=True):
        if payload is None or (decode is not None and not decodes(decode, payload)):
            bad.append(key)
        elif key in drop or (keep_only is not None and key not in keep_only):
            continue
        elif key in unpin:
            loosen.append((key, payload))
        else:
            stay.append((key, payload))
    if not bad and not loosen and len(stay) == len(pack.keys) and keep_only is None:
        return [], 0  # nothing to change
    flags = pack.flags | (FLAG_PINNED if keep_only is not None else 0)
    written = _write(index, stay, flags) + _write(index, loosen, flags & ~FLAG_PINNED)
    if loose.remove_if_same(path, st.st_ino):
        index.drop([name])
    return bad, st.st_size - written


def decodes(decode: Callable[[bytes], object], payload: bytes) -> bool:
    """Whether ``decode`` accepts ``payload`` (any exception: it does not)."""
    try:
        decode(payload)
    except Exception:
        return False
    return True


def remove_bad(index: PackIndex, root: str) -> list[str]:
    """Remove (or quarantine) packs whose index was unreadable; their names, as reported."""
    out = []
    for name, (inode, regular) in list(index.bad.items()):
        path = index.path(name)
        done = loose.remove_if_same(path, inode) if regular else loose.quarantine(root, path, inode)
        if done:
            del index.bad[name]
        out.append(f"packs/{name}")
    return out


def unpin(root: str, index: PackIndex, keys: list[str]) -> None:
    """``DiskKeeper.unpin_many``: markers removed, pinned packs holding a key rewritten."""
    for key in keys:
        check_key(key)
        path = f"{root}/pins/{key}"
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise fail("unpin cache entry", path, e) from e
    index.refresh(force=True)  # every pack holding a key, another process's too (rare: exact)
    by_pack: dict[str, set[str]] = {}
    for key in keys:
        for pack in index.holding(key):
            if pack.pinned:
                by_pack.setdefault(pack.name, set()).add(key)
    for name, unpinned in by_pack.items():
        rewrite(index, root, name, unpin=unpinned)


def discard(root: str, index: PackIndex, path: str, key: str) -> None:
    """``DiskKeeper.discard``: the loose file at ``path`` and every packed copy of ``key``."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        loose.quarantine(root, path, os.stat(path).st_ino)
    except OSError as e:
        raise fail("remove cache entry", path, e) from e
    index.refresh(force=True)  # every pack holding the key, another process's too (rare)
    for pack in index.holding(key):
        rewrite(index, root, pack.name, drop={key})


@contextlib.contextmanager
def pins_locked(root: str, *, exclusive: bool) -> Iterator[None]:
    """``flock`` on ``pins/.lock``: shared while ``pin`` writes its marker, exclusive while
    ``gc`` reads ``pins/`` and removes. So a pin that returned is seen by every later gc,
    and a gc under way finishes before a pin returns (its entry may be gone: gc came
    first). The kernel drops the lock with its process. Every user of a shared store
    takes it, also one who may not write the file (``locks.open_lock``). Where no lock
    can be taken (no ``fcntl``; the file can be neither made nor opened: a warning, none
    on a read-only disk), pins and gc go on without it.
    """
    try:
        import fcntl
    except ImportError:  # (Windows)
        yield
        return
    fd = open_lock(f"{root}/pins/.lock", "pins and gc's removals")
    if fd is None:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        close_lock(fd)  # (releases the lock)


def _remove(path: str) -> bool:
    """Remove a file gc chose; False if it was gone already."""
    try:
        os.unlink(path)
    except FileNotFoundError:  # removed meanwhile by another process
        return False
    except OSError as e:
        raise fail("remove cache file", path, e) from e
    return True


def _stale_temp(e: os.DirEntry[str], stale: float) -> int:
    """Remove a temp file left by a killed writer (over an hour old); its size, or 0."""
    with contextlib.suppress(FileNotFoundError):
        st = e.stat(follow_symlinks=False)
        if st.st_mtime < stale and _remove(e.path):
            return st.st_size
    return 0


def gc(root: str, index: PackIndex, max_bytes: int) -> tuple[int, int]:
    """``DiskKeeper.gc``: one listing and one stat per file; no entry is opened. Returns
    the bytes freed and the entries removed.

    Where the store is over ``max_bytes``, what to remove is chosen under the exclusive
    lock from a second listing taken there: several processes' gcs at once (a sweep's
    bounded handles, ``somatize cache gc`` during a run) each see what the one before
    them left, so together they shrink the store to ``max_bytes``, not each by the
    excess the first listing showed. (The first listing, outside the lock, says whether
    there is anything to do: a pin never waits for a gc that removes nothing.)"""
    freed, ranked = _ranked(root, index)
    if sum(size for _, size, _ in ranked) <= max_bytes:
        return freed, 0
    with pins_locked(root, exclusive=True):  # no pin lands between reading and removing
        more, ranked = _ranked(root, index)  # as another process's gc, just done, left it
        over = sum(size for _, size, _ in ranked) - max_bytes
        shrunk, entries = _shrink(root, index, ranked, over) if over > 0 else (0, 0)
        return freed + more + shrunk, entries


def _ranked(root: str, index: PackIndex) -> tuple[int, list[tuple[float, int, str]]]:
    """One listing of the store: the bytes of stale temp files removed (a killed writer's,
    over an hour old), and (mtime, size, path) of every loose entry and pack. A folder or
    FIFO where an entry should be is moved aside, as a read would; packs whose index is
    damaged are removed."""
    stale = time.time() - _STALE
    freed = 0
    ranked: list[tuple[float, int, str]] = []  # (mtime, size, path of a loose entry or pack)
    for e in loose.scan(root):
        if e.name[0] == ".":
            if _ENTRY_TEMP.match(e.name):
                freed += _stale_temp(e, stale)
        elif len(e.name) == 64:
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:  # removed meanwhile
                continue
            if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):  # (unlink: the link)
                ranked.append((st.st_mtime, st.st_size, e.path))
            else:  # a directory, FIFO, socket: moved aside, as a read would
                loose.quarantine(root, e.path, st.st_ino)
    # temp files of killed writers: packs, names, pins, and g.explain's notes
    for folder in (index.directory, f"{root}/names", f"{root}/pins", f"{root}/notes"):
        with contextlib.suppress(FileNotFoundError), os.scandir(folder) as it:
            for e in it:
                if e.name[0] == "." and e.name.endswith(".tmp"):
                    freed += _stale_temp(e, stale)
    index.refresh(force=True)
    remove_bad(index, root)
    ranked += [(st.st_mtime, st.st_size, index.path(p.name)) for p, st in index.sizes()]
    return freed, ranked


def _shrink(
    root: str, index: PackIndex, ranked: list[tuple[float, int, str]], over: int
) -> tuple[int, int]:
    """Remove the least recent unpinned entries and packs of ``ranked`` until ``over``
    bytes are gone; the bytes freed and the entries removed."""
    pins: set[str] = set()
    with contextlib.suppress(FileNotFoundError), os.scandir(f"{root}/pins") as it:
        pins = {e.name for e in it if e.name[0] != "."}
    freed = entries = 0
    for _, size, path in sorted(ranked):
        if freed >= over:
            break
        name = os.path.basename(path)
        if not name.endswith(".pack"):
            if name in pins or not _remove(path):
                continue
            entries += 1
        else:
            pack = index.packs.get(name)
            if pack is None or pack.pinned:
                continue
            keep = {k for k in pack.keys if k in pins}
            if keep:  # pinned one by one: those stay, as a pinned pack
                size = rewrite(index, root, name, keep_only=keep)[1]
            elif not _remove(path):
                index.drop([name])
                continue
            index.drop([name])
            entries += len(pack.keys) - len(keep)
        freed += size
    return freed, entries
