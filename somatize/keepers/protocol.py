"""The Keeper protocol, its counts, and the rules for keys and names."""

from __future__ import annotations

import errno
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..counted import counted
from ..errors import KeeperError

__all__ = ["Keeper", "KeeperStats", "check_key", "check_name"]


_ELSEWHERE = "DiskKeeper(path) (for the somatize command: --dir or $SOMATIZE_CACHE)"


def fail(what: str, path: str, e: OSError) -> KeeperError:
    """The KeeperError for an OS error while a keeper did ``what`` to ``path``: the path,
    the OS's words and the fix."""
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        fix = (
            "free space on that disk (`somatize cache gc --max-bytes N` shrinks the cache), "
            f"or keep the cache on another disk: {_ELSEWHERE}"
        )
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        access = "read" if what.startswith("read") else "write"
        fix = (
            f"give this user {access} access to it (a read-only disk: remount it writable), "
            f"or keep the cache in a directory this user can {access}: {_ELSEWHERE}"
        )
    else:
        fix = f"check the disk, or keep the cache in another directory: {_ELSEWHERE}"
    return KeeperError(f"could not {what} {path}: {e.strerror or e}; {fix}")


_KEY = re.compile(r"^[0-9a-f]{64}$")
# (not starting with a dot: ".", "..", a hidden file or a temporary one; \Z: no newline)
_NAME = re.compile(r"\A[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,199}\Z")


@runtime_checkable
class Keeper(Protocol):
    """The shape of a keeper: bytes in, bytes out, under 64-hex-digit keys.

    Optional, used where present: ``discard(key)`` (forget an entry whose bytes held
    but did not decode, so it is recomputed) and ``unpin(key)``.
    """

    def get(self, key: str) -> bytes | None:
        """The bytes stored under ``key``, or None (absent or corrupt)."""
        ...

    def put(self, key: str, data: bytes, *, pinned: bool = False) -> None:
        """Store ``data`` under ``key``; ``pinned`` entries survive ``gc``."""
        ...

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The bytes under each key, in the same order; None where absent or corrupt."""
        ...

    def put_many(self, items: Sequence[tuple[str, bytes]], *, pinned: bool = False) -> None:
        """Store every ``(key, data)`` pair at once (a batch of per-example entries)."""
        ...

    def name(self, name: str, key: str) -> None:
        """Record ``name`` as a human handle for ``key``."""
        ...

    def lookup(self, name: str) -> bytes | None:
        """The bytes of the entry last recorded under ``name``, or None."""
        ...


@dataclass(frozen=True)
class KeeperStats:
    """Counts of a keeper.

    Attributes:
        entries: distinct keys stored.
        bytes: bytes held (on disk: file sizes, headers and indexes included).
        pinned: entries that ``gc`` keeps.
        names: names recorded.
        evicted: entries dropped to stay within ``max_bytes``: by a ``MemoryKeeper`` (or
            its gc), or by a ``DiskKeeper(max_bytes=)`` handle's own gcs since it was made.
        evicted_bytes: the bytes of those entries.
        refused: new entries a full ``MemoryKeeper(policy="epochs")`` did not keep (its
            entries still being read).
        packs: pack files of a ``DiskKeeper`` (each holds many entries).
    """

    entries: int
    bytes: int
    pinned: int
    names: int
    evicted: int = 0
    evicted_bytes: int = 0
    packs: int = 0
    refused: int = 0

    def __str__(self) -> str:
        out = (
            f"{counted(self.entries, 'entry')}, {counted(self.bytes, 'byte')}, "
            f"{self.pinned} pinned, {counted(self.names, 'name')}"
        )
        if self.packs:
            out += f", {counted(self.packs, 'pack')}"
        if self.evicted:
            out += f", {self.evicted} evicted ({counted(self.evicted_bytes, 'byte')})"
        if self.refused:
            out += f", {self.refused} refused"
        return out


def as_bytes(data: Any) -> bytes:
    """``data`` as bytes: bytes as they are; a copy of another buffer (a bytearray, a
    memoryview of any shape), so that its length is its byte count and nothing the caller
    changes later reaches the keeper. ``TypeError`` for what is no buffer (``bytes(3)``
    would be three zero bytes)."""
    return data if type(data) is bytes else bytes(memoryview(data))


def not_bytes(
    keeper: object, items: Iterable[tuple[str, Any]], e: TypeError, method: str = "put"
) -> TypeError:
    """The error for a ``put`` of a value that is not bytes (asked only once the write
    failed with ``e``, so a put of bytes pays nothing); ``e`` itself, when all were bytes."""
    for key, data in items:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            shown = repr(data) if len(repr(data)) <= 40 else f"{repr(data)[:37]}..."
            return TypeError(
                f"{type(keeper).__name__}.{method}: the value of {key!r} is {shown}; a keeper stores bytes, not "
                f"{type(data).__qualname__}; encode the value first, e.g. "
                "somatize.encode(value) (or text.encode() for a str)"
            )
    return e


def check_key(key: str) -> None:
    """Raise ``KeeperError`` unless ``key`` is 64 lowercase hex digits."""
    if not (type(key) is str and len(key) == 64 and _KEY.match(key)):
        kind = "" if type(key) is str else f" (a {type(key).__qualname__})"
        raise KeeperError(
            f"invalid key {key!r:.80}{kind}: keys are 64 lowercase hex digits (a blake3 "
            "digest), e.g. somatize.digest(value)"
        )


def check_name(name: str) -> None:
    """Raise ``KeeperError`` unless ``name`` is a safe file name."""
    if not (type(name) is str and _NAME.match(name)):
        raise KeeperError(
            f"invalid name {name!r:.80}: use letters, digits, '.', '_' or '-' (at most 200, "
            "not starting with '.'), e.g. 'features-v1'"
        )


_KEEPER_METHODS = ("get", "put", "get_many", "put_many", "name", "lookup")


def check_keeper(keeper: Any, where: str) -> Any:
    """``keeper`` itself, unless it is neither None nor shaped like a ``Keeper``.

    Raises:
        TypeError: naming ``where`` and the methods it lacks.
    """
    if keeper is None:
        return None
    if isinstance(keeper, type):
        raise TypeError(
            f"{where}: {keeper.__qualname__} is the class, not a keeper; pass an instance, "
            f"{keeper.__qualname__}() (a DiskKeeper takes its folder: DiskKeeper(path))"
        )
    missing = [m for m in _KEEPER_METHODS if not callable(getattr(keeper, m, None))]
    if missing:
        raise TypeError(
            f"{where}: {keeper!r} ({type(keeper).__qualname__}) is not a keeper, it has no "
            f"{', '.join(missing)}; pass MemoryKeeper(), DiskKeeper(path), or an object with "
            "the Keeper protocol's methods"
        )
    return keeper


def is_name(name: object) -> bool:
    """Whether ``name`` may name an entry (``Keeper.name``): a safe file name."""
    return type(name) is str and _NAME.match(name) is not None


def is_key(name: str) -> bool:
    """Whether a file name is a key (cheap: for directory listings)."""
    return len(name) == 64 and _KEY.match(name) is not None
