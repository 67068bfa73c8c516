"""Pack files: many small entries in one file, with an index, written atomically.

A pack is written once, whole (temp file, rename), and never changed; it is named by a
digest of its contents, so two processes writing the same batch write the same file.
Layout (big-endian)::

    header  "SMZP\\x02"  flags:u8  count:u32  blake3(flags, count, data, index):32
            data:32 = blake3 of the whole data section
    index   count x (key:32  offset:u64  length:u64)     sorted as written
    data    count x (blake3(payload):32  payload)        offset points at the checksum

The header's checksum covers the index, so a damaged index is seen before any entry
is trusted; each entry carries its own checksum, so one entry is read and verified
without reading the rest; and the data checksum verifies a pack read whole in one
blake3 call (blake3 hashes 64 entries at once several times faster than one by one),
falling back to the entries' own checksums if it fails, to keep the good ones. Packs
of version 1 (``"SMZP\\x01"``, no data checksum) are still read. ``FLAG_PINNED`` marks
a pack that ``gc`` keeps.

``PackIndex`` is one process's view of a ``packs/`` directory: which pack holds which
key. It rereads the directory only when it may have changed (its mtime moved, or was
too recent to trust at the last listing), and reads only the index of a new pack. It
keeps the last ``MAX_OPEN`` packs it read from open (up to 1024), so a shuffled batch, whose rows
lie in many packs, costs one ``pread`` a row rather than an open and a close; a pack
removed by another process's gc is closed at the next relisting (every read
checks the directory's mtime first, one ``stat``).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from blake3 import blake3

from ..platforms import NOFOLLOW, READ_NONBLOCK, pread

__all__ = ["FLAG_PINNED", "MAX_PACK_BYTES", "RACY_NS", "Pack", "PackIndex", "build", "open_regular"]

MAGIC_V1 = b"SMZP\x01"
HEAD_V1 = struct.Struct(">5sBI32s")
MAGIC = b"SMZP\x02"
HEAD = struct.Struct(">5sBI32s32s")
_COUNTS = struct.Struct(">BI")
SLOT = struct.Struct(">32sQQ")
CHECK = 32
FLAG_PINNED = 1
MAX_PACK_BYTES = 64 << 20  # a bigger batch is split: gc frees whole packs
# A directory's mtime this close to a listing may hide a later change in the same clock
# tick (file times come from a coarse clock, a few ms on Linux): relisting within it is
# the safe side; a change missed on a coarser filesystem costs a recomputed entry.
RACY_NS = 100_000_000
# A lookup that finds packs/ changed relists it (a scandir of every pack) only every
# max(1, packs // RELIST_SHARE)-th time, so that a handle writing a pack per batch — its
# own packs are indexed as it writes them — does not scan the whole directory per batch:
# a lookup scans about RELIST_SHARE entries, amortized, however many packs there are
# (before: every pack, every batch — quadratic over a cold epoch). A pack another process
# wrote is found that many lookups later at most; until then its entries are misses
# (recomputed), never wrong ones. A forced refresh always relists.
RELIST_SHARE = 64


def _max_open() -> int:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 64
    return 1024 if soft == resource.RLIM_INFINITY else max(16, min(1024, soft // 8))


MAX_OPEN = _max_open()  # packs kept open per keeper: an eighth of the fd limit, at most 1024
_NAME = re.compile(r"\A[0-9a-f]{40}\.pack\Z")  # as build() names a pack


class _AtInode(Exception):
    def __init__(self, inode: int) -> None:
        super().__init__(inode)
        self.inode = inode


class NotRegular(_AtInode):
    """A path that should be a regular file is a directory, FIFO, device or socket."""


class CorruptPack(_AtInode):
    """A pack's header or index does not verify."""


def open_regular(path: str, *, follow: bool = True) -> tuple[int, os.stat_result]:
    """Open ``path`` for reading without ever blocking (a FIFO would hang a plain open).

    Raises:
        FileNotFoundError: absent.
        NotRegular: something other than a regular file is there (the fd is closed).
        OSError: ``follow=False`` and ``path`` is a symbolic link (ELOOP: never opened).
    """
    fd = os.open(path, READ_NONBLOCK if follow else READ_NONBLOCK | NOFOLLOW)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegular(st.st_ino)
    return fd, st


