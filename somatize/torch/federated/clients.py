"""Running a round's clients on any ``concurrent.futures.Executor``, the global state sent once
per worker.

``pool.map(train_client, [(global_state, part) for part in parts])`` pickles the
global state into every client task: with 1,000 small clients the round spends its
time shipping copies of the model (and holds all of them in the queue at once).
``map_clients`` batches the tasks instead and returns the results in task order::

    results = fl.map_clients(pool, train_client, parts, shared=global_state)
    # == [train_client(global_state, part) for part in parts]

The shared value is pickled once per round; each batch carries those bytes, and a
worker unpickles them once (it keeps the last shared value, keyed by the digest of its
bytes, for its next batch). By default there are a few batches per worker
(``_PER_WORKER``; fewer when the shared value is large, so that at most about
``_SHIPPED`` bytes of it are shipped per round): the pool hands the next batch to
whichever worker is free, so a worker slowed by other load takes fewer clients, and
the results of the first batches are unpickled here while the last ones still train.
The batches taper (``_shares``), so that the workers finish within a small batch of each
other.

It works on ``st.executor(...)``, any ``ProcessPoolExecutor`` and Dask's
``Client(...).get_executor()``; ``pool=None`` runs the same calls in this process.
Each batch returns its results at once, so peak memory is the inputs of one round
plus its results; return only what the server needs (a ``TrainResult`` is small; a
state dict is the model's size).

A batch's tasks and its results cross as a pickle, CPU tensors as numpy buffers
(``spool.py``): by reference, cloudpickle only for what plain pickle cannot name (a lambda)
or, on the way to a worker, for anything of ``__main__``. When the workers share this host
(``st.executor``, a ``ProcessPoolExecutor``), the tensors' bytes skip the executor's pipe
through a per-call directory in ``/dev/shm``, removed when the call ends. The pickles are
unpickled as the executor's own messages are: executors run and return whatever they are
sent, so use them with machines and code you trust.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import pickle
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, as_completed
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

import cloudpickle
from blake3 import blake3

from ...errors import AggregationError, WorkerLostError, add_note
from ...remote_errors import Shipped, portable, raise_alone, restored
from ..pool import TorchPool
from ..run_all import note_unpicklable
from .spool import discard, dumps, open_spool, remove, ship, unship

__all__ = ["ClientFailure", "map_clients"]

T = TypeVar("T")
R = TypeVar("R")

_PER_WORKER = 4  # batches per worker by default: balanced by the pool, results streamed back
_TAIL = 1 / 8  # the last batch's size, as a share of the first's (_shares)
_SHIPPED = 64 << 20  # bytes of the shared value shipped per round, at most, before fewer batches
_last_shared: dict[bytes, Any] = {}  # in a worker: the last shared value, by its bytes' digest
_MISSING = object()


def _note(e: BaseException, i: int) -> None:
    """Say on ``e`` which task raised it (a note survives the pickling back from a worker)."""
    add_note(
        e,
        f"map_clients: raised by fn(shared, tasks[{i}]); run that task with pool=None to debug it",
    )


@dataclass(frozen=True)
class ClientFailure:
    """What ``map_clients(..., errors="return")`` puts in the slot of a client that raised.

    Attributes:
        index: the task's index in ``tasks`` (the exception's note says it too).
        error: the exception it raised, with a note naming the task (an exception that
            cannot cross back from a worker arrives as a ``RuntimeError`` that names it).
        traceback: the traceback, formatted where it was raised (a worker's, on a pool).
    """

    index: int
    error: BaseException
    traceback: str

    def __repr__(self) -> str:
        return f"ClientFailure(tasks[{self.index}]: {self.error!r})"

    def _refusal(self, i: int) -> AggregationError:
        """The error of an aggregator given this failure as client ``i``'s result."""
        return AggregationError(
            f"client {i} did not train: map_clients returned its failure (tasks[{self.index}] "
            f"raised {self.error!r:.120}); drop failed clients before aggregating — "
            "results = [r for r in results if not isinstance(r, fl.ClientFailure)]"
        )


def _apply(
    fn: Callable[[Any, Any], Any],
    shared: Any,
    tasks: list[Any],
    indices: Sequence[int],
    errors: str = "raise",
    pooled: bool = False,
) -> list[Any]:
    """``[fn(shared, t) for t in tasks]``, an exception noted with its task's index (and, with
    ``errors="return"``, returned in its slot as a ``ClientFailure``)."""
    out = []
    for i, t in zip(indices, tasks):
        try:
            result = fn(shared, t)
        except Exception as e:
            _note(e, i)
            text = traceback.format_exc()
            # One the parent could not unpickle would break a process pool: raised, it travels
            # by the executor's pickle (from a worker process); a ClientFailure, by ship's.
            error: BaseException = e
            task = f"map_clients: fn(shared, tasks[{i}])"
            if errors == "return" and pooled:
                error = portable(e, task, dumps)
            elif errors == "raise" and pooled and multiprocessing.parent_process() is not None:
                error = portable(e, task)
            if error is not e:
                _note(error, i)
            if errors == "return":
                out.append(ClientFailure(i, error, text))
                continue
            if error is e:
                raise
        else:
            out.append(result)
            continue
        raise_alone(error)  # (its note holds e's traceback)
    return out


def _run_batch(fn: Callable[[Any, Any], Any], payload: bytes, errors: str = "raise") -> Any:
    # In the worker: bytes map_clients (below) made in the user's own process and sent to
    # the user's own executor — never cache or checkpoint data (docs/federated.md).
    digest, blob, spool, shipped, indices = pickle.loads(payload)
    shared = _last_shared.get(digest, _MISSING)
    if shared is _MISSING:  # not this round's: unpickle it once, forget the last one
        shared = pickle.loads(blob)  # the same caller's shared value, as dumps wrote it
        _last_shared.clear()
        _last_shared[digest] = shared
    tasks = unship(shipped, spool, keep=True)  # (removed by the caller: a re-run reads it)
    return ship(_apply(fn, shared, tasks, indices, errors, pooled=True), spool)


class _PickledFunction:
    """``fn`` as the bytes cloudpickle made of it once, for every batch of one call: it
    unpickles as ``fn`` itself, in any process (``pickle.loads`` of those bytes)."""

    __slots__ = ("blob",)

    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return pickle.loads, (self.blob,)


def _pickled_once(fn: Callable[[Any, Any], Any], pool: Executor) -> Any:
    """What to submit as the batches' function: on ``st.executor``, which cloudpickles every
    call, ``fn`` pickled once per call rather than once per batch. A function of ``__main__``
    (a script's client) goes by value, and for each such function cloudpickle scans every
    imported module: 4.5 ms for a client with a few helpers, after ``st.executor`` imported
    torch's compiler stack — more than a small client's training, once per batch. (Once per
    call, not once for all calls: a global the function reads may change between rounds.)
    Another executor gets ``fn`` as it is, pickled by its own rules."""
    if not isinstance(pool, TorchPool):
        return fn
    try:
        return _PickledFunction(cloudpickle.dumps(fn))
    except Exception:  # the pool's own submit names what cannot be pickled
        return fn


def _default_batches(workers: int, tasks: int, shared_bytes: int) -> int:
    per_worker = min(_PER_WORKER, max(1, _SHIPPED // max(1, workers * shared_bytes)))
    return min(tasks, workers * per_worker)


def _workers(pool: Executor) -> int:
    n = getattr(pool, "max_workers", None)  # st.executor's TorchPool
    if not isinstance(n, int):
        n = getattr(pool, "_max_workers", None)  # ProcessPoolExecutor, ThreadPoolExecutor
    if isinstance(n, int) and n > 0:
        return n
    client = getattr(pool, "_client", None)  # dask.distributed's ClientExecutor
    if client is not None and hasattr(client, "nthreads"):
        return max(1, int(sum(client.nthreads().values())))
    raise ValueError(
        f"cannot tell how many workers a {type(pool).__qualname__} has; pass batches=N "
        "(one batch per worker)"
    )


def _shares(count: int, workers: int) -> list[float]:
    """Each batch's share of the round's work, largest first, tapering geometrically to
    ``_TAIL`` of the first: the pool hands the big ones out first, and the small last ones
    even out the workers' finishing times. Equal when there is a batch per worker or fewer."""
    if count <= workers:
        return [1.0] * count
    q = _TAIL ** (1 / (count - 1))
    return [q**k for k in range(count)]


def _batches(n: int, shares: Sequence[float], sizes: Sequence[float] | None) -> list[list[int]]:
    """Task indices in ``len(shares)`` batches, each about its share of the total cost.

    Without ``sizes``, consecutive runs of a golden-ratio shuffle of the tasks (so that
    every batch, even a small one, spans the task list, should costs grow along it).
    With them, the largest task first, each to the batch it leaves least over its share
    (for equal shares, the longest-processing-time rule)."""
    count = len(shares)
    out: list[list[int]] = [[] for _ in range(count)]
    if sizes is None:
        order = sorted(range(n), key=lambda i: (i * 0.6180339887498949) % 1.0)
        whole, done, start = sum(shares), 0.0, 0
        for b, share in enumerate(shares):
            done += share
            stop = n if b == count - 1 else max(start + 1, round(n * done / whole))
            out[b] = order[start:stop]
            start = stop
        return [sorted(g) for g in out if g]
    if len(sizes) != n:
        raise ValueError(
            f"map_clients(sizes=...): {len(sizes)} sizes for {n} tasks; give one per task (e.g. "
            "each client's number of examples), or leave sizes out"
        )
    cost = [float(s) for s in sizes]
    loads = [0.0] * count
    for i in sorted(range(n), key=lambda i: (-cost[i], i)):
        b = min(range(count), key=lambda b: ((loads[b] + cost[i]) / shares[b], b))
        out[b].append(i)
        loads[b] += cost[i]
    return [sorted(g) for g in out if g]


@overload
def map_clients(
    pool: Executor | None,
    fn: Callable[[Any, T], R],
    tasks: Sequence[T],
    *,
    shared: Any = ...,
    batches: int | None = ...,
    sizes: Sequence[float] | None = ...,
    errors: Literal["raise"] = ...,
) -> list[R]: ...


@overload
def map_clients(
    pool: Executor | None,
    fn: Callable[[Any, T], R],
    tasks: Sequence[T],
    *,
    shared: Any = ...,
    batches: int | None = ...,
    sizes: Sequence[float] | None = ...,
    errors: Literal["return"],
) -> list[R | ClientFailure]: ...


def map_clients(
    pool: Executor | None,
    fn: Callable[[Any, T], R],
    tasks: Sequence[T],
    *,
    shared: Any = None,
    batches: int | None = None,
    sizes: Sequence[float] | None = None,
    errors: Literal["raise", "return"] = "raise",
) -> list[Any]:
    """``[fn(shared, task) for task in tasks]`` on ``pool``, ``shared`` shipped once per batch.

    Args:
        pool: any ``concurrent.futures.Executor``, or None to run here.
        fn: ``fn(shared, task) -> result``; it must not modify ``shared`` (every task a
            worker runs in this call sees the same object).
        tasks: one per client (its partition, its seed...).
        shared: what every client needs (the global state); pickled once per call.
        batches: how many batches, of equal work (default: a few per worker of the pool,
            ``_PER_WORKER``, tapering; fewer for a large shared value). Pass the worker
            count for one batch each.
        sizes: optional cost of each task (e.g. its number of examples), to balance the
            batches, the largest tasks first; without it every task counts the same.
        errors: ``"raise"``: a client that raises fails the call with its exception (the
            batches not started are cancelled). ``"return"``: its slot holds a
            ``ClientFailure`` (index, exception, traceback) and the others run on, so a
            round can drop failed clients; ``fedavg`` and the other rules refuse one
            handed to them, naming it. A worker that dies is not a client's error: on
            ``st.executor`` its batch runs again (once; a client may so run twice), on a
            plain ``ProcessPoolExecutor`` the call fails (``BrokenProcessPool``).

    Returns:
        The results, in the order of ``tasks``.

    Example:
        >>> map_clients(None, lambda s, t: s + t, [1, 2, 3], shared=10)
        [11, 12, 13]
    """
    if errors not in ("raise", "return"):
        raise ValueError(
            f"errors must be 'raise' (a failing client fails the round) or 'return' (its "
            f"slot holds a ClientFailure), not {errors!r}"
        )
    if not hasattr(tasks, "__iter__") and not hasattr(tasks, "__getitem__"):
        raise TypeError(
            f"map_clients(pool, fn, tasks): tasks holds one entry per client (its partition, "
            f"its seed), not {tasks!r:.60} ({type(tasks).__qualname__}); for one client, [task]"
        )
    tasks = list(tasks)
    if pool is None:
        return _apply(fn, shared, tasks, range(len(tasks)), errors)
    if not tasks:
        return []
    if batches is not None and (
        isinstance(batches, bool) or not isinstance(batches, int) or batches < 1
    ):
        raise ValueError(f"batches must be a positive int, not {batches!r}")
    blob = dumps(shared)
    digest = blake3(blob).digest(length=16)
    if batches is None:  # a few per worker, tapering
        workers = _workers(pool)
        shares = _shares(_default_batches(workers, len(tasks), len(blob)), workers)
    else:  # as many as asked for, equal
        shares = [1.0] * min(batches, len(tasks))
    groups = _batches(len(tasks), shares, sizes)
    spool = open_spool(pool)
    shipped_fn = _pickled_once(fn, pool)
    futures: dict[Future[Any], list[int]] = {}
    sent: dict[Future[Any], Any] = {}
    try:
        for g in groups:  # (a loop: a failed submission leaves the earlier ones tracked)
            shipped = ship([tasks[i] for i in g], spool, to_worker=True)
            payload = pickle.dumps((digest, blob, spool, shipped, g), protocol=5)
            f = pool.submit(_run_batch, shipped_fn, payload, errors)
            futures[f], sent[f] = g, shipped
        out: list[Any] = [None] * len(tasks)
        for f in as_completed(futures):  # unpickle each batch's results as it arrives
            discard(sent.pop(f))  # its tasks' file, read by the worker that ran it
            try:
                shipped_back = f.result()
            except Exception as e:
                if isinstance(e, WorkerLostError):  # (its message names _run_batch, not tasks)
                    add_note(
                        e,
                        f"map_clients: that call was the batch of tasks {futures[f]}; run "
                        "them with pool=None to see whether one kills its process (out of "
                        "memory?)",
                    )
                error = restored(e)  # (a class of __main__ comes as a Shipped)
                note_unpicklable(error, fn, pool, "map_clients")
                if error is e:
                    raise
                raise error from None
            for i, r in zip(futures[f], unship(shipped_back, spool)):
                if isinstance(r, ClientFailure) and isinstance(r.error, Shipped):
                    r = dataclasses.replace(r, error=restored(r.error))
                out[i] = r
        return out
    finally:
        for f in futures:  # on an error: the batches not started are not run
            f.cancel()
        if spool is not None:
            remove(spool)
