"""Atomic writes: a file appears whole under its name, or not at all.

Every write goes to a temp file in the target's directory, is fsynced (except where
the caller asks not: cache entries and packs, verified on every read), and is renamed
over the target (``os.replace``, atomic on POSIX). A reader therefore sees the old
file or the new one, never a torn one, whatever instant a writer is killed.
On an error the temp file is removed and what existed is untouched.

Files are created as a plain ``open(path, "w")`` creates them: mode ``0o666`` less the
process's umask (``0o644`` under the usual 022; ``0o664`` for a group-shared store
under 002), whichever helper writes them.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from ..platforms import BINARY, CLOEXEC, replace

__all__ = ["atomic_file", "atomic_write", "fsync_dir", "replace_with", "start_writeback"]

_tmp_serial = itertools.count()
_SMALL = 1 << 20  # below this, chunks are joined and written with one call
_NEW_BINARY = os.O_WRONLY | os.O_CREAT | os.O_EXCL | CLOEXEC | BINARY  # (a fresh temp file)


@contextlib.contextmanager
def atomic_file(path: Path, *, sync: bool = True, sync_dir: bool = True) -> Iterator[BinaryIO]:
    """A file to write that appears at ``path`` whole, or not at all.

    Writes go to a temp file in the same directory; on success it is fsynced (``sync``),
    renamed over ``path`` (``os.replace``), and the directory is fsynced so the rename
    itself survives a crash (``sync_dir``; a caller renaming several files syncs it once,
    after the last). On an exception the temp file is removed.

    Raises:
        OSError: ``path`` is a device, a pipe or a socket (``/dev/null``): renamed over,
            it would be replaced by a file (as root, ``/dev/null`` itself was).
    """
    _refuse_special(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(str(path.parent), path.name)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            if sync:
                f.flush()
                os.fsync(f.fileno())
        replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync_dir:
        fsync_dir(path.parent)


def _refuse_special(path: Path) -> None:
    try:
        mode = os.stat(path).st_mode
    except OSError:  # (none yet, or unreadable: the write says why)
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # (a directory: the rename says so)
        raise OSError(
            errno.EINVAL,
            f"{path} is not a regular file (a device, a pipe or a socket): an atomic write "
            "renames a new file over its name and would replace it; give the path of a file",
        )


def atomic_write(path: Path, data: bytes | memoryview | list[bytes | memoryview]) -> None:
    """Write ``path`` so that a reader sees the old file or the new one, never a torn one."""
    with atomic_file(path) as f:
        for chunk in data if isinstance(data, list) else [data]:
            f.write(chunk)


def fsync_dir(directory: Path | str) -> None:
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


_WRITE = 2  # SYNC_FILE_RANGE_WRITE: start writing the range's dirty pages, do not wait


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing ``length`` bytes of ``fd`` from ``offset`` to the disk, without waiting.

    Linux's ``sync_file_range(SYNC_FILE_RANGE_WRITE)``: the disk takes a large file while
    its writer goes on, so the ``fsync`` that ends the write has little left to wait for.
    Only a hint: it makes nothing durable (the ``fsync`` does), is a no-op where there is
    no such call, and its errors are left to the ``fsync`` to report.
    """
    call = _sync_file_range()
    if call is not None:
        call(fd, offset, length, _WRITE)


@functools.cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call  # type: ignore[no-any-return]


def _create_temp(directory: str, name: str) -> tuple[int, str]:
    """A new temp file ``.<name>.<pid>-<n>.tmp`` in ``directory``, created exclusively (no
    two writers share one, no symlink is followed) with mode ``0o666`` less the umask."""
    while True:
        tmp = f"{directory}/.{name}.{os.getpid()}-{next(_tmp_serial)}.tmp"
        try:
            return os.open(tmp, _NEW_BINARY, 0o666), tmp
        except FileExistsError:  # left by a dead process that had our pid: take the next
            continue


def _write_all(fd: int, chunks: Sequence[bytes | memoryview]) -> None:
    if len(chunks) > 1 and sum(len(c) for c in chunks) < _SMALL:
        chunks = [b"".join(chunks)]
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        while view:
            view = view[os.write(fd, view) :]


def replace_with(path: str, chunks: Sequence[bytes | memoryview], *, durable: bool = True) -> None:
    """The lean form of ``atomic_write`` for the keepers' hot path (plain ``str`` paths).

    Temp file ``.<name>.<pid>-<n>.tmp`` beside ``path`` (created exclusively, so no two
    writers share one), written, fsynced and renamed over ``path``; the directory is
    created if missing, and fsynced after the rename. ``durable=False`` skips both
    fsyncs: the rename is still atomic, so a process killed at any instant leaves the
    old file or the new one, but a power failure may lose the file or leave it torn —
    right for entries verified on every read (cache entries and packs), where a lost or
    torn file is a miss.

    Raises:
        OSError: as the OS reported it; the temp file is removed and ``path`` untouched.
    """
    directory, name = os.path.split(path)
    try:
        fd, tmp = _create_temp(directory, name)
    except FileNotFoundError:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = _create_temp(directory, name)
    try:
        try:
            _write_all(fd, chunks)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(directory)