def read_exact(fd: int, size: int, offset: int) -> bytes:
    """``size`` bytes at ``offset`` (fewer only at the end of the file)."""
    data = pread(fd, size, offset)
    if len(data) == size or not data:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = pread(fd, size - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


@dataclass(eq=False)  # compared by identity: the index holds each pack once
class Pack:
    """What a process knows of one pack file: its flags and where each entry lies."""

    name: str
    flags: int
    keys: list[str]
    slots: list[tuple[int, int]]  # (offset of the checksum, payload length), as keys
    inode: int = 0
    data_check: bytes | None = None  # blake3 of the data section (version 2)
    size: int = field(init=False, default=0)  # the bytes of its payloads

    def __post_init__(self) -> None:
        self.size = sum(n for _, n in self.slots)

    @property
    def pinned(self) -> bool:
        return bool(self.flags & FLAG_PINNED)


def build(items: Sequence[tuple[str, bytes]], flags: int) -> tuple[Pack, list[bytes]]:
    """A pack of ``items`` (keys already checked): its description and its bytes."""
    n = len(items)
    offset = HEAD.size + n * SLOT.size
    index: list[bytes] = []
    data: list[bytes] = []
    keys: list[str] = []
    slots: list[tuple[int, int]] = []
    pack_slot = SLOT.pack
    for key, payload in items:
        check = blake3(payload).digest()
        index.append(pack_slot(bytes.fromhex(key), offset, len(payload)))
        data += (check, payload)
        keys.append(key)
        slots.append((offset, len(payload)))
        offset += CHECK + len(payload)
    section = b"".join(data)
    data_check = blake3(section).digest()
    raw_index = b"".join(index)
    check = blake3(_COUNTS.pack(flags, n) + data_check + raw_index).digest()
    # the name covers the payloads' checksums too: another batch under the same keys
    # (a non-deterministic node) is another pack
    name = blake3(check + b"".join(data[0::2])).hexdigest()[:40] + ".pack"
    head = HEAD.pack(MAGIC, flags, n, check, data_check)
    return Pack(name, flags, keys, slots, data_check=data_check), [head, raw_index, section]


def read_index(fd: int, name: str, st: os.stat_result) -> Pack:
    """The index of an open pack file. Raises ``CorruptPack`` if it does not verify."""
    head = pread(fd, HEAD.size, 0)
    if head[: len(MAGIC)] == MAGIC_V1 and len(head) >= HEAD_V1.size:
        magic, flags, n, check = HEAD_V1.unpack(head[: HEAD_V1.size])
        start, data_check = HEAD_V1.size, None
    elif len(head) == HEAD.size:
        magic, flags, n, check, data_check = HEAD.unpack(head)
        start = HEAD.size
    else:
        raise CorruptPack(st.st_ino)
    size = n * SLOT.size
    if magic not in (MAGIC, MAGIC_V1) or start + size > st.st_size:
        raise CorruptPack(st.st_ino)
    raw = read_exact(fd, size, start)
    if blake3(_COUNTS.pack(flags, n) + (data_check or b"") + raw).digest() != check:
        raise CorruptPack(st.st_ino)
    keys, slots = [], []
    for key, offset, length in SLOT.iter_unpack(raw):
        keys.append(key.hex())
        slots.append((offset, length))
    return Pack(name, flags, keys, slots, st.st_ino, data_check)


def entries(fd: int, size: int, wanted: Sequence[tuple[int, int]]) -> list[bytes | None]:
    """The verified payload of each (offset, length); None where it is corrupt.

    Reads the span of the wanted entries in one call when they lie close together
    (a batch written together is read together), else one call per entry.
    """
    out: list[bytes | None] = []
    whole = None
    if len(wanted) > 1:
        span, hi = wanted, max(off + CHECK + n for off, n in wanted)
        if hi > size:  # a length past the file's end (cut, or crafted) never sizes a read
            span = [(off, n) for off, n in wanted if off + CHECK + n <= size]
            hi = max((off + CHECK + n for off, n in span), default=0)
        lo = min((off for off, _ in span), default=0)
        if len(span) > 1 and hi - lo <= 2 * sum(CHECK + n for _, n in span) + 65536:
            whole = memoryview(read_exact(fd, hi - lo, lo))
    for off, n in wanted:
        if off + CHECK + n > size:
            out.append(None)
            continue
        if whole is not None:
            view = whole[off - lo : off - lo + CHECK + n]
        else:
            view = memoryview(read_exact(fd, CHECK + n, off))
        payload = view[CHECK:]
        ok = len(view) == CHECK + n and blake3(payload).digest() == view[:CHECK]
        out.append(bytes(payload) if ok else None)
    return out


class PackIndex:
    """Which pack in ``directory`` holds which key, as far as this process has looked."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.where: dict[str, tuple[Pack, int]] = {}  # key -> (pack, slot number)
        self.packs: dict[str, Pack] = {}
        self.bytes = 0  # of the payloads in the packs indexed
        self.forget: Callable[[str], None] = lambda name: None  # told the name of each pack dropped
        self.bad: dict[str, tuple[int, bool]] = {}  # name -> (inode, regular) of unreadable
        self._seen: tuple[int, int] | None = None  # (mtime_ns, inode) of the directory
        self._listed_ns = 0
        self._deferred = 0  # relistings put off since the last one (RELIST_SHARE)
        # other packs holding a key (rewrites, a batch written twice): where it is found
        # again when the pack it is indexed in goes
        self._other: dict[str, list[tuple[Pack, int]]] = {}
        self._open: OrderedDict[str, list[Any]] = OrderedDict()  # name -> [fd, stat, touched]
        #: held while an open pack is read, so no other thread closes it meanwhile
        self.lock = threading.RLock()

    def __del__(self) -> None:
        # not contextlib.suppress: at interpreter exit, module globals may be gone
        try:  # noqa: SIM105
            self.close()
        except Exception:
            pass

    def close(self) -> None:
        """Close every pack file kept open."""
        with self.lock:
            while self._open:
                os.close(self._open.popitem()[1][0])

    def opened(self, name: str) -> list[Any]:
        """``[fd, stat, touched]`` of a pack, opened if need be (hold ``lock`` while
        reading it). Raises ``FileNotFoundError`` or ``NotRegular``."""
        got = self._open.get(name)
        if got is not None:
            self._open.move_to_end(name)
            return got
        fd, st = open_regular(self.path(name))
        got = self._open[name] = [fd, st, st.st_mtime]
        while len(self._open) > MAX_OPEN:
            os.close(self._open.popitem(last=False)[1][0])
        return got

    def path(self, name: str) -> str:
        return f"{self.directory}/{name}"

    def add(self, pack: Pack) -> None:
        """Index a pack (one this process wrote, or found): its entries win over older ones."""
        with self.lock:
            old_pack = self.packs.get(pack.name)
            if old_pack is not None and old_pack is not pack:
                self.forget(pack.name)
            self.bytes += pack.size - (old_pack.size if old_pack is not None else 0)
            self.packs[pack.name] = pack
            where = self.where
            for i, key in enumerate(pack.keys):
                old = where.get(key)
                if old is not None and old[0] is not pack:  # remembered, in case this goes
                    self._other.setdefault(key, []).append(old)
                where[key] = (pack, i)

    def holding(self, key: str) -> list[Pack]:
        """Every indexed pack that holds ``key`` (usually one)."""
        with self.lock:
            loc = self.where.get(key)
            if loc is None:
                return []
            out = [loc[0]]
            for other, _ in self._other.get(key, ()):
                if self.packs.get(other.name) is other and other not in out:
                    out.append(other)
            return out

    def drop(self, names: Sequence[str]) -> None:
        """Forget packs (removed, or rewritten); keys also held elsewhere stay indexed."""
        with self.lock:
            for name in names:
                held = self._open.pop(name, None)
                if held is not None:
                    os.close(held[0])
            for name in names:
                self.forget(name)
            gone = [self.packs.pop(n) for n in names if n in self.packs]
            if not gone:
                return
            self.bytes -= sum(p.size for p in gone)
            where, other = self.where, self._other
            for p in gone:
                for key in p.keys:
                    if where.get(key, (None,))[0] is not p:  # elsewhere, or dropped just now
                        continue
                    del where[key]
                    alternatives = other.pop(key, [])
                    while alternatives:  # another copy, still indexed?
                        loc = alternatives.pop()
                        if self.packs.get(loc[0].name) is loc[0]:
                            where[key] = loc
                            if alternatives:
                                other[key] = alternatives
                            break

    def refresh(self, force: bool = False) -> bool:
        """Read packs added by other processes, forget removed ones; True if any changed.
        Unless ``force``, a large directory is relisted only every so many calls
        (``RELIST_SHARE``)."""
        with self.lock:
            return self._refresh(force)

    def _refresh(self, force: bool) -> bool:
        try:
            st = os.stat(self.directory)
        except FileNotFoundError:
            changed = bool(self.packs)
            self.drop(list(self.packs))
            return changed
        seen = (st.st_mtime_ns, st.st_ino)
        if not force and seen == self._seen and self._listed_ns - st.st_mtime_ns > RACY_NS:
            return False
        if not force and self._deferred < len(self.packs) // RELIST_SHARE:
            self._deferred += 1
            return False
        self._deferred = 0
        listed_ns = time.time_ns()
        names = set()
        with os.scandir(self.directory) as it:
            for e in it:
                if _NAME.match(e.name):  # (another file is not a pack: never read nor removed)
                    names.add(e.name)
        gone = [n for n in self.packs if n not in names]
        self.drop(gone)
        for name in list(self.bad):
            if name not in names:
                del self.bad[name]
        new = [n for n in names if n not in self.packs and n not in self.bad]
        for name in sorted(new):
            self.load(name)
        # Only now: a listing whose packs were not all read (an error above) is read again
        # at the next refresh, instead of its new packs staying unseen until packs/ changes.
        self._seen, self._listed_ns = seen, listed_ns
        return bool(gone or new)

    def load(self, name: str) -> Pack | None:
        """Read one pack's index and add it; an unreadable pack is recorded in ``bad``."""
        try:
            fd, st = open_regular(self.path(name))
        except FileNotFoundError:
            return None
        except NotRegular as e:
            self.bad[name] = (e.inode, False)
            return None
        try:
            pack = read_index(fd, name, st)
        except CorruptPack as e:
            self.bad[name] = (e.inode, True)
            return None
        finally:
            os.close(fd)
        self.add(pack)
        return pack

    def sizes(self) -> Iterator[tuple[Pack, os.stat_result]]:
        """Each indexed pack with its file's stat (packs removed meanwhile are skipped)."""
        for pack in list(self.packs.values()):
            with contextlib.suppress(FileNotFoundError):
                yield pack, os.stat(self.path(pack.name))
