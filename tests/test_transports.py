"""Transports over real executors: a process pool, a Dask local cluster, Dask started by hand."""

import concurrent.futures as cf
import importlib.util
import multiprocessing
import os
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest

import somatize.shipping
from somatize import DiskKeeper, Done, Graph, Node, Recorder
from somatize.errors import TransportError
from somatize.transports import ExecutorTransport, InProcess, Transport
from somatize.watchers import CacheHit

REPO = Path(__file__).resolve().parents[1]


class Inc(Node):
    def __init__(self, k: int = 1):
        self.k = k

    def forward(self, x, ctx):
        return Done(x + self.k)


class Where(Node):
    """Scales its input and says which process ran it."""

    def __init__(self, factor: int):
        self.factor = factor

    def forward(self, x, ctx):
        return Done({"value": x * self.factor, "pid": os.getpid()})


class Finish(Node):
    def forward(self, d, ctx):
        return Done([d["value"] + 1, d["pid"]])


class Boom(Node):
    def forward(self, x, ctx):
        raise ZeroDivisionError(f"boom on {x}")


class Die(Node):
    """Kills the process it runs in, as a crashed worker would."""

    def forward(self, x, ctx):
        os._exit(1)


class Importable(Node):
    """Reports whether the module that defines this class can be imported where it runs."""

    def __init__(self, k: int):
        self.k = k

    def forward(self, x, ctx):
        try:
            found = importlib.util.find_spec(type(self).__module__) is not None
        except ModuleNotFoundError:  # "tests.test_transports" without a "tests" package
            found = False
        return Done([x * self.k, found])


class FractionCodec:
    """Writes fractions down, so they cross edges (and hosts) as data."""

    tag = "fraction"

    def accepts(self, value):
        return type(value) is Fraction

    def check(self, value):
        pass

    def chunks(self, value):
        return (f"{value.numerator}/{value.denominator}".encode(),)

    def decode(self, payload):
        return Fraction(payload.decode())

    def fingerprint(self, obj):
        return None


class Half(Node):
    def forward(self, x, ctx):
        return Done([Fraction(v, 2) if isinstance(v, int) else v / 2 for v in x])


def where_graph() -> Graph:
    g = Graph.somatize(Inc() >> Where(10).with_id("far") >> Finish())
    return g.place("far", host="box")


def spawn_pool(workers: int) -> cf.ProcessPoolExecutor:
    return cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


@pytest.fixture(scope="module")
def pool():
    with spawn_pool(2) as p:
        yield p


