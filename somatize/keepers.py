"""Keepers: where cached outputs live, as encoded bytes under content keys.

A keeper stores bytes, never live objects, so nothing another node does can
change a remembered value. Two stock keepers:

* ``MemoryKeeper(max_bytes)`` — in this process, least-recently-used entries evicted.
* ``DiskKeeper(path)`` — a content store shared by processes: atomic writes (temp
  file in the same directory, fsync, ``os.replace``, fsync of the directory), a
  checksum verified on every read (a corrupt entry is a miss, never returned),
  ``stats()``, ``verify()``, ``gc(max_bytes)`` that keeps pinned entries, names.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol, runtime_checkable

from blake3 import blake3

from .errors import KeeperError

__all__ = ["DiskKeeper", "Keeper", "KeeperStats", "MemoryKeeper"]

_KEY = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,200}$")


@runtime_checkable
class Keeper(Protocol):
    """The shape of a keeper: bytes in, bytes out, under 64-hex-digit keys."""

    def get(self, key: str) -> bytes | None:
        """The bytes stored under ``key``, or None (absent or corrupt)."""
        ...

    def put(self, key: str, data: bytes, *, pinned: bool = False) -> None:
        """Store ``data`` under ``key``; ``pinned`` entries survive ``gc``."""
        ...

    def name(self, name: str, key: str) -> None:
        """Record ``name`` as a human handle for ``key``."""
        ...

    def lookup(self, name: str) -> bytes | None:
        """The bytes of the entry last recorded under ``name``, or None."""
        ...


@dataclass(frozen=True)
class KeeperStats:
    """Counts of a keeper: entries, bytes, pinned entries, names."""

    entries: int
    bytes: int
    pinned: int
    names: int

    def __str__(self) -> str:
        return (
            f"{self.entries} entries, {self.bytes} bytes, {self.pinned} pinned, {self.names} names"
        )


def _check_key(key: str) -> None:
    if not _KEY.match(key):
        raise KeeperError(
            f"invalid key {key!r}: keys are 64 lowercase hex digits (a blake3 digest)"
        )


def _check_name(name: str) -> None:
    if not _NAME.match(name):
        raise KeeperError(
            f"invalid name {name!r}: use letters, digits, '.', '_' or '-' (at most 200)"
        )


class MemoryKeeper:
    """Entries kept in this process, bounded by bytes; least recently used evicted first.

    Args:
        max_bytes: the most bytes kept (pinned entries are never evicted).

    Example:
        >>> k = MemoryKeeper(max_bytes=1 << 20)
        >>> k.put("0" * 64, b"abc"); k.get("0" * 64)
        b'abc'
    """

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._pinned: set[str] = set()
        self._names: dict[str, str] = {}
        self._size = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        with self._lock:
            data = self._entries.get(key)
            if data is not None:
                self._entries.move_to_end(key)
            return data

    def put(self, key: str, data: bytes, *, pinned: bool = False) -> None:
        _check_key(key)
        with self._lock:
            old = self._entries.pop(key, None)
            self._size -= len(old) if old is not None else 0
            self._entries[key] = bytes(data)
            self._size += len(data)
            if pinned:
                self._pinned.add(key)
            self._evict(self.max_bytes)

    def _evict(self, max_bytes: int) -> None:
        for key in list(self._entries):
            if self._size <= max_bytes:
                break
            if key not in self._pinned:
                self._size -= len(self._entries.pop(key))

    def name(self, name: str, key: str) -> None:
        _check_name(name)
        with self._lock:
            self._names[name] = key

    def lookup(self, name: str) -> bytes | None:
        key = self._names.get(name)
        return self.get(key) if key is not None else None

    def pin(self, key: str) -> None:
        with self._lock:
            self._pinned.add(key)

    def gc(self, max_bytes: int) -> int:
        """Evict unpinned entries until at most ``max_bytes`` remain; returns bytes freed."""
        with self._lock:
            before = self._size
            self._evict(max_bytes)
            return before - self._size

    def stats(self) -> KeeperStats:
        with self._lock:
            return KeeperStats(
                len(self._entries),
                self._size,
                len(self._pinned & set(self._entries)),
                len(self._names),
            )

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)


_MAGIC = b"SMZK\x01"
_HEADER = struct.Struct(">5s32sQ")  # magic, blake3 of the payload, payload length


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A file to write that appears at ``path`` whole, or not at all.

    Writes go to a temp file in the same directory; on success it is fsynced,
    renamed over ``path`` (``os.replace``), and the directory is fsynced so the
    rename itself survives a crash. On an exception the temp file is removed.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write(path: Path, data: bytes | memoryview | list[bytes | memoryview]) -> None:
    """Write ``path`` so that a reader sees the old file or the new one, never a torn one."""
    with atomic_file(path) as f:
        for chunk in data if isinstance(data, list) else [data]:
            f.write(chunk)


def fsync_dir(directory: Path) -> None:
    """fsync a directory so renames inside it are durable (a no-op where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class DiskKeeper:
    """A content store on disk, safe for several processes at once.

    Layout under ``path``: ``objects/ab/<key>`` (a header with a checksum, then the
    payload), ``names/<name>`` (a key), ``pins/<key>`` (an empty marker).

    Args:
        path: the store's directory; created if missing.

    Example:
        >>> import tempfile
        >>> k = DiskKeeper(tempfile.mkdtemp())
        >>> k.put("a" * 64, b"xyz"); k.get("a" * 64)
        b'xyz'
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        for sub in ("objects", "names", "pins"):
            (self.path / sub).mkdir(parents=True, exist_ok=True)

    def _object(self, key: str) -> Path:
        _check_key(key)
        return self.path / "objects" / key[:2] / key

    def _read(self, file: Path) -> tuple[bytes | None, int]:
        """The verified payload of an object file (None if absent, torn or corrupt), and the
        inode that was read (0 if the file was absent)."""
        try:
            with open(file, "rb") as f:
                raw, inode = f.read(), os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            return None, 0
        if len(raw) < _HEADER.size:
            return None, inode
        magic, checksum, size = _HEADER.unpack_from(raw)
        payload = raw[_HEADER.size :]
        if magic != _MAGIC or size != len(payload) or blake3(payload).digest() != checksum:
            return None, inode
        return payload, inode

    @staticmethod
    def _discard(file: Path, inode: int) -> None:
        """Remove a corrupt entry, unless another process has replaced it since it was read."""
        with contextlib.suppress(OSError):
            if os.stat(file).st_ino == inode:
                os.unlink(file)

    def get(self, key: str) -> bytes | None:
        file = self._object(key)
        payload, inode = self._read(file)
        if payload is None and inode:
            # Corrupt: remove it so the value is recomputed and written afresh.
            self._discard(file, inode)
        elif payload is not None:
            with contextlib.suppress(OSError):
                os.utime(file)  # recency, for gc
        return payload

    def put(self, key: str, data: bytes, *, pinned: bool = False) -> None:
        file = self._object(key)
        header = _HEADER.pack(_MAGIC, blake3(data).digest(), len(data))
        try:
            atomic_write(file, [header, data])
            if pinned:
                self.pin(key)
        except OSError as e:
            raise KeeperError(
                f"could not write cache entry {key[:12]}… under {self.path}: {e}"
            ) from e

    def pin(self, key: str) -> None:
        """Keep ``key`` through ``gc``."""
        _check_key(key)
        atomic_write(self.path / "pins" / key, b"")

    def name(self, name: str, key: str) -> None:
        _check_name(name)
        _check_key(key)
        atomic_write(self.path / "names" / name, key.encode())

    def lookup(self, name: str) -> bytes | None:
        _check_name(name)
        try:
            key = (self.path / "names" / name).read_text().strip()
        except FileNotFoundError:
            return None
        return self.get(key) if _KEY.match(key) else None

    def names(self) -> dict[str, str]:
        """Every recorded name and the key it points to."""
        out = {}
        for f in sorted((self.path / "names").iterdir()):
            if not f.name.startswith("."):
                out[f.name] = f.read_text().strip()
        return out

    def keys(self) -> Iterator[str]:
        """The keys of every entry (complete or not; temp files excluded)."""
        for sub in sorted((self.path / "objects").iterdir()):
            if sub.is_dir():
                for f in sorted(sub.iterdir()):
                    if _KEY.match(f.name):
                        yield f.name

    def _pins(self) -> set[str]:
        return {f.name for f in (self.path / "pins").iterdir() if _KEY.match(f.name)}

    def stats(self) -> KeeperStats:
        sizes = {}
        for key in self.keys():
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile by another process
                sizes[key] = self._object(key).stat().st_size
        return KeeperStats(
            len(sizes), sum(sizes.values()), len(self._pins() & set(sizes)), len(self.names())
        )

    def verify(self) -> list[str]:
        """Check every entry's checksum; corrupt entries are removed and their keys returned."""
        bad = []
        for key in self.keys():
            file = self._object(key)
            payload, inode = self._read(file)
            if payload is None and inode:
                bad.append(key)
                self._discard(file, inode)
        return bad

    def gc(self, max_bytes: int) -> int:
        """Remove least-recently-used unpinned entries (and hour-old temp files) until at most
        ``max_bytes`` remain. Returns the bytes freed."""
        pins = self._pins()
        files = []
        freed = 0
        stale = time.time() - 3600  # a temp file this old belongs to no live writer
        for sub in (self.path / "objects").iterdir():
            for f in sub.iterdir() if sub.is_dir() else ():
                try:
                    st = f.stat()
                except FileNotFoundError:  # a temp file renamed, or an entry removed, meanwhile
                    continue
                if f.name.startswith("."):  # a temp file, left by a killed writer if old
                    if st.st_mtime < stale:
                        with contextlib.suppress(OSError):
                            os.unlink(f)
                        freed += st.st_size
                    continue
                files.append((st.st_mtime, st.st_size, f))
        total = sum(size for _, size, _ in files)
        for _, size, f in sorted(files):
            if total <= max_bytes:
                break
            if f.name in pins:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f)
                total -= size
                freed += size
        return freed

    def __repr__(self) -> str:
        return f"DiskKeeper({str(self.path)!r})"
