"""Workers killed mid-campaign: st.executor's pool and a Dask cluster lose no run.

A worker is SIGKILLed at a random instant while runs are queued and running; every
run must come back with its own, right value. A Dask slice pinned to a worker that
dies must fail with a clear ``TransportError``, never hang.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
import time

import pytest

import somatize.torch as st
from somatize import Done, Graph, Node
from somatize.errors import TransportError
from somatize.transports import ExecutorTransport

from .conftest import TRIALS


def work(x: int, n: int = 400_000) -> tuple[int, int]:
    """A run of some tens of milliseconds: x², and the worker's pid."""
    total = 0
    for i in range(n):
        total += i % 7
    return x * x + 0 * total, os.getpid()


def light(x: int) -> tuple[int, int]:
    return work(x, 100_000)


def _kill_one(pids: list[int], rng) -> int:
    pid = rng.choice(sorted(pids))
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.mark.slow
def test_a_pool_worker_killed_at_random_instants_loses_no_run(rng):
    n = 8
    with st.executor(workers=2) as pool:
        assert pool.submit(work, 0).result()[0] == 0  # workers up

        kills = []

        def kill() -> None:
            gen = pool._gen
            if gen is not None and gen.pool._processes:
                kills.append(_kill_one(list(gen.pool._processes), rng))

        for _trial in range(TRIALS):
            killer = threading.Timer(rng.uniform(0, 0.05), kill)  # early in the campaign
            killer.start()
            try:
                runs = st.run_all(pool, work, range(n))
            finally:
                killer.cancel()
            assert runs.lost == {}
            assert [r[0] for r in runs.results] == [i * i for i in range(n)]
        assert kills and 1 <= pool.restarts <= len(kills)


@pytest.fixture
def stacks_if_stuck():
    """Print every thread's stack if a Dask test runs past 90 s (then it fails on its own)."""
    faulthandler.dump_traceback_later(90, exit=False)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",  # a free port: 8787 may be taken
            scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
        ) as c,
        distributed.Client(c) as client,
    ):
        yield client


def _workers(client, count: int = 2, seconds: float = 60) -> dict[str, int]:
    """address -> pid of ``count`` live workers (a killed one may still be listed a while)."""
    deadline = time.monotonic() + seconds
    while True:
        client.wait_for_workers(count, timeout=seconds)
        pids = client.run(os.getpid, on_error="return")
        live = {a: p for a, p in pids.items() if isinstance(p, int)}
        if len(live) >= count:
            return live
        assert time.monotonic() < deadline, (
            f"only {len(live)} live workers: {pids}; {client.scheduler_info()['workers'].keys()}"
        )
        time.sleep(0.1)  # polling the cluster until the restarted worker answers


@pytest.mark.slow
def test_a_dask_worker_killed_at_random_instants_loses_no_run(cluster, rng, stacks_if_stuck):
    pool = cluster.get_executor(pure=False)
    for trial in range(TRIALS):
        pids = _workers(cluster)
        items = list(range(10 * trial, 10 * trial + 10))
        killer = threading.Timer(rng.uniform(0, 0.2), _kill_one, (list(pids.values()), rng))
        killer.start()
        try:
            runs = st.run_all(pool, light, items)  # Dask reschedules the dead worker's runs
        finally:
            killer.cancel()
        assert runs.lost == {}
        assert [r[0] for r in runs.results] == [i * i for i in items]


class Far(Node):
    def forward(self, x, ctx):
        deadline = time.monotonic() + 120  # long enough for the worker to be killed under it
        while time.monotonic() < deadline:
            time.sleep(0.01)
        return Done(x)


@pytest.mark.slow
def test_a_slice_pinned_to_a_dask_worker_that_dies_fails_clearly_and_never_hangs(
    cluster, stacks_if_stuck
):
    pids = _workers(cluster)
    address = sorted(pids)[0]
    g = Graph.somatize(Far().with_id("far")).place("far", host="box")
    transport = ExecutorTransport(cluster.get_executor(workers=[address]))  # the defaults
    killer = threading.Timer(0.5, os.kill, (pids[address], signal.SIGKILL))
    killer.start()
    start = time.monotonic()
    try:
        with pytest.raises(TransportError, match=r"far.*pinned to \(.*\) left the cluster"):
            g.forward(1, transports={"box": transport})
    finally:
        killer.cancel()
    assert time.monotonic() - start < 60


class DiesOnce(Node):
    """Kills its worker the first time it runs (a mark file says it did), then answers."""

    def __init__(self, mark: str) -> None:
        self.mark = mark

    def forward(self, x, ctx):
        if not os.path.exists(self.mark):
            open(self.mark, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return Done((x, os.getpid()))


@pytest.mark.slow
def test_a_slice_pinned_by_name_reaches_the_worker_a_nanny_restarted(
    cluster, tmp_path, stacks_if_stuck
):
    # The restarted worker keeps its name but not its address, and Dask bound the task to
    # the old address: it would wait for it forever (the defaults: no timeout).
    pids = _workers(cluster)
    info = cluster.scheduler_info()["workers"]
    address = sorted(pids)[0]
    name = info[address]["name"]
    g = Graph.somatize(DiesOnce(str(tmp_path / "died")).with_id("far")).place("far", host="box")
    transport = ExecutorTransport(cluster.get_executor(workers=[name]), retries=1)
    answer: list[object] = []
    thread = threading.Thread(
        target=lambda: answer.append(g.forward(3, transports={"box": transport})), daemon=True
    )
    start = time.monotonic()
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the slice waited for the dead worker's address"
    (value, pid) = answer[0]
    assert value == 3 and pid != pids[address]  # the worker the nanny started anew
    assert time.monotonic() - start < 60