def test_stock_transports_match_the_protocol():
    assert isinstance(InProcess(), Transport)
    assert isinstance(ExecutorTransport(cf.ThreadPoolExecutor(1)), Transport)
    with pytest.raises(ValueError, match=r"ExecutorTransport\(retries=-1\): give an int of 0"):
        ExecutorTransport(cf.ThreadPoolExecutor(1), retries=-1)
    with pytest.raises(TypeError, match=r"ExecutorTransport\(timeout='5'\): give seconds as a"):
        ExecutorTransport(cf.ThreadPoolExecutor(1), timeout="5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"ExecutorTransport\(timeout=0\): give seconds above 0"):
        ExecutorTransport(cf.ThreadPoolExecutor(1), timeout=0)


# -- a process pool -------------------------------------------------------------------------


def test_a_process_pool_gives_the_in_process_result_from_another_process(pool):
    t = ExecutorTransport(pool)
    value, pid = where_graph().forward(2, transports={"box": t})
    assert value == Graph.somatize(Inc() >> Where(10) >> Finish()).forward(2)[0] == 31
    assert pid != os.getpid()
    for _ in range(4):  # later runs send the digest alone; a worker lacking it gets the bytes
        assert where_graph().forward(2, transports={"box": t})[0] == 31
    assert 1 <= t.shipped <= 2  # once per worker at most


def test_codec_values_cross_hosts_with_the_codecs_shipped_alongside(pool):
    g = Graph.somatize(Half() >> Half().with_id("far") >> Half(), codecs=[FractionCodec()])
    local = g.forward([1, 3])
    g.place("far", host="box")
    assert g.forward([1, 3], transports={"box": ExecutorTransport(pool)}) == local
    assert local == [Fraction(1, 8), Fraction(3, 8)]


def test_a_worker_dying_mid_slice_is_a_transport_error_naming_the_slice():
    g = Graph.somatize(Inc() >> Die()).place("die", host="box")
    with spawn_pool(1) as p:
        t = ExecutorTransport(p, retries=2)
        with pytest.raises(TransportError, match=r"slice 2 on host 'box' \(die\)") as info:
            g.forward(1, transports={"box": t})
    message = str(info.value)
    assert "tried 3 time(s) with retries=2" in message
    assert "BrokenProcessPool" in message and "stays broken" in message
    assert "st.executor(workers=...)" in message  # (which re-runs it on a fresh pool)


def keys_of_a_cached_graph(x: int) -> tuple[str | None, tuple[str, str, str]]:
    """The output key of a cached graph, and the parts of its last node (in any process)."""
    g = Graph.somatize(Inc(3) >> Where(5).with_id("slow")).cache("slow")
    return g.run(x).key, g.keys.parts(g["slow"])


def test_keys_are_the_same_in_another_process():
    here = keys_of_a_cached_graph(4)
    with spawn_pool(1) as p:  # a fresh interpreter, another PYTHONHASHSEED
        there = p.submit(keys_of_a_cached_graph, 4).result()
    assert there == here
    assert here[0] is not None and len(here[0]) == 64


def test_a_slice_on_a_pool_caches_in_the_disk_keeper_of_its_host(pool, tmp_path):
    (key, _) = keys_of_a_cached_graph(4)
    rec = Recorder()
    g = Graph.somatize(Inc(3) >> Where(5).with_id("slow"), watchers=[rec]).cache("slow")
    g.place("slow", host="box")
    t = ExecutorTransport(pool, keeper=tmp_path / "box-cache")
    first = g.forward(4, transports={"box": t})
    assert list(DiskKeeper(tmp_path / "box-cache").keys()) == [key]
    assert g.forward(4, transports={"box": t}) == first  # the worker's pid, from its cache
    assert [(e.node, e.key) for e in rec.of(CacheHit)] == [("slow", key)]


# -- retries and failures, with executors that fail on purpose ------------------------------


class Flaky(cf.Executor):
    """Loses the first ``failures`` submissions as a dead worker would; runs the rest here."""

    def __init__(self, failures: int):
        self.failures = failures
        self.calls = 0

    def submit(self, fn, /, *args, **kwargs):
        self.calls += 1
        future: cf.Future = cf.Future()
        if self.calls <= self.failures:
            future.set_exception(ConnectionResetError("worker lost"))
            return future
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as e:
            future.set_exception(e)
        return future


def test_retries_recover_from_lost_workers_and_are_bounded():
    g = Graph.somatize(Inc() >> Inc(2).with_id("far")).place("far", host="box")
    ok = Flaky(failures=2)
    assert g.forward(1, transports={"box": ExecutorTransport(ok, retries=2)}) == 4
    assert ok.calls == 3

    lost = Flaky(failures=10)
    with pytest.raises(TransportError, match=r"slice 2 on host 'box' \(far\)") as info:
        g.forward(1, transports={"box": ExecutorTransport(lost, retries=2)})
    assert lost.calls == 3
    assert "ConnectionResetError: worker lost" in str(info.value)
    assert "tried 3 time(s) with retries=2" in str(info.value)


def test_an_executor_that_was_shut_down_is_said_so_and_not_retried():
    # before: retried, then "its worker was lost or did not answer ... retry: retries=N"
    g = Graph.somatize(Inc() >> Inc(2).with_id("far")).place("far", host="box")
    pool = cf.ThreadPoolExecutor(1)
    pool.shutdown()
    with pytest.raises(TransportError, match=r"slice 2 on host 'box' \(far\).*shut down") as info:
        g.forward(1, transports={"box": ExecutorTransport(pool, retries=3)})
    assert "tried" not in str(info.value) and "running executor" in str(info.value)


def test_node_errors_come_back_unchanged_and_are_never_retried():
    g = Graph.somatize(Inc() >> Boom()).place("boom", host="box")
    ex = Flaky(failures=0)
    with pytest.raises(ZeroDivisionError, match="boom on 2"):
        g.forward(1, transports={"box": ExecutorTransport(ex, retries=5)})
    assert ex.calls == 1


def test_code_is_sent_once_and_again_to_a_worker_that_lacks_it():
    g = Graph.somatize(Inc() >> Inc(2).with_id("far")).place("far", host="box")
    ex = Flaky(failures=0)
    t = ExecutorTransport(ex)
    for _ in range(3):
        assert g.forward(1, transports={"box": t}) == 4
    assert (ex.calls, t.shipped) == (3, 1)
    somatize.shipping._bundles.clear()  # as if a fresh worker took the next slice
    assert g.forward(1, transports={"box": t}) == 4
    assert (ex.calls, t.shipped) == (5, 2)  # digest alone, "missing", then the bytes
    g["far"].k = 5  # a node whose state changed is pickled and sent again
    assert g.forward(1, transports={"box": t}) == 7
    assert t.shipped == 3


class Stalled(cf.Executor):
    """Accepts work and never answers."""

    def __init__(self):
        self.calls = 0

    def submit(self, fn, /, *args, **kwargs):
        self.calls += 1
        return cf.Future()


def test_a_worker_that_does_not_answer_times_out_and_is_retried():
    g = Graph.somatize(Inc(2).with_id("far")).place("far", host="box")
    ex = Stalled()
    with pytest.raises(TransportError, match=r"no reply within timeout=0.05s.*tried 2 time") as e:
        g.forward(1, transports={"box": ExecutorTransport(ex, retries=1, timeout=0.05)})
    assert ex.calls == 2
    assert "may still be running on its worker" in str(e.value)  # (and shutdown waits for it)


def test_a_node_that_cannot_be_pickled_is_named():  # (and is not warned of: it is not cached)
    class Holds(Node):
        def __init__(self):
            self.lock = __import__("threading").Lock()

        def forward(self, x, ctx):
            return Done(x)

    g = Graph.somatize(Inc() >> Holds()).place("holds", host="box")
    with pytest.raises(TransportError, match=r"node 'holds' \(.*Holds\) cannot be pickled"):
        g.forward(1, transports={"box": InProcess()})


# -- Dask ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dask_client():
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",  # a free port: 8787 may be taken
            # the scheduler's HTTP server would take port 8787, and warn if it is taken
            scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client


@pytest.mark.slow
def test_a_dask_worker_pinned_as_a_host_runs_the_slice_in_its_process(dask_client):
    pids = dask_client.run(os.getpid)  # worker address -> pid
    address = sorted(pids)[1]
    t = ExecutorTransport(dask_client.get_executor(workers=[address]))
    for _ in range(3):
        value, pid = where_graph().forward(2, transports={"box": t})
        assert (value, pid) == (31, pids[address])
    assert t.shipped == 1
    assert pid != os.getpid()


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float = 60) -> None:
    """Until ``path`` exists; fails early if ``proc`` exits."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {seconds}s")
        try:
            code = proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            continue
        raise AssertionError(f"{proc.args[:2]} exited with {code} before writing {path}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


@pytest.mark.slow
def test_code_travels_by_value_to_a_dask_worker_that_cannot_import_the_test(tmp_path):
    distributed = pytest.importorskip("distributed")
    dask = str(Path(sys.executable).parent / "dask")
    if not os.path.exists(dask):
        pytest.skip(f"no dask command next to {sys.executable}")
    path = tmp_path / "path"  # on the workers' path: somatize, and nothing of tests/
    path.mkdir()
    (path / "somatize").symlink_to(REPO / "somatize")
    env = {**os.environ, "PYTHONPATH": str(path)}
    scheduler_file = tmp_path / "scheduler.json"
    log = (tmp_path / "dask.log").open("wb")
    procs = []
    try:
        common = {"cwd": tmp_path, "env": env, "stdout": log, "stderr": subprocess.STDOUT}
        scheduler = subprocess.Popen(
            [dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
             "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(scheduler_file)],
            **common,
        )  # fmt: skip
        procs.append(scheduler)
        _wait_for(scheduler_file, scheduler)
        worker = subprocess.Popen(
            [dask, "worker", "--scheduler-file", str(scheduler_file), "--host", "127.0.0.1",
             "--name", "box", "--nthreads", "1", "--no-dashboard", "--no-nanny",
             "--dashboard-address", "127.0.0.1:0"],
            **common,
        )  # fmt: skip
        procs.append(worker)
        with distributed.Client(scheduler_file=str(scheduler_file), timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
            g = Graph.somatize(Inc() >> Importable(7).with_id("far")).place("far", host="box")
            t = ExecutorTransport(client.get_executor(workers=["box"]))  # pinned by name
            assert g.forward(1, transports={"box": t}) == [14, False]
            assert Importable(7).forward(2, None).value == [14, True]  # importable here
    finally:
        for proc in reversed(procs):
            _stop(proc)
        log.close()
    assert all(proc.returncode is not None for proc in procs)


def test_the_note_on_a_value_that_cannot_leave_a_worker_comes_back(pool):
    from somatize.errors import ValueConversionError
    from tests.distribute_nodes import Bag, Inc

    g = Graph.somatize(Bag() >> Inc()).place("bag", host="box")
    with pytest.raises(ValueConversionError) as e:
        g.forward(1, transports={"box": ExecutorTransport(pool)})
    assert "node 'bag' runs on host 'box'" in e.value.__notes__[-1]


SCALE = 3


class Scaled(Node):
    def forward(self, x, ctx):
        return Done(x * SCALE)


def test_a_global_rebound_or_a_method_patched_reaches_the_worker(pool, monkeypatch):
    # the code is sent again when the node's key parts change, not only its state
    t = ExecutorTransport(pool)
    g = Graph.somatize(Scaled()).place("scaled", host="box")
    assert g.forward(2, transports={"box": t}) == 6
    monkeypatch.setattr(sys.modules[__name__], "SCALE", 7)
    assert g.forward(2, transports={"box": t}) == 14
    monkeypatch.setattr(Scaled, "forward", lambda self, x, ctx: Done(-x))
    assert g.forward(2, transports={"box": t}) == -2
    assert t.shipped >= 3


def test_a_forked_worker_runs_the_code_it_is_sent_not_what_this_process_loaded(monkeypatch):
    # a fork inherits the bundles this process loaded (InProcess), which hold its live classes
    g = Graph.somatize(Scaled()).place("scaled", host="box")
    assert g.forward(2, transports={"box": InProcess()}) == 6
    monkeypatch.setattr(Scaled, "forward", lambda self, x, ctx: Done(-x))
    assert g.forward(2, transports={"box": InProcess()}) == -2
    monkeypatch.undo()
    fork = multiprocessing.get_context("fork")
    with cf.ProcessPoolExecutor(1, mp_context=fork) as forked:
        assert g.forward(2, transports={"box": ExecutorTransport(forked)}) == 6
