"""Transports: carrying a slice of a plan to another host, and its outputs back.

A transport speaks plain values only — never a ``Graph``. It is handed a ``Job`` (the
slice's topology as JSON, the ids of the nodes to run, the encoded values they read)
and the code bytes of the slice's node implementations, and returns a ``Reply`` of
encoded outputs. Two stock transports:

* ``InProcess(keeper=None)`` — runs the slice in this process through the very path a
  worker takes (fresh copies of the nodes, values encoded and decoded). For tests and
  for debugging a placement without a cluster.
* ``ExecutorTransport(executor, keeper=None, retries=0, timeout=None)`` — over any
  ``concurrent.futures.Executor``: a ``ProcessPoolExecutor``, or Dask's
  ``client.get_executor(workers=[name])`` pinned to one worker.

Code travels as explicit cloudpickle bytes, sent to a worker once and cached there by
digest; classes from the user's own modules travel by value, so workers need only
somatize (and the libraries the nodes use) installed. Values travel only as codec
bytes, never pickled. **An executor runs whatever code it is sent: use these only
with executors and clusters you control and trust.**
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING, Protocol, TypedDict, runtime_checkable

from .errors import TransportError
from .pinned_workers import LOST_AFTER, POLL, PinnedWorkerGone, all_gone
from .pinned_workers import bound as bound_to
from .pinned_workers import pinned as pinned_to
from .remote_errors import Shipped, portable, raise_alone, restored
from .shipping import load_code

if TYPE_CHECKING:
    import concurrent.futures as cf

    from .keepers import Keeper

__all__ = ["ExecutorTransport", "InProcess", "Job", "Reply", "Transport", "serve"]


@runtime_checkable
class Transport(Protocol):
    """The shape of a transport: run one slice of a plan somewhere, return its outputs.

    Implementations match by shape; no base class needed.
    """

    def run(self, job: Job, code: bytes) -> Reply:
        """Run the slice ``job`` describes and return its encoded outputs.

        Args:
            job: the slice, as plain values (see ``Job``).
            code: cloudpickle bytes of the slice's nodes and codecs; their blake3
                digest is ``job["code"]``. Send them only to workers that lack them.

        Raises:
            TransportError: the slice could not be carried or its worker was lost.
            Exception: whatever a node of the slice raised, unchanged.
        """
        ...


class Job(TypedDict):
    """One slice to run, as plain values.

    ``keys`` are computed by the caller (keys do not depend on the host), so a cached
    node finds the same entry wherever it runs; ``parts`` (identity, declaration,
    state) are sent for cached mapped nodes and nodes cached per example, whose items
    or rows are keyed where they run.
    """

    name: str  # "slice 2 on host 'box' (enc, head)", for messages
    host: str
    topology: str  # JSON: the slice's nodes, the nodes it reads from, the edges into its nodes
    nodes: list[str]  # the nodes to run, in order
    inputs: dict[str, bytes]  # encoded values of the nodes it reads from
    input: bytes | None  # the encoded graph input, when a node of the slice is a root
    input_key: str | None  # None: the graph input has no key (it was Opaque, or none is needed)
    outputs: list[str]  # nodes whose values to send back
    keys: dict[str, str]
    parts: dict[str, list[str]]
    cached: list[str]
    named: dict[str, str]
    pinned: list[str]
    per_example: list[str]  # cached nodes keyed row by row (a subset of cached)
    devices: dict[str, str]
    run_id: str
    step: int
    training: bool
    values: bytes | None  # encoded injected values (ctx.values)
    watched: bool  # whether to send watcher events back
    code: str  # blake3 digest of the code bytes


class Reply(TypedDict):
    """What a slice sends back: encoded outputs, and what the caller reports upward."""

    outputs: dict[str, bytes]
    opaque: list[str]  # outputs that were Opaque: not sent; the caller raises CrossingError
    metrics: bytes  # encoded {node: metrics}
    events: bytes  # encoded watcher events, replayed to the caller's watchers


# -- the worker side --------------------------------------------------------------------

_keepers: dict[str | None, Keeper] = {}
_keepers_lock = threading.Lock()


def _worker_keeper(path: str | None) -> Keeper:
    from .keepers import DiskKeeper, MemoryKeeper

    with _keepers_lock:
        keeper = _keepers.get(path)
        if keeper is None:
            keeper = _keepers[path] = MemoryKeeper() if path is None else DiskKeeper(path)
        return keeper


def _mark(e: BaseException, name: str) -> None:
    """Tag an exception as raised by the slice itself: it is re-raised, never retried."""
    with contextlib.suppress(AttributeError):
        e._somatize_slice = name  # type: ignore[attr-defined]


def _from_slice(e: BaseException) -> bool:
    return getattr(e, "_somatize_slice", None) is not None


def serve(
    job: Job, code: bytes | None, keeper: str | None = None, attempt: str = ""
) -> Reply | None:
    """What an executor runs on a worker: load the slice's code, run the slice, reply.

    Args:
        job: the slice.
        code: the code bytes, or None to use the worker's cache.
        keeper: a DiskKeeper directory on the worker, or None for a MemoryKeeper kept
            by the worker process.
        attempt: unique per submission (Dask would reuse the result of an identical call).

    Returns:
        The reply, or None when this worker lacks the code and it was not sent.
    """
    from .slices import execute_job

    try:
        bundle = load_code(job["code"], code, job["name"])
        if bundle is None:
            return None
        return execute_job(job, bundle, _worker_keeper(keeper))
    except Exception as e:
        # (a class of the user's, shipped by value, would not pickle back: it goes Shipped)
        error = portable(e, job["name"])
        _mark(error, job["name"])
        if error is e:
            raise
    raise_alone(error)


# -- stock transports -------------------------------------------------------------------


class InProcess:
    """Run slices in this process, by the path a worker takes.

    The nodes are fresh copies made from the code bytes and values cross encoded, so a
    placement that works here works on a cluster. Cached nodes of its slices use
    ``keeper``, the keeper of this stand-in host (default: a ``MemoryKeeper`` of its own).

    Example:
        >>> from somatize import Graph, Node, Done
        >>> class Inc(Node):
        ...     def forward(self, x, ctx): return Done(x + 1)
        >>> g = Graph.somatize(Inc() >> Inc().with_id("far")).place("far", host="box")
        >>> g.forward(1, transports={"box": InProcess()})
        3
    """

    def __init__(self, keeper: Keeper | None = None) -> None:
        from .keepers import MemoryKeeper

        self.keeper: Keeper = keeper if keeper is not None else MemoryKeeper()

    def run(self, job: Job, code: bytes) -> Reply:
        from .slices import execute_job

        bundle = load_code(job["code"], code, job["name"])
        assert bundle is not None  # the code was sent
        return execute_job(job, bundle, self.keeper)

    def __repr__(self) -> str:
        return f"InProcess(keeper={self.keeper!r})"


class ExecutorTransport:
    """Run slices on a ``concurrent.futures.Executor``: a process pool, or Dask.

    Code bytes go to a worker only when it lacks them: the first call for a digest sends
    them; later calls send the digest alone, and a worker that does not know it answers
    so and receives the bytes. With Dask, pin the executor to the worker meant to be the
    host: ``client.get_executor(workers=[name])``.

    **Retries.** An exception a node raises comes back unchanged and is never retried
    (it would fail again). Any other failure — the worker died, the connection was
    lost, no reply within ``timeout`` — is retried up to ``retries`` times, then raised
    as ``TransportError`` naming the slice. With Dask pinned to workers, an attempt whose
    worker has left the cluster for a few seconds fails too, so the defaults never wait
    forever; a worker its nanny restarted comes back at another address under the same
    name, so pin by name and a retry reaches it. Retrying helps executors that replace
    lost workers (Dask); a ``ProcessPoolExecutor`` whose worker died stays broken.

    Args:
        executor: where slices run; it runs whatever code it is sent — trusted only.
        keeper: where cached nodes of its slices keep their outputs on the worker: a
            directory for a ``DiskKeeper`` (a path on the worker's machine), or None for
            a ``MemoryKeeper`` in each worker process.
        retries: how many times to resubmit a slice whose worker was lost (0: never).
        timeout: seconds to wait for one attempt (None: no limit).

    Example:
        >>> from concurrent.futures import ThreadPoolExecutor
        >>> from somatize import Graph, Node, Done
        >>> class Inc(Node):
        ...     def forward(self, x, ctx): return Done(x + 1)
        >>> g = Graph.somatize(Inc().with_id("far")).place("far", host="box")
        >>> with ThreadPoolExecutor(1) as pool:
        ...     g.forward(1, transports={"box": ExecutorTransport(pool, retries=2)})
        2
    """

    def __init__(
        self,
        executor: cf.Executor,
        *,
        keeper: str | os.PathLike[str] | None = None,
        retries: int = 0,
        timeout: float | None = None,
    ) -> None:
        if not callable(getattr(executor, "submit", None)):
            raise TypeError(
                f"ExecutorTransport takes a concurrent.futures.Executor (something with "
                f"submit), not {executor!r:.60}; e.g. a ProcessPoolExecutor or "
                "client.get_executor(workers=[name])"
            )
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(
                f"ExecutorTransport(retries={retries!r:.40}): give an int of 0 or more (how often "
                "a call whose worker was lost is sent again)"
            )
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, float | int)
        ):
            raise TypeError(
                f"ExecutorTransport(timeout={timeout!r:.40}): give seconds as a number above 0, "
                "or None for no limit"
            )
        if timeout is not None and not timeout > 0:
            raise ValueError(
                f"ExecutorTransport(timeout={timeout!r}): give seconds above 0, or None for no "
                "limit"
            )
        self.executor = executor
        self.keeper = os.fspath(keeper) if keeper is not None else None
        self.retries = retries
        self.timeout = timeout
        #: How many times code bytes were sent (once per worker that lacked them).
        self.shipped = 0
        self._known: set[str] = set()

    def run(self, job: Job, code: bytes) -> Reply:
        send = job["code"] not in self._known
        failures: list[BaseException] = []
        while True:
            try:
                reply = self._submit(job, code if send else None)
            except Exception as e:
                if _from_slice(e):
                    if isinstance(e, Shipped):
                        raise restored(e) from None
                    raise
                if isinstance(e, RuntimeError) and "after shutdown" in str(e):
                    raise TransportError(
                        f"{job['name']}: its executor was shut down ({e}) — its with block "
                        "ended, or the client closed; give ExecutorTransport a running executor"
                    ) from e
                failures.append(e)
                if len(failures) > self.retries:
                    raise self._lost(job, failures) from e
                send = True  # a replacement worker lacks the code
                continue
            if reply is None:  # this worker lacks the code: send it
                if send:
                    raise TransportError(f"{job['name']}: the worker lost the code it was sent")
                send = True
                continue
            self._known.add(job["code"])
            return reply

    def _submit(self, job: Job, code: bytes | None) -> Reply | None:
        import concurrent.futures as cf
        import time
        import uuid

        if code is not None:
            self.shipped += 1
        future = self.executor.submit(serve, job, code, self.keeper, uuid.uuid4().hex)
        pinned = pinned_to(self.executor)
        # (Dask binds a task pinned by address or name to the address that answered now)
        bound = bound_to(*pinned) if pinned is not None else set()
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        gone_since: float | None = None
        while True:
            wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if pinned is not None:  # look at the cluster every so often while waiting
                wait = POLL if wait is None else min(wait, POLL)
            try:
                reply: Reply | None = future.result(timeout=wait)
                return reply
            except cf.TimeoutError:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    future.cancel()
                    raise
                assert pinned is not None
                if all_gone(*pinned, bound):
                    gone_since = gone_since if gone_since is not None else now
                    if now - gone_since >= LOST_AFTER:  # not coming back (a nanny restarts fast)
                        future.cancel()
                        raise PinnedWorkerGone(pinned[1]) from None
                else:
                    gone_since = None

    def _lost(self, job: Job, failures: list[BaseException]) -> TransportError:
        import concurrent.futures as cf

        e = failures[-1]
        why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        if isinstance(e, cf.TimeoutError):
            why = f"no reply within timeout={self.timeout}s"
        if isinstance(e, PinnedWorkerGone):
            why = (
                f"the worker it is pinned to ({', '.join(e.workers)}) left the cluster, and "
                f"no worker it may run on was there within {LOST_AFTER:g}s"
            )
        if isinstance(e, cf.BrokenExecutor):
            hint = (
                " A ProcessPoolExecutor whose worker died stays broken: make a new one, use "
                "somatize.torch's st.executor(workers=...), which starts a fresh pool and "
                "runs the slice again, or Dask, which replaces lost workers."
            )
        elif isinstance(e, PinnedWorkerGone) and any("://" in w for w in e.workers):
            hint = (
                " A worker a nanny restarts comes back at another address: pin it by name "
                "(client.get_executor(workers=[name]) — a LocalCluster's names are "
                "0, 1, ...; dask worker --name gpu-box), and retries reach it"
                + ("." if self.retries else " (ExecutorTransport(executor, retries=N)).")
            )
        else:
            hint = " For transient failures, retry: ExecutorTransport(executor, retries=N)."
        if isinstance(e, cf.TimeoutError):
            hint += (
                " A slice that timed out may still be running on its worker (an executor "
                "cannot stop a running call): a retry may wait behind it, and the executor's "
                "shutdown (the end of its with block) waits for it."
            )
        return TransportError(
            f"{job['name']} failed: its worker was lost or did not answer ({why}); "
            f"tried {len(failures)} time(s) with retries={self.retries}.{hint}"
        )

    def __repr__(self) -> str:
        return f"ExecutorTransport({type(self.executor).__name__}, retries={self.retries})"
