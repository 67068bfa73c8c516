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

A batch's inputs cross as one byte string, CPU tensors written as numpy buffers:
returned as they are, each tensor of a result would go through torch's
multiprocessing reducer, which moves its storage to a shared-memory file — about a
millisecond per tensor, most of a 1,000-client round. Results come back the same way,
pickled by reference (cloudpickle only for what plain pickle cannot name, such as a
lambda). When the workers share this host (``st.executor``, a ``ProcessPoolExecutor``),
the tensors' bytes skip the executor's pipe: the worker writes them to one file in
``/dev/shm`` (a per-call directory, removed when the call ends) and the pipe carries the
rest; without ``/dev/shm``, or when it is full, they travel in the pipe. The bytes are
unpickled by the parent as the executor's own results are: executors run and return
whatever they are sent, so use them with machines and code you trust.
"""

from __future__ import annotations

import copyreg
import io
import os
import pickle
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

import cloudpickle
import numpy as np
import torch
from blake3 import blake3

from ..pool import TorchPool

__all__ = ["map_clients"]

T = TypeVar("T")
R = TypeVar("R")

# dtypes numpy holds exactly; others (bfloat16, float8...) take torch's own pickling
_NUMPY = {
    torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
}  # fmt: skip


def _tensor(array: np.ndarray[Any, Any]) -> torch.Tensor:
    return torch.from_numpy(array if array.flags.writeable else array.copy())


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle (lambdas, ``__main__`` classes) with CPU tensors as numpy buffers."""

    def reducer_override(self, obj: Any) -> Any:
        if (
            type(obj) is torch.Tensor
            and obj.dtype in _NUMPY
            and obj.device.type == "cpu"
            and obj.layout == torch.strided
            and not obj.requires_grad
        ):
            return _tensor, (obj.resolve_conj().resolve_neg().numpy(),)
        return super().reducer_override(obj)


def _dumps(value: Any) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buf.getvalue()


def _reduce_tensor(t: torch.Tensor) -> Any:
    try:  # numpy() refuses what numpy cannot hold as it is: grad, CUDA, sparse, conj, bfloat16
        return _tensor, (t.numpy(),)
    except (RuntimeError, TypeError):
        return t.__reduce_ex__(pickle.HIGHEST_PROTOCOL)


# Plain pickle (by reference: results go back to the process that defined their classes)
# with CPU tensors as numpy buffers. A dispatch table, not ``reducer_override``: no Python
# call for each of the many small objects a batch of results holds.
_RESULTS_TABLE: dict[type, Any] = {**copyreg.dispatch_table, torch.Tensor: _reduce_tensor}


def _result_pickler(file: io.BytesIO, **kwargs: Any) -> pickle.Pickler:
    pickler = pickle.Pickler(file, protocol=5, **kwargs)
    pickler.dispatch_table = _RESULTS_TABLE
    return pickler


def _dump_results(results: list[Any], spool: str | None) -> Any:
    """A batch's results: ``(path, pickle, sizes)`` with the tensors' bytes in a file of
    ``spool``, or in-band bytes (no spool, a full ``/dev/shm``, or what plain pickle
    cannot name)."""
    if spool is not None:
        buffers: list[pickle.PickleBuffer] = []
        head = io.BytesIO()
        try:
            _result_pickler(head, buffer_callback=buffers.append).dump(results)
        except (pickle.PicklingError, AttributeError, TypeError):
            return _dumps(results)  # a lambda, a local class: cloudpickle, in-band
        views = [b.raw() for b in buffers]
        try:
            fd, path = tempfile.mkstemp(dir=spool)
            try:
                _write_all(fd, views)
            except BaseException:
                os.unlink(path)
                raise
            finally:
                os.close(fd)
        except OSError:  # /dev/shm full, or the call is over and its spool removed
            pass
        else:
            return path, head.getvalue(), [v.nbytes for v in views]
    try:
        buf = io.BytesIO()
        _result_pickler(buf).dump(results)
        return buf.getvalue()
    except (pickle.PicklingError, AttributeError, TypeError):
        return _dumps(results)


