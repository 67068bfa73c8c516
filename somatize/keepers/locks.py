"""Lock files (``flock``) that several users of one store share: the keepers' pin lock,
a checkpoint directory's, a remembered run's (``somatize.runs``).

A lock file is created as every other file of a store is, mode ``0o666`` less the
creator's umask: under umask 002 a group-shared store's lock is group-writable. It is
opened for reading and writing where it can be, and for reading only where not (a
lock created by another user under umask 022): ``flock`` needs no write access, so
every user of the store takes the same lock. Where neither open succeeds, the caller
goes on without the lock, with a warning saying what is no longer guarded (silently
only on a read-only or full disk, where no other process can write either).

A ``flock`` belongs to the open file, which a forked child shares: a DataLoader worker
forked while a fit holds its checkpoint directory's lock would hold it on after the fit
(``persistent_workers=True``; or an interrupted fit's workers not yet reaped), and the
next fit there would be refused. So a forked child closes its copies of the lock files
held open here (``os.register_at_fork``); the parent's locks are unchanged. Callers
close a lock with ``close_lock``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import warnings

from ..stack import outside

__all__ = ["close_lock", "hold", "open_lock"]

# a disk that takes no writes: no pin can be written nor entry removed there, nothing
# for a lock to keep apart (the operation's own error says why)
_NO_WRITES = {errno.EROFS, errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
# O_NOFOLLOW: a lock file is never a link; one planted in a store given by someone else
# would have O_CREAT make (or open) a file wherever it points
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_RW = os.O_RDWR | os.O_CREAT | _NOFOLLOW
_RO = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | _NOFOLLOW


# lock descriptors open in this process (open_lock's, and others held with ``hold``):
# closed in a forked child, and by ``close_lock`` only while held here
_HELD: set[int] = set()
_AT_FORK: list[bool] = []  # (the hook registered, once: on the first lock, not at import)


def _forget_in_child() -> None:
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


def hold(fd: int) -> int:
    """Record ``fd``, a descriptor that carries a ``flock``, so that a forked child closes
    its copy (the lock then ends when this process lets it go); returns ``fd``."""
    if not _AT_FORK and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forget_in_child)
        _AT_FORK.append(True)
    _HELD.add(fd)
    return fd


def close_lock(fd: int) -> None:
    """Close a lock descriptor ``open_lock`` gave or ``hold`` recorded (releasing its
    ``flock``). In a forked child, which closed it already, nothing is closed: the number
    may be another file's there."""
    if fd in _HELD:
        _HELD.discard(fd)
        os.close(fd)


def open_lock(path: str, guards: str) -> int | None:
    """A file descriptor of the lock file ``path`` (its folder created if missing), to
    ``flock``; None where it can be neither created nor opened, with a warning that
    ``guards`` (what the lock keeps apart, "pins and gc") goes on unguarded."""
    try:
        try:
            return hold(os.open(path, _RW, 0o666))
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            return hold(os.open(path, _RW, 0o666))
    except OSError as e:
        error = e
    try:
        return hold(os.open(path, _RO))  # (another user's lock, not writable by this one)
    except OSError:
        pass
    if error.errno not in _NO_WRITES:
        folder = os.path.dirname(path)
        fix = (
            "Remove it: a lock file is never a link (somatize opens none through one)"
            if os.path.islink(path)
            else f"Give this user write access to {folder} (a store shared by a group: a "
            "group-writable, setgid directory, and umask 002 for every user)"
        )
        warnings.warn(
            f"could not open the lock file {path} ({error.strerror or error}): {guards} go "
            f"on without it, unguarded against other processes. {fix}",
            UserWarning,
            stacklevel=outside(),
        )
    return None
