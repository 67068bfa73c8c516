"""A checkpoint directory: its files, its ``last`` pointer, rotation, and its one writer.

A directory holds ``step-NNNNNNNNN.ckpt`` files, the ``last`` and ``best`` pointers (one
line naming a file), and ``lock``, held (``flock``) by the one fit that writes there. A
fresh run writes an empty ``last`` before its first checkpoint, so checkpoints without
a ``last`` beside them are never a killed run's: they were copied or left there, and
no run writes over them. Rotation deletes only checkpoints of the run's own chain (the
names each checkpoint lists in ``payload["checkpoints"]``), never a file it did not write;
those a save deletes after writing its file are listed too (``payload["rotating"]``), so
that a run resumed after a kill in between deletes them (``left_behind``).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import CheckpointError
from ..keepers.locks import close_lock, open_lock
from ..platforms import READ_NONBLOCK, pread
from ..stack import outside
from . import ckptspare, integrity

__all__ = [
    "checkpoint_files",
    "left_behind",
    "listing",
    "newest_intact",
    "read_pointer",
    "rotate",
    "rotation",
    "writer",
]

FILE = re.compile(r"^step-(\d{9})\.ckpt$")
TEMP = re.compile(r"^\.(step-\d{9}\.ckpt|last|best)\..*\.tmp$")  # atomic_write's temp names


def checkpoint_files(directory: Path) -> list[str]:
    """The names of the checkpoint files in ``directory``, oldest first ([] when it is absent).

    Raises:
        CheckpointError: ``directory`` is a file, or cannot be listed.
    """
    return sorted(f for f in listing(directory) if FILE.match(f))


def listing(directory: Path) -> list[str]:
    """Every name in ``directory`` ([] when it is absent): one listing serves a save's
    rotation and its sweep of temp files.

    Raises:
        CheckpointError: ``directory`` is a file, or cannot be listed.
    """
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []
    except NotADirectoryError as e:
        raise not_a_directory(directory) from e
    except OSError as e:
        raise CheckpointError(
            f"cannot list the checkpoint directory {directory}: {e}; give this user read "
            "access to it, or checkpoint elsewhere"
        ) from e


def not_a_directory(directory: Path) -> CheckpointError:
    where = "is a file" if directory.is_file() else "lies under a file (a part of its path)"
    return CheckpointError(
        f"the checkpoint directory {directory} {where}, not a directory; "
        "Checkpointing(dir) takes a directory (created if missing): move the file away, "
        "or pass another path"
    )


def read_pointer(path: Path) -> str | None:
    """What the pointer ``path`` (``last``, ``best``) names: a file name, ``""`` when empty
    (or only NULs and blanks: a power cut can leave its unsynced bytes so), None when absent.

    Raises:
        CheckpointError: ``path`` is not a regular file (a directory, a FIFO), cannot be
            read, or holds something other than a file name (binary bytes).
    """
    try:
        fd = os.open(path, READ_NONBLOCK)  # a FIFO would hang a plain open
    except FileNotFoundError:
        return None
    except NotADirectoryError as e:
        raise not_a_directory(path.parent) from e
    except OSError as e:
        raise CheckpointError(
            f"cannot read the checkpoint pointer {path}: {e.strerror or e}; give this user "
            "read access to it, or resume from a checkpoint file: fit(..., resume=PATH)"
        ) from e
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise CheckpointError(
                f"the checkpoint pointer {path} is {what}; it should be a one-line file "
                "naming a checkpoint (step-NNNNNNNNN.ckpt): remove it and write that name "
                "into it, or resume from a checkpoint file: fit(..., resume=PATH)"
            )
        data = os.read(fd, 4096)
    except OSError as e:
        raise CheckpointError(f"cannot read the checkpoint pointer {path}: {e}") from e
    finally:
        os.close(fd)
    text = data.strip(b"\0 \t\r\n")
    try:
        return text.decode("ascii")
    except UnicodeDecodeError:
        raise CheckpointError(
            f"the checkpoint pointer {path} holds binary bytes ({data[:16]!r}…), not the name "
            f"of a checkpoint; {_pointer_fix(path)}"
        ) from None


def _pointer_fix(path: Path) -> str:
    try:
        files = checkpoint_files(path.parent)
    except CheckpointError:
        files = []
    example = files[-1] if files else "step-NNNNNNNNN.ckpt"
    return (
        f"write the name of the checkpoint to resume from into it (e.g. {example}), or "
        "resume from a checkpoint file: fit(..., resume=PATH)"
    )


def check_name(path: Path, name: str) -> None:
    """``name`` (read from the pointer ``path``) is a checkpoint's name.

    Raises:
        CheckpointError: it is not, with the fix.
    """
    if not FILE.match(name):
        raise CheckpointError(
            f"{path} does not name a checkpoint ({name[:60]!r}); {_pointer_fix(path)}"
        )


def refuse_pointer(path: Path, f: BinaryIO) -> None:
    """Refuse a pointer (``last``, ``best``) given where a checkpoint file is wanted.

    Raises:
        CheckpointError: ``f`` (``path``, open) is a pointer: says what to pass instead.
    """
    head = f.read(64)
    f.seek(0)
    name = head.strip(b"\0 \t\r\n").decode("ascii", errors="replace")
    if len(head) < 64 and (FILE.match(name) or (not name and path.name in ("last", "best"))):
        names = f"names {path.parent / name}" if name else "is empty (names the newest)"
        raise CheckpointError(
            f"{path} is the '{path.name}' pointer of the checkpoint directory {path.parent}, "
            f"not a checkpoint: it {names}. Pass the checkpoint file itself"
            + (f" ({path.parent / name})" if name else "")
            + f", or resume='last' with checkpoint=st.Checkpointing({str(path.parent)!r})"
        )


def orphans(directory: Path, files: list[str]) -> CheckpointError:
    """The error for checkpoints found without a ``last`` pointer beside them."""
    shown = ", ".join(files[-3:]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    return CheckpointError(
        f"{directory} holds checkpoints ({shown}) but no 'last' pointer: they are not this "
        "run's (copied without 'last', or 'last' was removed), and a run here would "
        "overwrite and rotate them away. Continue from one with fit(..., "
        f"resume='{directory / files[-1]}'), write its name into {directory / 'last'} to "
        "continue with resume='last', or checkpoint into another directory"
    )


def newest_intact(directory: Path, name: str | None) -> Path | None:
    """``directory / name`` if its checksum holds, else the newest older one that does.

    ``name=None`` (an empty ``last``): the newest intact checkpoint of the directory,
    or None when it holds none.
    """
    files = checkpoint_files(directory)[::-1]
    if name is None:
        if not files:
            return None
        name, files = files[0], files[1:]
    first = directory / name
    try:
        integrity.verify_file(first)
        return first
    except CheckpointError as e:
        damage = e
    older = [f for f in files if f < name]
    for other in older:
        try:
            integrity.verify_file(directory / other)
        except CheckpointError:
            continue
        warnings.warn(
            f"{first} is damaged ({damage}); falling back to the newest intact checkpoint, "
            f"{directory / other}",
            UserWarning,
            stacklevel=outside(),
        )
        return directory / other
    raise CheckpointError(
        f"no intact checkpoint in {directory}: {damage}; "
        + (f"the {len(older)} older one(s) are damaged too" if older else "there is no older one")
        + " — delete the directory to start afresh"
    ) from damage


def rotation(
    directory: Path,
    keep: int,
    newest: str,
    protect: set[str],
    known: Iterable[str] | None,
    names: list[str] | None = None,
) -> tuple[list[str], list[str]]:
    """(the chain's checkpoints kept after ``newest`` is written, oldest first; those to delete).

    Only ``known`` names are candidates (None: every checkpoint of the directory, for a run
    resumed from a checkpoint that does not list its chain); the newest ``keep - 1`` of
    them stay beside ``newest``, and the ``protect``-ed. ``names``: the directory's
    ``listing``, when the caller has it (else it is listed here).
    """
    if names is None:
        names = listing(directory)
    present = {f for f in names if FILE.match(f)}
    chain = present if known is None else present & set(known)
    older = sorted(chain - {newest})
    doomed = [f for f in older[: max(len(older) - (keep - 1), 0)] if f not in protect]
    return [*sorted(set(older) - set(doomed)), newest], doomed


def left_behind(path: Path, payload: Mapping[str, Any], directory: Path) -> list[str]:
    """The checkpoints that the save of ``path`` deleted after writing it
    (``payload["rotating"]``) and that are still in ``directory``: a process killed
    between the two left them, and rotation would never delete them (no later
    checkpoint lists them). Only a checkpoint file (one that ends in a checksum trailer)
    no newer than ``path`` counts: a file put there since is not the run's. [] where
    ``path`` lies in another directory."""
    doomed = payload.get("rotating")
    if not isinstance(doomed, list):  # (a checkpoint from before it was recorded)
        return []
    try:
        if not os.path.samefile(path.parent, directory):
            return []
        written = os.stat(path).st_mtime_ns
    except OSError:
        return []
    return [
        n
        for n in doomed
        if isinstance(n, str) and FILE.match(n) and _checkpoint_since(directory / n, written)
    ]


def _checkpoint_since(path: Path, written: int) -> bool:
    """Whether ``path`` is a checkpoint file (a trailer's magic at its end, unverified)
    last written no later than ``written`` (ns)."""
    try:
        fd = os.open(path, READ_NONBLOCK)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < integrity.TRAILER:
            return False
        tail = pread(fd, len(integrity.MAGIC), st.st_size - integrity.TRAILER)
        return tail == integrity.MAGIC and st.st_mtime_ns <= written
    except OSError:
        return False
    finally:
        os.close(fd)


def rotate(directory: Path, keep: int, newest: str, protect: set[str]) -> None:
    """Delete all but the newest ``keep`` checkpoints (``newest`` among them) and ``protect``."""
    remove(directory, rotation(directory, keep, newest, protect, None)[1])


def remove(directory: Path, doomed: list[str], names: list[str] | None = None) -> None:
    """Delete ``doomed`` and the temp files a killed writer left (one writer per directory).

    ``names``: a ``listing`` of ``directory`` taken before this save's own temp files
    were made (a save lists the directory once); None: list it now.
    """
    if names is None:
        try:
            names = os.listdir(directory)
        except OSError:
            names = []
    for name in doomed + [f for f in names if TEMP.match(f)]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(directory / name)


@contextlib.contextmanager
def writer(directory: Path) -> Iterator[None]:
    """Hold ``directory``'s lock for a fit: one run writes a checkpoint directory at a time.

    Its saves write over the file rotation dropped, and its end deletes that spare
    (``ckptspare``). The lock (``flock`` on ``directory/lock``) goes with the process,
    also when it is killed; another user of the directory takes it too
    (``keepers.locks.open_lock``).
    Where no lock can be taken (no ``fcntl``, a directory that cannot be made: its first
    checkpoint says why; a read-only disk; a lock file that cannot be opened: with a
    warning), the fit goes on without one.

    Raises:
        CheckpointError: another process holds it (another fit is writing there), or
            ``directory`` is a file.
    """
    if directory.exists() and not directory.is_dir():
        raise not_a_directory(directory)
    try:
        import fcntl
    except ImportError:  # (Windows)
        fcntl = None  # type: ignore[assignment]
    with contextlib.suppress(OSError):
        directory.mkdir(parents=True, exist_ok=True)
    fd = None
    if fcntl is not None and directory.is_dir():
        fd = open_lock(str(directory / "lock"), f"fits writing checkpoints into {directory}")
    if fd is None:  # (outside any except: the fit's own errors chain to nothing of ours)
        with ckptspare.recycling(directory):
            yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CheckpointError(
                f"the checkpoint directory {directory} is in use: another fit (in this or "
                f"another process) holds {directory / 'lock'} and writes its checkpoints "
                "there, and two runs in one directory would overwrite each other's. Give "
                "this run a Checkpointing directory of its own, or wait for that fit to end"
            ) from None
        with ckptspare.recycling(directory):
            yield
    finally:
        close_lock(fd)
