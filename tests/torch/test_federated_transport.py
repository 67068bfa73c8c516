"""map_clients' transport: tasks and results through a spool in /dev/shm, plain pickle with
fallbacks."""

import concurrent.futures
import glob
import os
import sys
import time

import pytest
import torch

import somatize.torch as st
from somatize.torch import federated as fl
from somatize.torch.federated import spool as sp

needs_shm = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this host")


def odd_tensors(shared, i):
    """A result with every kind of tensor the transport must carry, and plain values."""
    z = torch.complex(torch.arange(3.0), torch.ones(3)) * (i + 1)
    return {
        "i": i + shared,
        "f32": torch.full((64, 64), float(i)),
        "bf16": torch.arange(4, dtype=torch.bfloat16) + i,
        "grad": torch.ones(2, requires_grad=True) * i,  # a tensor in an autograd graph
        "conj": z.conj(),
        "strided": torch.arange(12.0).view(3, 4).t() + i,
        "empty": torch.empty(0, 5),
        "ints": torch.arange(5) * i,
        "param": torch.nn.Parameter(torch.ones(2) * i),
    }


def with_a_lambda(shared, i):
    return {"f": lambda: i + shared, "t": torch.ones(3) * i}  # plain pickle cannot name it


def fails_on_three(shared, i):
    if i == 3:
        raise ValueError("client 3 failed")
    return torch.ones(1000) * i


def spools():
    """This process's spools (another's, a test run beside this one, may come and go)."""
    return set(glob.glob(f"/dev/shm/somatize-results-{os.getpid()}-*"))


def same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert type(a[k]) is type(b[k]) and a[k].dtype == b[k].dtype, k
            assert a[k].shape == b[k].shape and torch.equal(
                a[k].resolve_conj(), b[k].resolve_conj()
            ), k
        else:
            assert a[k] == b[k], k


@pytest.fixture(scope="module")
def pool():
    with st.executor(workers=2) as p:
        yield p


@needs_shm
def test_results_through_the_spool_equal_the_serial_round_and_leave_nothing(pool):
    before = spools()
    tasks = list(range(9))
    out = fl.map_clients(pool, odd_tensors, tasks, shared=100)
    for got, want in zip(out, fl.map_clients(None, odd_tensors, tasks, shared=100)):
        same(got, want)
    assert out[4]["f32"].is_contiguous() and out[4]["f32"][0, 0] == 4
    out[4]["f32"].add_(1)  # results are the caller's own, writable tensors
    assert spools() == before  # the call's spool is removed with it


@needs_shm
def doubled(shared, t):
    return {"t": t["x"] * 2 + shared, "n": t["n"]}


@needs_shm
def test_tasks_go_through_the_spool_too(pool, monkeypatch):
    from somatize.torch.federated import clients

    sent = []  # what each batch's tasks became here, in the parent, before submission

    def ship(values, spool, **kwargs):
        shipped = sp.ship(values, spool, **kwargs)
        if kwargs.get("to_worker"):
            sent.append(shipped)
        return shipped

    monkeypatch.setattr(clients, "ship", ship)
    tasks = [{"x": torch.full((256,), float(i)), "n": i} for i in range(20)]
    out = fl.map_clients(pool, doubled, tasks, shared=1.0)
    assert sent and all(isinstance(s, tuple) for s in sent)  # (path, pickle, sizes): spooled
    assert sum(sum(s[2]) for s in sent) == 20 * 256 * 4  # every task's tensor bytes
    assert [r["n"] for r in out] == list(range(20))
    assert all(torch.equal(r["t"], t["x"] * 2 + 1) for r, t in zip(out, tasks))
    pool_dir = sp.open_spool(pool)
    assert pool_dir is not None
    shipped = sp.ship(tasks, pool_dir, to_worker=True)
    try:
        path, head, sizes = shipped  # the tensors' bytes in a file, the pipe the rest
        assert os.path.dirname(path) == pool_dir
        assert sum(sizes) == 20 * 256 * 4 and len(head) < 4096
        back = sp.unship(shipped, pool_dir)
        assert all(torch.equal(a["x"], b["x"]) for a, b in zip(back, tasks))
    finally:
        sp.remove(pool_dir)


class Task:
    def __init__(self, x):
        self.x = x


def test_what_a_worker_may_not_have_of_main_goes_by_value(tmp_path, monkeypatch):
    # a class of __main__: a worker started by forkserver, or forked before it was
    # defined, has no such name, so what goes to a worker carries the class itself
    monkeypatch.setattr(Task, "__module__", "__main__")
    monkeypatch.setattr(sys.modules["__main__"], "Task", Task, raising=False)
    tasks = [Task(torch.ones(3))]
    to_worker = sp.ship(tasks, str(tmp_path), to_worker=True)
    to_parent = sp.ship(tasks, str(tmp_path))
    monkeypatch.delattr(sys.modules["__main__"], "Task")  # as in that worker
    assert torch.equal(sp.unship(to_worker, str(tmp_path))[0].x, torch.ones(3))
    with pytest.raises(AttributeError):  # results go back by reference, to where they began
        sp.unship(to_parent, str(tmp_path))


@needs_shm
def test_what_plain_pickle_cannot_name_comes_back_by_cloudpickle(pool):
    out = fl.map_clients(pool, with_a_lambda, [1, 2, 3], shared=10)
    assert [r["f"]() for r in out] == [11, 12, 13]
    assert [float(r["t"].sum()) for r in out] == [3.0, 6.0, 9.0]


