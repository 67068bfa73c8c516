"""fl.map_clients: the shared value pickled once, results in task order, errors named or
returned as ClientFailure, and batches that taper so the workers finish together."""

import concurrent.futures
import os
import pickle
import signal

import pytest
import torch

import somatize.torch as st
from somatize.errors import AggregationError
from somatize.torch import federated as fl

PICKLED, UNPICKLED = [], []


def _shared(value):
    UNPICKLED.append(value)
    return Shared(value)


class Shared:
    """A shared value that counts how often it is pickled and unpickled."""

    def __init__(self, value):
        self.value = value

    def __reduce__(self):
        PICKLED.append(1)
        return (_shared, (self.value,))


class PicklingPool(concurrent.futures.Executor):
    """An executor that pickles every call, as a process pool does, and runs it here."""

    _max_workers = 3

    def __init__(self):
        self.calls = 0

    def submit(self, fn, /, *args, **kwargs):
        self.calls += 1
        fn, args = pickle.loads(pickle.dumps((fn, args)))
        f = concurrent.futures.Future()
        f.set_result(fn(*args, **kwargs))
        return f


def plus(shared, task):
    return shared.value + task


def test_map_clients_pickles_the_shared_value_once_and_returns_results_in_task_order():
    PICKLED.clear(), UNPICKLED.clear()
    tasks = list(range(100))
    pool = PicklingPool()
    out = fl.map_clients(pool, plus, tasks, shared=Shared(1000))
    assert out == [1000 + t for t in tasks]
    # a few batches per worker (balanced by the pool), the shared value pickled once and,
    # here where every batch runs in one process, unpickled once: not once per client task
    assert pool.calls == 3 * fl.clients._PER_WORKER
    assert len(PICKLED) == 1 and UNPICKLED == [1000]
    # the next round's value is unpickled afresh, not the last one reused
    assert fl.map_clients(pool, plus, tasks[:5], shared=Shared(2000)) == [
        2000 + t for t in tasks[:5]
    ]
    assert UNPICKLED == [1000, 2000]
    PICKLED.clear()
    sizes = [1] * 99 + [100]
    pool = PicklingPool()
    assert fl.map_clients(pool, plus, tasks, shared=Shared(0), batches=2, sizes=sizes) == tasks
    assert len(PICKLED) == 1 and pool.calls == 2
    assert fl.map_clients(None, plus, tasks, shared=Shared(5)) == [5 + t for t in tasks]
    with pytest.raises(ValueError, match=r"map_clients\(sizes=\.\.\.\): 1 sizes for 100 tasks"):
        fl.map_clients(PicklingPool(), plus, tasks, shared=Shared(0), sizes=[1])
    with pytest.raises(ValueError, match="batches must be a positive int"):
        fl.map_clients(PicklingPool(), plus, tasks, shared=Shared(0), batches=0)
    with pytest.raises(TypeError, match=r"tasks holds one entry per client .*not 42 \(int\)"):
        fl.map_clients(None, plus, 42, shared=Shared(0))  # type: ignore[arg-type]


def fails_on_seven(shared, task):
    if task == 7:
        raise KeyError("client data missing")
    return task


@pytest.mark.parametrize("where", ["serial", "pickling", "threads"])
def test_an_exception_names_the_task_that_raised_it(where):
    threads = concurrent.futures.ThreadPoolExecutor(2)
    pool = {"serial": None, "pickling": PicklingPool(), "threads": threads}[where]
    with threads, pytest.raises(KeyError, match="client data missing") as info:
        fl.map_clients(pool, fails_on_seven, list(range(10)), shared=0, batches=3)
    assert info.value.__notes__ == [
        "map_clients: raised by fn(shared, tasks[7]); run that task with pool=None to debug it"
    ]


def fails_on_three_and_seven(shared, task):
    if task in (3, 7):
        raise KeyError(f"client {task}'s data missing")
    return {"w": torch.full((3,), float(task + shared))}