def _write_all(fd: int, views: list[memoryview]) -> None:
    """Write every view, in order, a thousand per system call."""
    pending, i = [v.cast("B") for v in views if v.nbytes], 0
    while i < len(pending):
        done = os.writev(fd, pending[i : i + 1024])
        while i < len(pending) and done >= pending[i].nbytes:
            done -= pending[i].nbytes
            i += 1
        if done:  # a short write: the rest of this view next time
            pending[i] = pending[i][done:]


def _load_results(shipped: Any, spool: str | None) -> list[Any]:
    """A batch's results, from what ``_run_batch`` returned through the user's own executor.

    Only those bytes are unpickled, as the executor's own results are. The spool file
    (in a directory ``mkdtemp`` made for this call, readable by this user only) holds
    raw tensor bytes: they become out-of-band buffers, data that is never unpickled."""
    if isinstance(shipped, bytes):  # the batch's results as _dump_results pickled them
        return pickle.loads(shipped)  # type: ignore[no-any-return]
    path, head, sizes = shipped
    if spool is None or os.path.dirname(path) != spool:
        raise ValueError(f"a batch's results name {path!r}, outside this call's spool {spool!r}")
    data = bytearray(sum(sizes))
    with open(path, "rb") as fh:
        got = fh.readinto(data)
    os.unlink(path)
    if got != len(data):
        raise ValueError(f"a batch's results file {path!r} holds {got} bytes of {len(data)}")
    view, start, buffers = memoryview(data), 0, []
    for n in sizes:
        buffers.append(view[start : start + n])
        start += n
    # the pickle the executor returned; the file's bytes only fill its tensors' buffers
    return pickle.loads(head, buffers=buffers)  # type: ignore[no-any-return]


def _remove(spool: str) -> None:
    """Remove a call's spool, and what a batch still running after an error writes there:
    renamed first, so that no file can be made under its name while it is removed."""
    closed = f"{spool}.closed"
    try:
        os.rename(spool, closed)
    except OSError:
        closed = spool
    shutil.rmtree(closed, ignore_errors=True)


_SHM, _PREFIX = "/dev/shm", "somatize-results-"


def _spool(pool: Executor) -> str | None:
    """A fresh directory in shared memory for one call's results, when the pool's workers
    run on this host and the host has ``/dev/shm``; named by this process, so that the
    spools of a process killed mid-round are found and removed by the next call."""
    if not isinstance(pool, (ProcessPoolExecutor, TorchPool)) or not os.path.isdir(_SHM):
        return None
    _sweep()
    try:
        return tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=_SHM)
    except OSError:
        return None


_STALE = 600.0  # seconds a spool must have been left alone before another process sweeps it


