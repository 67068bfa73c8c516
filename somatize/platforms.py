"""What differs between Linux, macOS and Windows, in the few OS calls somatize makes.

CI runs on Linux only; each helper here keeps Linux's behaviour exactly and does the
right thing where a call is missing or means something else:

* ``os.open`` opens in **text mode** on Windows unless ``O_BINARY`` is given: ``os.write``
  then turns ``\\n`` into ``\\r\\n`` and ``os.read`` stops at a ``\\x1a`` byte — every cache
  entry, pack and checkpoint torn. Every ``os.open`` of somatize's passes ``BINARY``
  (0 elsewhere); ``O_NONBLOCK``, ``O_NOFOLLOW``, ``O_CLOEXEC`` and ``O_DIRECTORY`` are 0
  where missing, as they are on Windows.
* ``os.pread`` does not exist on Windows: ``pread`` seeks and reads there, under a lock.
* ``os.set_blocking`` fails on a Windows file (before Python 3.12 it is missing), where
  nothing was opened non-blocking anyway: ``blocking`` does nothing there.
* ``os.kill(pid, 0)`` asks whether a process exists on POSIX, but **ends** it on Windows
  (``TerminateProcess`` with exit code 0): ``alive`` asks Windows with ``OpenProcess``.
* ``os.replace`` over a file another process holds open (a reader, an indexer, an
  antivirus scan) fails on Windows with ``PermissionError``, where POSIX replaces it under
  the reader: ``replace`` retries there for up to about a second.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

__all__ = [
    "BINARY",
    "CLOEXEC",
    "DIRECTORY",
    "NOFOLLOW",
    "NONBLOCK",
    "READ_NONBLOCK",
    "alive",
    "blocking",
    "pread",
    "replace",
]

BINARY: int = getattr(os, "O_BINARY", 0)
CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)
DIRECTORY: int = getattr(os, "O_DIRECTORY", 0)
NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
NONBLOCK: int = getattr(os, "O_NONBLOCK", 0)
#: Read a file without ever blocking on open (a FIFO in its place would hang a plain one).
READ_NONBLOCK: int = os.O_RDONLY | NONBLOCK | CLOEXEC | BINARY

_seek_lock = threading.Lock()  # (pread's fallback moves the shared file position)


def pread(fd: int, size: int, offset: int) -> bytes:
    """``os.pread``; where there is none (Windows), a seek and a read under a lock."""
    call = getattr(os, "pread", None)
    if call is not None:
        return call(fd, size, offset)  # type: ignore[no-any-return]
    with _seek_lock:
        os.lseek(fd, offset, os.SEEK_SET)
        return os.read(fd, size)


def blocking(fd: int) -> None:
    """Make ``fd``, opened with ``NONBLOCK``, block again (nothing to do where ``NONBLOCK``
    is 0: Windows, whose ``os.set_blocking`` takes pipes only)."""
    if NONBLOCK:
        os.set_blocking(fd, True)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie too, until it is reaped)."""
    if sys.platform == "win32":
        return _alive_windows(pid, *_kernel32())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists (another user's: the pid was taken again)
        pass
    return True


_QUERY = 0x1000  # PROCESS_QUERY_LIMITED_INFORMATION
_STILL_ACTIVE = 259
_ACCESS_DENIED = 5


def _kernel32() -> tuple[Any, Any]:  # pragma: no cover - Windows only
    import ctypes

    dll = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
    return dll, ctypes.get_last_error  # type: ignore[attr-defined]


def _alive_windows(pid: int, kernel32: Any, last_error: Any) -> bool:
    """Whether ``pid`` runs, asked through ``kernel32`` (never ``os.kill``: it would end it)."""
    import ctypes

    handle = kernel32.OpenProcess(_QUERY, False, pid)
    if not handle:  # none such; or another user's, which exists
        return bool(last_error() == _ACCESS_DENIED)
    try:
        code = ctypes.c_ulong()
        if not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)):
            return True
        return code.value == _STILL_ACTIVE
    finally:
        kernel32.CloseHandle(handle)


_REPLACE_WAITS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4)  # (about a second in all)


def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """``os.replace``; on Windows, retried while ``dst`` is held open by another process
    (``PermissionError``), then raised as it came."""
    if sys.platform != "win32":
        os.replace(src, dst)
        return
    for wait in _REPLACE_WAITS:
        try:
            os.replace(src, dst)
            return
        except PermissionError:
            time.sleep(wait)
    os.replace(src, dst)