@pytest.mark.parametrize("where", ["serial", "pickling", "threads"])
def test_with_errors_return_a_failing_client_fills_its_slot_and_the_others_run(where):
    threads = concurrent.futures.ThreadPoolExecutor(2)
    pool = {"serial": None, "pickling": PicklingPool(), "threads": threads}[where]
    with threads:
        out = fl.map_clients(pool, fails_on_three_and_seven, list(range(10)), shared=1,
                             batches=3, errors="return")  # fmt: skip
    failed = [r for r in out if isinstance(r, fl.ClientFailure)]
    assert [f.index for f in failed] == [3, 7] and [out.index(f) for f in failed] == [3, 7]
    for f in failed:
        assert type(f.error) is KeyError and f"client {f.index}'s data missing" in str(f.error)
        assert f.error.__notes__ == [
            f"map_clients: raised by fn(shared, tasks[{f.index}]); run that task with pool=None "
            "to debug it"
        ]
        assert "in fails_on_three_and_seven" in f.traceback and "KeyError" in f.traceback
        assert repr(f).startswith(f"ClientFailure(tasks[{f.index}]: KeyError(")
    ok = [r for r in out if not isinstance(r, fl.ClientFailure)]
    assert [float(r["w"][0]) for r in ok] == [1, 2, 3, 5, 6, 7, 9, 10]
    with pytest.raises(ValueError, match=r"errors must be 'raise'.*'return'.*not 'skip'"):
        fl.map_clients(pool, fails_on_three_and_seven, [1], errors="skip")


def test_aggregators_refuse_a_failure_and_say_how_to_drop_it():
    out = fl.map_clients(None, fails_on_three_and_seven, list(range(5)), shared=0,
                         errors="return")  # fmt: skip
    idiom = r"results = \[r for r in results if not isinstance\(r, fl.ClientFailure\)\]"
    for aggregate in (
        lambda rs: st.fedavg(rs, weights="uniform"),
        fl.fedmedian,
        lambda rs: fl.clip(rs, {"w": torch.zeros(3)}, max_norm=1.0),
        lambda rs: fl.weighted_metrics(
            [r if isinstance(r, fl.ClientFailure) else (1, {"a": 1.0}) for r in rs]
        ),
    ):
        with pytest.raises(AggregationError, match=r"client 3 did not train.*tasks\[3\] raised "
                           r"KeyError.*" + idiom):  # fmt: skip
            aggregate(out)
    ok = [r for r in out if not isinstance(r, fl.ClientFailure)]  # the idiom
    mean = st.fedavg(ok, weights="uniform")["w"]
    assert torch.equal(mean, torch.full((3,), (0 + 1 + 2 + 4) / 4))


def test_map_clients_batches_taper_so_the_workers_finish_together():
    from somatize.torch.federated.clients import _TAIL, _batches, _shares

    groups = _batches(1000, _shares(8, 2), None)
    lengths = [len(g) for g in groups]
    assert sorted(i for g in groups for i in g) == list(range(1000))  # each task once
    assert lengths == sorted(lengths, reverse=True) and len(lengths) == 8
    assert lengths[-1] == pytest.approx(lengths[0] * _TAIL, rel=0.1)
    assert all(g[0] < 50 and g[-1] > 950 for g in groups)  # each spans the task list
    # one batch per worker (or fewer): equal shares
    assert [len(g) for g in _batches(100, _shares(2, 2), None)] == [50, 50]
    # by sizes: the largest tasks first, and no batch left empty
    sizes = [1.0] * 99 + [100.0]
    assert _batches(100, _shares(2, 2), sizes) == [[99], list(range(99))]
    assert _batches(3, _shares(8, 2), [3, 2, 1]) == [[0], [1], [2]]
    # one batch per worker: the longest tasks first, each where it finishes soonest
    assert _batches(6, _shares(2, 2), [10, 9, 8, 1, 1, 1]) == [[0, 3, 4, 5], [1, 2]]
    tapered = _batches(200, _shares(8, 2), [1.0 + i % 7 for i in range(200)])
    loads = [sum(1.0 + i % 7 for i in g) for g in tapered]
    assert loads == sorted(loads, reverse=True) and loads[-1] < loads[0] / 4


