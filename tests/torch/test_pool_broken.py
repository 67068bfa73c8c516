"""A worker pool breaking while its caller cancels: the pool still ends its workers."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool

import pytest

import somatize.torch as st
import somatize.torch.federated as fl
from somatize.errors import WorkerLostError
from somatize.torch.pool_futures import hold


def test_a_held_future_cancelled_meanwhile_takes_its_pools_failure_quietly():
    """What Python 3.11's broken pool does to each pending call (CPython gh-107219): its
    ``set_exception`` raised ``InvalidStateError`` on a future the caller had cancelled."""
    cancelled, pending = hold(Future()), hold(Future())
    assert cancelled.cancel()
    cancelled.set_exception(BrokenProcessPool("a worker died"))  # raised InvalidStateError
    assert cancelled.cancelled()
    pending.set_exception(BrokenProcessPool("a worker died"))
    assert isinstance(pending.exception(), BrokenProcessPool)


def _die_at_2(shared, c):
    if c == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return shared + c


@pytest.mark.slow
def test_a_worker_dying_while_map_clients_cancels_the_rest_leaves_no_worker_running():
    """Found by CI: ``map_clients`` cancels the batches not started as a ``WorkerLostError``
    reaches it, while the broken pool's thread was failing those same batches. Its thread
    died on the first one cancelled (in 17 of 20 tries of this test's round, before the
    fix), leaving the surviving workers running — and ``make test`` hung at exit, joining
    them, until CI's time ran out."""
    died: list[BaseException] = []
    before = set(multiprocessing.active_children())
    hook, threading.excepthook = threading.excepthook, lambda a: died.append(a.exc_value)
    try:
        for _ in range(8):
            with st.executor(workers=2) as pool, pytest.raises(WorkerLostError):
                fl.map_clients(pool, _die_at_2, list(range(60)), shared=10, batches=60)
    finally:
        threading.excepthook = hook
    assert died == []
    left = [p for p in multiprocessing.active_children() if p not in before]
    assert left == [], f"workers still running after their pool's with block: {left}"
