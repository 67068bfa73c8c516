"""A remembered run's directory, read and made without trusting what is there.

A run's key is predictable (its function's code and arguments), so whoever may write in a
shared ``remembered/`` can plant something at ``remembered/<key>`` before the run starts.
A link there would have the run's record, lock file and checkpoints written wherever it
points: ``own_dir`` replaces it with a directory of the store's own (what it pointed to
is untouched). A record is read without blocking and bounded (``read_record``).
"""

from __future__ import annotations

import contextlib
import os
import stat
import warnings

from .platforms import READ_NONBLOCK
from .printable import printable
from .stack import outside

__all__ = ["RECORD_BYTES", "own_dir", "read_record"]

RECORD_BYTES = 16 << 20  # a run.json larger than this is damaged (records are kilobytes)


def own_dir(path: str, *, make: bool = True) -> None:
    """Make ``path`` (a run's directory, or its ``ckpt/``) a directory, never a link: a
    symbolic link there is removed, with a warning naming it, and (``make``) a directory
    made in its place, its parents too. Anything else there is left for the write to
    report (a file in its place: the write's own error names it).

    Raises:
        OSError: the link cannot be removed (another user's folder), or the directory made.
    """
    for _ in range(8):  # (a link planted again meanwhile is removed again)
        try:
            if make:
                os.mkdir(path)
                return
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            continue
        except FileExistsError:
            pass
        try:
            if not stat.S_ISLNK(os.lstat(path).st_mode):
                return
            target = os.readlink(path)
        except FileNotFoundError:  # (removed meanwhile: made on the next try)
            if not make:
                return
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # the link itself, never what it points to
        warnings.warn(
            f"{printable(path)} was a symbolic link (to {printable(target)!r}), where a "
            "remembered run keeps a directory of its own: somatize writes no run through "
            "a link. The link was removed (not what it points to) and the run goes on in "
            "a directory made there; to keep runs on another disk, give st.remember("
            "..., dir=...) or link the store's whole directory",
            UserWarning,
            stacklevel=outside(),
        )
    raise OSError(f"{path} keeps being replaced by a symbolic link; no run is written there")


def read_record(file: str) -> bytes:
    """A run record's bytes, opened without blocking (a FIFO in its place would hang
    ``runs ls``); ``ValueError`` (a damaged record) for no regular file, or one over
    ``RECORD_BYTES`` (a huge or sparse one would fill the memory)."""
    fd = os.open(file, READ_NONBLOCK)
    data = b""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("it is not a regular file")
        if st.st_size <= RECORD_BYTES:
            data = os.read(fd, RECORD_BYTES + 1)
    finally:
        os.close(fd)
    if st.st_size > RECORD_BYTES or len(data) > RECORD_BYTES:  # (grown since the fstat)
        raise ValueError(f"it is over {RECORD_BYTES} bytes, and a run record is kilobytes")
    return data