def test_map_clients_sends_a_large_shared_value_in_fewer_batches():
    # the shared value's bytes travel with every batch: past _SHIPPED per round, fewer batches
    assert fl.clients._default_batches(2, 1000, 1 << 10) == 2 * fl.clients._PER_WORKER
    assert fl.clients._default_batches(2, 1000, fl.clients._SHIPPED // 2) == 2
    assert fl.clients._default_batches(2, 1000, fl.clients._SHIPPED * 4) == 2  # one each
    assert fl.clients._default_batches(8, 3, 1) == 3  # never more batches than tasks


# map_clients on st.executor and on Dask, bitwise against the serial round: test_federated_recipes.py


def _add_or_die(shared, task):
    """``shared["w"] + x.sum()``; kill this worker first on the task ``die`` (once)."""
    x, die, marker = task
    if die and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return {"w": shared["w"] + x.sum()}


@pytest.mark.slow
def test_a_worker_killed_in_a_round_of_tensor_tasks_costs_one_rerun(tmp_path):
    """Found by an outside audit: the batch's tasks travel in a /dev/shm file the worker
    removed once read, so the re-run of a killed worker's batch failed with a
    FileNotFoundError naming that file."""
    marker = str(tmp_path / "died")
    tasks = [(torch.ones(4) * i, i == 3, marker) for i in range(8)]
    with st.executor(workers=2) as pool:
        out = fl.map_clients(pool, _add_or_die, tasks, shared={"w": torch.zeros(3)})
        assert pool.restarts == 1
    assert [float(o["w"][0]) for o in out] == [4.0 * i for i in range(8)]
    assert os.path.exists(marker)


def test_a_client_with_no_examples_fails_the_round_unless_errors_return_drops_it():
    """docs/federated.md: an empty client (min_size=0) never reaches fedavg — Trainer.fit
    refuses it, and under errors='raise' one drawn fails the whole round."""
    from somatize import Graph
    from tests.torch.federated_helpers import Linear

    x, y = torch.randn(12, 4), torch.randint(0, 3, (12,))
    parts = [list(range(6)), [], list(range(6, 12))]  # client 1 holds nothing

    def train(global_state, part):
        torch.manual_seed(0)
        g = Graph.somatize(Linear(4, 3))
        st.load_state(g, global_state)
        data = [(x[part], y[part])] if part else []
        trainer = st.Trainer(
            loss=torch.nn.functional.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            options=st.Options(progress=False),
        )
        return trainer.fit(g, data)

    torch.manual_seed(0)
    shared = st.state(Graph.somatize(Linear(4, 3)))
    with pytest.raises(ValueError, match="yielded no batches"):
        fl.map_clients(None, train, parts, shared=shared)
    results = fl.map_clients(None, train, parts, shared=shared, errors="return")
    assert isinstance(results[1], fl.ClientFailure) and results[1].index == 1
    done = [r for r in results if not isinstance(r, fl.ClientFailure)]
    assert st.fedavg(done).weights == (0.5, 0.5)


def _die_at_2(shared, c):
    if c == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return shared + c


@pytest.mark.slow
@pytest.mark.parametrize("errors", ["raise", "return"])
def test_a_worker_that_dies_past_its_retries_fails_the_call_naming_the_tasks(errors):
    """docs/federated.md: a dead worker is not a client's error (no ClientFailure), and the
    WorkerLostError, which names the executor's call, says which tasks that call ran."""
    from somatize.errors import WorkerLostError

    with st.executor(workers=2) as pool, pytest.raises(WorkerLostError) as e:
        fl.map_clients(pool, _die_at_2, [0, 1, 2, 3], shared=10, batches=4, errors=errors)
    assert "map_clients: that call was the batch of tasks [2]; run them with pool=None" in (
        "\n".join(getattr(e.value, "__notes__", []))
    )


class CountedClient:
    """A client that counts how often this process pickles it (the workers unpickle it)."""

    pickled = 0

    def __call__(self, shared, task):
        return shared["w"] + task

    def __reduce__(self):
        type(self).pickled += 1
        return (CountedClient, ())


@pytest.mark.slow
def test_on_st_executor_the_client_is_pickled_once_per_call_not_once_per_batch():
    """Found by a student's federated script: its client, a function of __main__, goes by
    value, and cloudpickle scans every imported module for each such function (4.5 ms for a
    client of a few helpers, with torch's compiler stack imported). Once per batch, that
    was most of the parent's CPU time in a round of five small clients."""
    CountedClient.pickled = 0
    with st.executor(workers=2) as pool:
        out = fl.map_clients(
            pool, CountedClient(), range(8), shared={"w": torch.zeros(2)}, batches=4
        )
        assert CountedClient.pickled == 1  # was 4: once per batch
        # once per call, not once for all: what the function reads may change between rounds
        again = fl.map_clients(pool, CountedClient(), [5], shared={"w": torch.ones(2)})
        assert CountedClient.pickled == 2
    assert [o.tolist() for o in out] == [[float(t)] * 2 for t in range(8)]
    assert again[0].tolist() == [6.0, 6.0]