@needs_shm
def test_a_failing_client_raises_and_its_spool_is_removed(pool):
    before = spools()
    with pytest.raises(ValueError, match="client 3 failed") as info:
        fl.map_clients(pool, fails_on_three, list(range(8)), shared=0, batches=3)
    assert spools() == before
    assert len(info.value.__notes__) == 1  # from the worker, which task of the round it was
    assert info.value.__notes__[0].startswith("map_clients: raised by fn(shared, tasks[3]);")


def test_the_pipe_carries_the_pickle_and_the_spool_the_tensor_bytes(tmp_path):
    spool = str(tmp_path)
    results = [torch.ones(1 << 18) * i for i in range(4)]  # 4 MiB of tensors
    path, head, sizes = sp.ship(results, spool)
    assert os.path.dirname(path) == spool and sum(sizes) == 4 << 20
    assert len(head) < 4096  # not the tensors' bytes
    back = sp.unship((path, head, sizes), spool)
    assert all(torch.equal(a, b) for a, b in zip(back, results))
    assert not os.listdir(spool)  # read once, then removed


def test_without_a_spool_or_room_in_it_results_travel_in_band(tmp_path):
    results = [torch.ones(3), {"a": torch.arange(4)}]
    for spool in (None, str(tmp_path / "gone")):  # none given; removed (the call is over, or full)
        shipped = sp.ship(results, spool)
        assert isinstance(shipped, bytes)
        back = sp.unship(shipped, spool)
        assert torch.equal(back[0], results[0]) and torch.equal(back[1]["a"], results[1]["a"])


def test_a_short_results_file_is_an_error_not_a_torn_result(tmp_path):
    path, head, sizes = sp.ship([torch.ones(1000)], str(tmp_path))
    os.truncate(path, 100)
    with pytest.raises(ValueError, match="holds 100 bytes of 4000"):
        sp.unship((path, head, sizes), str(tmp_path))


def test_a_path_outside_the_calls_spool_is_refused(tmp_path):
    (tmp_path / "a").mkdir()
    path, head, sizes = sp.ship([torch.ones(2)], str(tmp_path / "a"))
    with pytest.raises(ValueError, match="outside this call's spool"):
        sp.unship((path, head, sizes), str(tmp_path))


class Remote(concurrent.futures.Executor):
    """Stands for Dask's executor or any other whose workers may be elsewhere."""


def test_only_pools_on_this_host_get_a_spool(pool):
    assert sp.open_spool(Remote()) is None
    spool = sp.open_spool(pool)
    try:
        assert spool is None or os.path.isdir(spool)
        assert spool is not None or not os.path.isdir("/dev/shm")
    finally:
        if spool:
            os.rmdir(spool)


@needs_shm
def test_spools_left_by_a_killed_process_are_removed_by_the_next_call(pool):
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid names no process now
    stale = f"/dev/shm/{sp._PREFIX}{dead.pid}-test"
    fresh = f"/dev/shm/{sp._PREFIX}{dead.pid}-fresh"  # touched lately: maybe a live one
    mine = f"/dev/shm/{sp._PREFIX}{os.getpid()}-test"  # this process's: in use
    for d in (stale, fresh, mine):
        os.makedirs(d, exist_ok=True)
        open(os.path.join(d, "batch"), "wb").close()
    an_hour_ago = time.time() - 3600
    for d in (stale, mine):
        os.utime(d, (an_hour_ago, an_hour_ago))
    try:
        fl.map_clients(pool, odd_tensors, [1, 2], shared=0)
        assert not os.path.exists(stale)
        assert os.path.exists(fresh) and os.path.exists(mine)
    finally:
        for d in (stale, fresh, mine):
            if os.path.exists(d):
                for f in os.listdir(d):
                    os.unlink(os.path.join(d, f))
                os.rmdir(d)


class Unpicklable(Exception):
    """An exception pickle cannot rebuild: its __init__ takes two arguments, its args one."""

    def __init__(self, code, why):
        super().__init__(f"{code}: {why}")


def fails_two_ways(shared, i):
    if i == 2:
        raise ValueError(f"client {i} failed")
    if i == 5:
        raise Unpicklable(i, "its own exception type")
    return {"t": torch.full((64,), float(i)) * shared, "i": i}


@needs_shm
def test_failures_returned_from_workers_match_the_serial_round(pool):
    before = spools()
    tasks = list(range(8))
    serial = fl.map_clients(None, fails_two_ways, tasks, shared=1.5, errors="return")
    pooled = fl.map_clients(pool, fails_two_ways, tasks, shared=1.5, batches=3, errors="return")
    assert spools() == before
    for i, (a, b) in enumerate(zip(serial, pooled)):
        if i in (2, 5):
            assert isinstance(a, fl.ClientFailure) and isinstance(b, fl.ClientFailure)
            assert a.index == b.index == i and "in fails_two_ways" in b.traceback
        else:
            same(a, b)  # the clients that trained: bit-identical to the serial round
    assert type(pooled[2].error) is ValueError and str(pooled[2].error) == "client 2 failed"
    assert pooled[2].error.__notes__[0].startswith("map_clients: raised by fn(shared, tasks[2]);")
    assert type(serial[5].error) is Unpicklable  # here, the exception itself
    assert type(pooled[5].error) is RuntimeError  # from a worker: one that can cross, naming it
    assert "raised Unpicklable: 5: its own exception type" in str(pooled[5].error)
    assert "cannot be pickled back" in str(pooled[5].error)
    assert pooled[5].error.__notes__[0].startswith("map_clients: raised by fn(shared, tasks[5]);")
    # the pool goes on with the next round
    assert [r["i"] for r in fl.map_clients(pool, fails_two_ways, [0, 1], shared=1.0)] == [0, 1]
