"""A run's claim on the folder it logs into, so that a second run writing into the same
folder at the same time is told (TensorBoard draws two runs' event files in one folder as
one run): clients of a federated round, or trials, run in parallel with one ``log_dir``
all start before any of them has written a file, so looking for earlier files misses them.

The claim is an exclusive ``flock`` on the folder's own descriptor, taken without waiting
and held while the run writes: taking it is atomic, no marker file is left in the folder,
and a killed process's claim dies with it (the kernel releases a flock when the last
descriptor of its open file closes). A forked child (a DataLoader worker) closes its copy,
so a claim ends when its run lets it go, not when the last worker exits. Where ``flock``
is missing (Windows) or refused (some network file systems), nothing is claimed and
nothing is said.
"""

from __future__ import annotations

import errno
import os
import weakref

from ..keepers.locks import close_lock, hold

try:
    import fcntl
except ImportError:  # (Windows: no claims)
    fcntl = None  # type: ignore[assignment]

__all__ = ["Claim", "claim"]

_OPEN = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_BUSY = {errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES}


class Claim:
    """A folder claimed by this process; ``release()`` lets it go (also when collected)."""

    def __init__(self, fd: int) -> None:
        self._release = weakref.finalize(self, close_lock, hold(fd))

    def release(self) -> None:
        """Let the folder go (once; later calls do nothing)."""
        self._release()


def claim(folder: str) -> tuple[Claim | None, bool]:
    """Claim ``folder`` (which exists) for one writer: ``(claim, busy)``. ``busy`` is True
    when another writer, in this process or another, holds it now; the claim is None then,
    and where the folder cannot be locked at all."""
    if fcntl is None:
        return None, False
    try:
        fd = os.open(folder, _OPEN)
    except OSError:
        return None, False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        return None, e.errno in _BUSY
    return Claim(fd), False