def _sweep() -> None:
    """Remove the spools left in ``/dev/shm`` by processes that no longer exist.

    Only those untouched for ``_STALE`` seconds: a ``/dev/shm`` shared by containers with
    their own process ids (a pod's memory volume) may hold a live spool whose pid means
    nothing here, and a live call writes into its spool, and reads it, within seconds."""
    try:
        names = [n for n in os.listdir(_SHM) if n.startswith(_PREFIX)]
    except OSError:
        return
    now = time.time()
    for name in names:
        pid = name[len(_PREFIX) :].partition("-")[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        path = os.path.join(_SHM, name)
        try:
            if now - os.stat(path).st_mtime < _STALE:
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:  # gone: what it left is nobody's
            shutil.rmtree(path, ignore_errors=True)
        except OSError:  # alive (another user's), or already removed
            pass


_PER_WORKER = 4  # batches per worker by default: balanced by the pool, results streamed back
_TAIL = 1 / 8  # the last batch's size, as a share of the first's (_shares)
_SHIPPED = 64 << 20  # bytes of the shared value shipped per round, at most, before fewer batches
_last_shared: dict[bytes, Any] = {}  # in a worker: the last shared value, by its bytes' digest
_MISSING = object()


def _run_batch(fn: Callable[[Any, Any], Any], payload: bytes) -> Any:
    # In the worker: bytes map_clients (below) made in the user's own process and sent to
    # the user's own executor — never cache or checkpoint data (docs/federated.md).
    digest, blob, spool, tasks = pickle.loads(payload)
    shared = _last_shared.get(digest, _MISSING)
    if shared is _MISSING:  # not this round's: unpickle it once, forget the last one
        shared = pickle.loads(blob)  # the same caller's shared value, as _dumps wrote it
        _last_shared.clear()
        _last_shared[digest] = shared
    return _dump_results([fn(shared, t) for t in tasks], spool)


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
    """Task indices in ``len(shares)`` batches, each about its share of the total cost: the
    tasks in a golden-ratio shuffle (so that every batch, even a small one, spans the task
    list, should costs grow along it), or largest first by ``sizes``."""
    count = len(shares)
    if sizes is None:
        order, cost = sorted(range(n), key=lambda i: (i * 0.6180339887498949) % 1.0), [1.0] * n
    elif len(sizes) != n:
        raise ValueError(f"{len(sizes)} sizes for {n} tasks; give one per task")
    else:
        cost = [float(s) for s in sizes]
        order = sorted(range(n), key=lambda i: (-cost[i], i))
    total, whole = sum(cost), sum(shares)
    out: list[list[int]] = [[] for _ in range(count)]
    b, done, bound = 0, 0.0, total * shares[0] / whole
    for k, i in enumerate(order):
        out[b].append(i)
        done += cost[i]
        # the next batch once this one has its share, never leaving a later batch empty
        if b < count - 1 and (done >= bound * (1 - 1e-9) or n - k - 1 <= count - 1 - b):
            b += 1
            bound += total * shares[b] / whole
    return [sorted(g) for g in out if g]


def map_clients(
    pool: Executor | None,
    fn: Callable[[Any, T], R],
    tasks: Sequence[T],
    *,
    shared: Any = None,
    batches: int | None = None,
    sizes: Sequence[float] | None = None,
) -> list[R]:
    """``[fn(shared, task) for task in tasks]`` on ``pool``, ``shared`` shipped once per batch.

    Args:
        pool: any ``concurrent.futures.Executor``, or None to run here.
        fn: ``fn(shared, task) -> result``; it must not modify ``shared`` (every task a
            worker runs in this call sees the same object).
        tasks: one per client (its partition, its seed...).
        shared: what every client needs (the global state); pickled once per call.
        batches: how many batches (default: a few per worker of the pool, ``_PER_WORKER``,
            fewer for a large shared value; pass the worker count for one batch each).
        sizes: optional cost of each task (e.g. its number of examples), to balance the
            batches; without it tasks are dealt round-robin.

    Returns:
        The results, in the order of ``tasks``.

    Example:
        >>> map_clients(None, lambda s, t: s + t, [1, 2, 3], shared=10)
        [11, 12, 13]
    """
    tasks = list(tasks)
    if pool is None:
        return [fn(shared, t) for t in tasks]
    if not tasks:
        return []
    if batches is not None and (
        isinstance(batches, bool) or not isinstance(batches, int) or batches < 1
    ):
        raise ValueError(f"batches must be a positive int, not {batches!r}")
    blob = _dumps(shared)
    digest = blake3(blob).digest(length=16)
    workers = _workers(pool) if batches is None else batches
    count = batches or _default_batches(workers, len(tasks), len(blob))
    groups = _batches(len(tasks), _shares(min(count, len(tasks)), workers), sizes)
    spool = _spool(pool)
    futures: dict[Future[Any], list[int]] = {}
    try:
        for g in groups:  # (a loop: a failed submission leaves the earlier ones tracked)
            payload = _dumps((digest, blob, spool, [tasks[i] for i in g]))
            futures[pool.submit(_run_batch, fn, payload)] = g
        out: list[Any] = [None] * len(tasks)
        for f in as_completed(futures):  # unpickle each batch's results as it arrives
            for i, r in zip(futures[f], _load_results(f.result(), spool)):
                out[i] = r
        return out
    finally:
        for f in futures:  # on an error: the batches not started are not run
            f.cancel()
        if spool is not None:
            _remove(spool)
