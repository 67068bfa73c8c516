"""The futures a ``TorchPool`` hands out, and those it holds from its worker pools.

``CallFuture`` is what ``submit`` returns: it stands for one call across the worker pools
the call may go through (a lost worker's call is sent again to a fresh pool).
``hold(inner)`` makes a worker pool's own future safe to cancel while that pool breaks.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any, Protocol


class _Call(Protocol):
    inner: Future[Any] | None


class CallFuture(Future[Any]):
    """The future ``TorchPool.submit`` returns: running, and no longer cancellable, once
    its call is handed to a worker — as ``ProcessPoolExecutor``'s (before, it said it was
    pending, and ``cancel()`` said yes while the worker ran the call on). Cancelled, it wakes
    ``wait()`` and ``as_completed()`` at once."""

    def __init__(self, task: _Call) -> None:
        super().__init__()
        self._task = task
        self._cancelling = threading.Lock()

    def running(self) -> bool:
        inner = self._task.inner
        return not self.done() and inner is not None and inner.running()

    def cancel(self) -> bool:
        inner = self._task.inner  # (done: a lost worker's, the call about to be sent again)
        if inner is not None and not inner.done() and not inner.cancel():
            return False
        with self._cancelling:
            if self.cancelled():
                return True
            if not super().cancel():
                return False
            # what an executor does as it would start a cancelled call: without it, wait()
            # and as_completed() on this future never returned (an aborted pool's calls)
            self.set_running_or_notify_cancel()
        return True


class _HeldFuture(Future[Any]):
    """A worker pool's future whose pool may fail it after it was cancelled.

    When a worker dies, Python 3.11's ``ProcessPoolExecutor`` fails every pending call's
    future with ``set_exception``, which raises ``InvalidStateError`` on one the caller
    cancelled meanwhile (``map_clients`` cancels the rest as the first failure reaches it).
    The pool's thread died there, before terminating the surviving workers, and the process
    then hung at exit joining them (CPython gh-107219, fixed in 3.12)."""

    def set_exception(self, exception: BaseException | None) -> None:
        with self._condition:
            if self.cancelled():
                return
            super().set_exception(exception)


def hold(inner: Future[Any]) -> Future[Any]:
    """``inner`` (a plain ``Future`` a worker pool returned), failing quietly once
    cancelled. Call it before the future is shared: nothing may cancel it before."""
    if type(inner) is Future:
        inner.__class__ = _HeldFuture
    return inner


def settled(settle: Callable[[Any], None], value: Any) -> None:
    """``settle(value)``, unless the caller cancelled the future meanwhile: while its result
    was unpickled, or as another call's failure ended ``map`` (which cancels the rest) —
    the settling may run in a done-callback's thread, or in the caller's own when the inner
    future was done already (a pool broken at once), where ``InvalidStateError`` would
    replace the error the caller is being told."""
    with contextlib.suppress(InvalidStateError):
        settle(value)
