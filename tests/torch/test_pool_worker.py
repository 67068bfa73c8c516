"""A pool worker: what it raises reaches the parent as a task's failure; it dies with its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest
import torch

import somatize.torch as st
from somatize.torch import federated as fl


class Diverged(Exception):
    """An exception that pickles but does not unpickle: ``__init__`` takes two arguments
    and passes ``super().__init__`` one (a common way to write a custom exception)."""

    def __init__(self, client, loss):
        super().__init__(f"client {client} diverged: loss {loss}")

    def __reduce__(self):
        # BaseException's own, spelled out: tblib, which importing dask.distributed installs
        # for every exception class, rebuilds the default's case without __init__ (so
        # such an exception crosses once another test has imported it), not this one
        return type(self), self.args


def diverges_on_two(job):
    """Run ``i``: log that it ran (to count re-runs), raise ``Diverged`` for 2."""
    i, log = job
    with open(log, "a") as f:
        f.write(f"{i}\n")
    if i == 2:
        raise Diverged(i, float("nan"))
    return i


def client(shared, c):
    if c == 2:
        raise Diverged(c, float("nan"))
    return shared + c


def _ran(log):
    with open(log) as f:
        return sorted(int(line) for line in f)


@pytest.mark.slow
def test_an_exception_that_does_not_unpickle_fails_its_run_once_not_the_pool(tmp_path):
    log = str(tmp_path / "ran")
    jobs = [(i, log) for i in range(4)]
    with st.executor(workers=2) as pool:
        runs = st.run_all(pool, diverges_on_two, jobs, errors="return")
        assert pool.restarts == 0  # no worker was taken for dead
        assert _ran(log) == [0, 1, 2, 3]  # the failing run ran once; nothing was re-run
        assert runs.lost == {} and list(runs.failed) == [2] and runs.finished == [0, 1, 3]
        error = runs.failed[2]
        assert type(error) is RuntimeError
        message = str(error)
        assert (
            "diverges_on_two((2, '" in message  # the call, its plain arguments shown
            and "Diverged: client 2 diverged: loss nan" in message
        )
        assert (
            "cannot be pickled back from the worker" in message and "super().__init__()" in message
        )
        notes = "".join(error.__notes__)
        assert "raise Diverged(i, float" in notes  # the worker's traceback, kept
        assert "fn(items[2])" in notes  # run_all names the item
        with pytest.raises(RuntimeError, match="Diverged: client 2") as raised:
            st.run_all(pool, diverges_on_two, jobs)  # errors="raise": the same, raised
        assert "fn(items[2])" in "".join(raised.value.__notes__)
        with pytest.raises(RuntimeError, match=r"call \d+, diverges_on_two\(\(2, '.*'\)\), raised"):
            pool.submit(diverges_on_two, (2, log)).result()
        with pytest.raises(ZeroDivisionError):  # one that unpickles arrives as itself
            pool.submit(divmod, 1, 0).result()
        assert pool.restarts == 0


def _rebuilt_outside(parent):
    if os.getpid() == parent:
        raise LookupError("no such class here")
    return RebuiltOutside(parent)


class RebuiltOutside:
    """A result that pickles in the worker but does not unpickle in the parent (as one of a
    class the parent cannot import would)."""

    def __init__(self, parent):
        self.parent = parent

    def __reduce__(self):
        return _rebuilt_outside, (self.parent,)


def returns(job):
    i, parent = job
    if i == 1:
        return RebuiltOutside(parent)
    if i == 2:
        return lambda: i  # no pickle for a lambda
    return {"w": torch.full((3,), float(i))}


@pytest.mark.slow
def test_a_result_that_does_not_travel_back_fails_its_run_once_not_the_pool():
    jobs = [(i, os.getpid()) for i in range(4)]
    with st.executor(workers=2) as pool:
        runs = st.run_all(pool, returns, jobs, errors="return")
        assert pool.restarts == 0  # before: the pool broke, and took calls 1 and 2 as lost
    assert runs.lost == {} and sorted(runs.failed) == [1, 2]
    assert [r["w"].tolist() for r in runs.finished] == [[0.0] * 3, [3.0] * 3]
    unpickled = runs.failed[1]
    assert type(unpickled) is RuntimeError
    assert "result came back from its worker but cannot be unpickled in this process" in str(
        unpickled
    )
    assert "LookupError: no such class here" in str(unpickled)
    unpicklable = runs.failed[2]
    assert "the call's result (a function) is pickled to go back" in "".join(unpicklable.__notes__)


@pytest.mark.slow
def test_an_exception_of_a_class_shipped_by_value_arrives_as_itself_naming_its_task():
    class Local(Exception):  # shipped with the function by cloudpickle, as __main__'s are
        pass

    def run(x):
        if x == 1:
            raise Local(f"bad config {x}")
        return x

    with st.executor(workers=1) as pool:
        runs = st.run_all(pool, run, range(3), errors="return")
        with pytest.raises(Local, match="bad config 1"):  # before: a RuntimeError naming it
            pool.submit(run, 1).result()
    assert runs.finished == [0, 2] and runs.lost == {}
    assert type(runs.failed[1]) is Local and str(runs.failed[1]) == "bad config 1"
    assert "raised by fn(items[1])" in runs.failed[1].__notes__[0]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["st.executor", "ProcessPoolExecutor"])
def test_map_clients_raises_a_client_error_that_does_not_unpickle_as_a_runtime_error(kind):
    pool = st.executor(workers=2) if kind == "st.executor" else ProcessPoolExecutor(2)
    with pool:
        with pytest.raises(RuntimeError, match="Diverged: client 2 diverged") as raised:
            fl.map_clients(pool, client, [0, 1, 2, 3], shared=10)
        assert "fn(shared, tasks[2])" in str(raised.value)
        assert "raise Diverged(c, float" in "".join(raised.value.__notes__)
        out = fl.map_clients(pool, client, [0, 1, 2, 3], shared=10, errors="return")
        assert out[:2] == [10, 11] and out[3] == 13
        assert isinstance(out[2], fl.ClientFailure) and "Diverged" in str(out[2].error)
        assert fl.map_clients(pool, client, [0, 1], shared=10) == [10, 11]  # not broken
        assert getattr(pool, "restarts", 0) == 0


def test_on_threads_a_raised_client_error_is_not_pickled_and_arrives_as_itself():
    with ThreadPoolExecutor(2) as pool, pytest.raises(Diverged, match="client 2 diverged"):
        fl.map_clients(pool, client, [0, 1, 2, 3], shared=10)
    with ThreadPoolExecutor(2) as pool:  # a ClientFailure is shipped back with the results
        out = fl.map_clients(pool, client, [0, 1, 2, 3], shared=10, errors="return")
    assert type(out[2].error) is RuntimeError and "Diverged: client 2" in str(out[2].error)


def _scaled(x):
    def fn(shared, t):
        return t * x

    return fn


@pytest.mark.slow
def test_a_closure_on_a_plain_process_pool_says_to_use_st_executor():
    with ProcessPoolExecutor(1) as pool, pytest.raises(Exception, match="pickle") as raised:
        fl.map_clients(pool, _scaled(0.5), [1, 2])
    notes = "".join(raised.value.__notes__)
    assert "_scaled.<locals>.fn cannot be pickled" in notes
    assert "st.executor(...)" in notes and "module level" in notes
    with st.executor(workers=1) as pool:  # which ships it
        assert fl.map_clients(pool, _scaled(0.5), [1, 2]) == [0.5, 1.0]


_HOLDER = """
import os, sys, time
import torch
import somatize.torch as st

def hold(path):
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(path + ".tmp", path)
    time.sleep(300)

if __name__ == "__main__":
    torch.set_num_threads(1)
    out, method = sys.argv[1], sys.argv[2]
    with st.executor(workers=2, start_method=method) as pool:
        futures = [pool.submit(hold, os.path.join(out, f"w{i}")) for i in range(4)]
        for f in futures:
            f.result()
"""


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited; whoever adopted it may not reap it


def _poll(condition, timeout):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_workers_exit_when_their_parent_is_killed(tmp_path, subprocess_env, method):
    script = tmp_path / "campaign.py"
    script.write_text(textwrap.dedent(_HOLDER))
    parent = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), method], env=subprocess_env
    )
    pids: list[int] = []
    try:
        files = [tmp_path / "w0", tmp_path / "w1"]
        assert _poll(lambda: all(f.exists() for f in files), 120), "the workers never started"
        pids = [int(f.read_text()) for f in files]
        assert all(_alive(p) for p in pids)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert _poll(lambda: not any(_alive(p) for p in pids), 60), "workers outlived their parent"
        assert not (tmp_path / "w2").exists()  # the queued runs were not run for nobody
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
