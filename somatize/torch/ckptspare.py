"""The file of a checkpoint that rotation dropped, written over by the fit's next save.

Deleting a dropped checkpoint frees its blocks, and the next save allocates as many
again: on a disk mounted ``discard`` the delete waits for the device (5-15 ms for the
30 MiB of the benchmark, as long as bare ``torch.save`` takes to truncate its file), and
the page cache frees and refills as many pages. Inside a fit (``ckptdir.writer``)
rotation instead renames one dropped file to a hidden spare,
``.step-NNNNNNNNN.ckpt.spare.tmp`` (a temp file's name: any sweep removes it), and the
next save writes over it as over a fresh temp file: cut to its new length, fsynced,
renamed into place. A reader sees the old checkpoint or the new one, whole, as before.
The fit's end deletes the spare; one a kill left is taken or swept by the next save
(a fit's start fsyncs the directory, so its name is durable before it is written over).

A file is written over only where no one else can see it change:

* the directory is on ext2/3/4, XFS or tmpfs: a local disk, where every process that
  has the file open runs on this machine;
* the file has one link (no other name shares its blocks);
* no process has it open or mapped: Linux grants a write lease (``F_SETLEASE``) only to
  a file's sole opener; it is taken and given back at once. A reader that loaded the
  file (``load_checkpoint`` maps it) keeps what it read.

Anywhere else the file is deleted, as outside a fit. The rename to the spare comes
before the directory fsync that makes the save durable, so the spare's name is durable
before it is written over; the file that ``last`` named before the save is never taken,
so a power cut that keeps the old ``last`` finds its file.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ..keepers import fsync_dir
from ..platforms import BINARY, CLOEXEC, NOFOLLOW

__all__ = ["SPARE", "keep", "on", "open_spare", "pick", "recycling", "sweep", "written_over"]

SPARE = re.compile(r"^\.step-\d{9}\.ckpt\.spare\.tmp$")
_LOCAL = frozenset({"ext2", "ext3", "ext4", "xfs", "tmpfs"})
_fits: dict[tuple[int, int], int] = {}  # (st_dev, st_ino) of the directories fits write here
_fits_lock = threading.Lock()


def _key(directory: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(directory)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _local(dev: int) -> bool:
    """Whether the file system of device ``dev`` is one of ``_LOCAL`` (Linux's mountinfo;
    read at each fit's start: a device number is reused by the next mount)."""
    if not sys.platform.startswith("linux"):
        return False
    want = f"{os.major(dev)}:{os.minor(dev)}"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2 and fields[2] == want and " - " in line:
                    return line.split(" - ", 1)[1].split()[0] in _LOCAL
    except OSError:
        pass
    return False


@contextlib.contextmanager
def recycling(directory: Path) -> Iterator[None]:
    """Within: saves into ``directory`` write over the file rotation dropped (where the
    module's rules allow); at the end the spare is deleted."""
    key = _key(directory)
    if key is None or not _local(key[0]):
        yield
        return
    fsync_dir(directory)  # a spare a killed fit renamed: its name durable before it is used
    with _fits_lock:
        _fits[key] = _fits.get(key, 0) + 1
    try:
        yield
    finally:
        with _fits_lock:
            _fits[key] -= 1
            if not _fits[key]:
                del _fits[key]
        sweep(directory)


def on(directory: Path) -> bool:
    """Whether a fit of this process writes ``directory`` (``recycling``)."""
    return bool(_fits) and _key(directory) in _fits


def pick(names: list[str]) -> str | None:
    """The spare among a directory's ``names``, if any (the others are swept)."""
    spares = sorted(n for n in names if SPARE.match(n))
    return spares[0] if spares else None


def keep(directory: Path, doomed: list[str], pointed: str | None) -> list[str]:
    """Rename one of ``doomed`` (never ``pointed``, what ``last`` named before this save)
    to the spare; returns the rest, to delete."""
    for name in doomed:
        if name == pointed:
            continue
        try:
            os.rename(directory / name, directory / f".{name}.spare.tmp")
        except OSError:
            continue  # (deleted with the rest)
        return [n for n in doomed if n != name]
    return doomed


def open_spare(spare: Path) -> int | None:
    """``spare`` opened to be written over, or None where it may not be: not a regular
    file, another link to it, or another opener (anywhere on this machine)."""
    try:
        fd = os.open(spare, os.O_WRONLY | NOFOLLOW | CLOEXEC | BINARY)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and _sole_opener(fd):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _sole_opener(fd: int) -> bool:
    """Whether ``fd`` is the file's only open description (none mapped either): a write
    lease, taken and given back at once."""
    import fcntl

    setlease, setsig = getattr(fcntl, "F_SETLEASE", None), getattr(fcntl, "F_SETSIG", None)
    if setlease is None or setsig is None:
        return False
    try:
        # one opening it while the lease is held signals us: SIGURG, ignored unless
        # handled, rather than SIGIO, which would end the process
        fcntl.fcntl(fd, setsig, signal.SIGURG)
        fcntl.fcntl(fd, setlease, fcntl.F_WRLCK)
    except OSError:
        return False
    fcntl.fcntl(fd, setlease, fcntl.F_UNLCK)
    return True


@contextlib.contextmanager
def written_over(fd: int, spare: Path, path: Path) -> Iterator[BinaryIO]:
    """The open ``spare`` (``open_spare``) to write from its start; then cut to what was
    written, fsynced and renamed to ``path``. On an exception it is deleted instead."""
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.truncate()  # what the dropped checkpoint held beyond this one
            f.flush()
            os.fsync(f.fileno())
        os.replace(spare, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(spare)
        raise


def sweep(directory: Path) -> None:
    """Delete the spares in ``directory`` (a fit's end)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if SPARE.match(name):
            with contextlib.suppress(OSError):
                os.unlink(directory / name)
