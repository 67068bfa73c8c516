"""Loose entries: one file per entry, ``objects/ab/<key>``, a checksummed header then the bytes.

Used by single ``put`` (an entry of a whole batch, a model's features, a name's target).
Reading never blocks and never trusts what it finds: something other than a regular
file is reported as such (a FIFO would hang a plain ``open``), and a short, long or
altered file fails its checksum.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import struct
import time
from collections.abc import Iterator

from blake3 import blake3

from .packs import NotRegular, open_regular

__all__ = ["HEADER", "header", "quarantine", "read", "remove_if_same", "scan"]

MAGIC = b"SMZK\x01"
HEADER = struct.Struct(">5s32sQ")  # magic, blake3 of the payload, payload length
TOUCH_AFTER = 60.0  # a hit refreshes an entry's mtime (its recency, for gc) at most this often
_SPLIT = 1 << 16  # from this size on, the payload is read apart from the header (no copy)
_serial = itertools.count()


def header(data: bytes | memoryview) -> bytes:
    return HEADER.pack(MAGIC, blake3(data).digest(), len(data))


class Hostile(Exception):
    """Not a regular file where an entry should be."""

    def __init__(self, inode: int) -> None:
        super().__init__(inode)
        self.inode = inode


def read(path: str) -> tuple[bytes | None, int]:
    """The verified payload of the entry file at ``path`` and the inode read.

    Returns (None, 0) if absent and (None, inode) if torn or corrupt; a hit refreshes
    the file's mtime when it is older than a minute (gc removes the least recent).

    Raises:
        Hostile: a directory, FIFO, device or socket is at ``path``.
    """
    try:
        fd, st = open_regular(path)
    except FileNotFoundError:
        return None, 0
    except NotRegular as e:
        raise Hostile(e.inode) from None
    except OSError as e:
        if e.errno == 6:  # ENXIO: a socket
            raise Hostile(os.stat(path).st_ino) from None
        raise
    try:
        size = st.st_size
        if size < HEADER.size:
            return None, st.st_ino
        if size < _SPLIT:
            raw = os.read(fd, size + 1)
            head, payload = raw[: HEADER.size], raw[HEADER.size :]
        else:
            head = os.read(fd, HEADER.size)
            magic, _, length = HEADER.unpack(head)
            if magic != MAGIC or length != size - HEADER.size:  # not read into memory
                return None, st.st_ino
            payload = os.read(fd, size - HEADER.size + 1)
            while len(payload) < size - HEADER.size:  # reads past 2 GiB come in pieces
                more = os.read(fd, size - HEADER.size - len(payload) + 1)
                if not more:
                    break
                payload += more
        magic, checksum, length = HEADER.unpack(head)
        if magic != MAGIC or length != len(payload) or blake3(payload).digest() != checksum:
            return None, st.st_ino
        if st.st_mtime < time.time() - TOUCH_AFTER:
            with contextlib.suppress(OSError):  # another user's file in a shared cache
                os.utime(fd)
        return payload, st.st_ino
    finally:
        os.close(fd)


def remove_if_same(path: str, inode: int) -> bool:
    """Remove a corrupt file unless another process has replaced it since it was read."""
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == inode:
            os.unlink(path)
            return True
    return False


def quarantine(root: str, path: str, inode: int) -> bool:
    """Move something that is not a regular file out of the way, to ``root/quarantine``.

    A directory is moved, never deleted: what is in it is not ours to judge. Returns
    whether it moved (False if it changed meanwhile, or could not be moved).
    """
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino != inode:
            return False
        target = f"{root}/quarantine"
        os.makedirs(target, exist_ok=True)
        os.rename(path, f"{target}/{os.path.basename(path)}.{os.getpid()}-{next(_serial)}")
        return True
    return False


def scan(root: str) -> Iterator[os.DirEntry[str]]:
    """Every file in ``root/objects/*/`` (entries and temp files), one scandir per folder;
    a symlink where a folder should be is not followed."""
    try:
        top = os.scandir(f"{root}/objects")
    except FileNotFoundError:
        return
    with top:
        for sub in top:
            # (never through a symlink: gc and verify remove what they find in a folder,
            # and one planted in a cache given by someone else may point anywhere)
            if len(sub.name) != 2 or not sub.is_dir(follow_symlinks=False):
                continue
            try:
                inner = os.scandir(sub.path)
            except (NotADirectoryError, FileNotFoundError):
                continue
            with inner:
                yield from inner
