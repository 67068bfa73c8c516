"""A process pool that outlives its workers: a killed worker costs re-runs, not the pool.

A plain ``ProcessPoolExecutor`` whose worker dies (SIGKILL, the OOM killer, a
segfault) is broken for good: every queued and running call fails with
``BrokenProcessPool``. ``TorchPool`` keeps going: it starts a fresh pool and resubmits
every call that had not finished. A call that was *running on the worker that died* is
charged one attempt; after ``retries`` re-runs (default 1) it fails with
``WorkerLostError`` naming it. Calls that were queued, or running on workers the broken
pool took down with it, are resubmitted without charge (at most a few times) — the
latter start over: a kill costs up to one run's progress per worker. Keeping them would
mean replacing the standard-library pool, which terminates its surviving workers and
reads no result after the break (a result sent before it is kept). The fresh pool is
made by the broken pool's thread, in the callback of its failed futures: ``st.executor``
has it started by forkserver, never forked from that thread.

Which call ran where: each worker claims a slot in a small shared array when it starts
and writes the id of the call it is running into it; the dead worker is the one whose
process has exited when the pool reports the break. What a worker runs — its start, each
call, the exception a call raises made fit to travel back, its exit when this process
dies — is in ``pool_worker.py``.

Leaving ``with TorchPool(...)`` by an exception (Ctrl-C) cancels the calls not started; so
does Ctrl-C reaching a worker, which aborts its pool at once (a call sent after that starts
a fresh pool). The futures it hands out, and how it holds its worker pools' own, are in
``pool_futures.py``.

``run_all`` (``run_all.py``) runs a campaign over this pool or any other executor.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import pickle
import threading
from collections.abc import Callable
from concurrent.futures import (
    BrokenExecutor,
    Executor,
    Future,
    ProcessPoolExecutor,
)
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_any
from types import TracebackType
from typing import Any, Literal

import cloudpickle

from ..errors import WorkerLostError, add_note
from ..remote_errors import called, restored
from .pool_futures import CallFuture, hold, settled
from .pool_worker import Aborted, Packed, _call, _start, start_failed, starting_worker, worker_count

__all__ = ["TorchPool"]

_FREE_RESUBMITS = 5  # a call is resubmitted this often for others' deaths, then given up


class _Generation:
    """One ``ProcessPoolExecutor`` and the slots its workers write into."""

    def __init__(self, workers: int, ctx: Any, initializer: Any, initargs: tuple[Any, ...]):
        self.ctx = ctx
        self.slots = ctx.RawArray("q", 8 * workers)  # room for workers started over time
        self.aborted = ctx.RawValue("b", 0)  # set: the workers start no further call
        self.claimed = claimed = ctx.Value("i", 0)  # workers that started
        self.pool = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=ctx,
            initializer=_start,
            initargs=(self.slots, claimed, self.aborted, os.getpid(), initializer, initargs),
        )

    def never_started(self) -> bool:
        """Whether no worker got as far as its start (none killed by a signal: a worker
        killed while starting is no reason to give up), e.g. a script without the guard."""
        if self.claimed.value:
            return False
        processes = getattr(self.pool, "_processes", None) or {}
        return not any((p.exitcode or 0) < 0 for p in processes.values())

    def killed(self, task: int) -> bool:
        """Whether ``task`` was running on a worker that has exited."""
        processes = getattr(self.pool, "_processes", None) or {}
        for i in range(len(self.slots) // 2):
            pid, running = self.slots[2 * i], self.slots[2 * i + 1]
            if pid and running == task:
                p = processes.get(pid)
                # its sentinel, as the pool saw it: closed as the process exits, a moment
                # before it can be reaped (longer with more threads), so exitcode may be None
                return p is None or p.exitcode is not None or bool(wait_any([p.sentinel], 0))
        return False


@dataclass(eq=False)
class _Task:
    id: int
    payload: bytes
    what: str  # the call, as its errors name it: train(0.1, seed=3)
    future: CallFuture = field(init=False)
    deaths: int = 0
    spared: int = 0
    inner: Future[Any] | None = None

    def __post_init__(self) -> None:
        self.future = CallFuture(self)


class TorchPool(Executor):
    """A process pool for torch work that replaces lost workers and re-runs their calls.

    Functions and arguments are shipped with cloudpickle, so lambdas and classes defined
    in ``__main__`` work; results come back with pickle as usual. Made by
    ``st.executor()``, which sets the start method and the workers' torch threads.

    Args:
        max_workers, mp_context, initializer, initargs: as for ``ProcessPoolExecutor``.
        retries: how many times a call whose worker died is re-run on a fresh worker
            before its future fails with ``WorkerLostError`` (0: never re-run).
        fallback: ``(context, unsafe)``: workers are started with ``context`` instead of
            ``mp_context`` whenever ``unsafe()`` gives a reason (``st.executor`` passes a
            forkserver and the check that forking this process is still safe).
    """

    def __init__(
        self,
        max_workers: int | None = None,
        mp_context: Any = None,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        *,
        retries: int = 1,
        fallback: tuple[Any, Callable[[], str | None]] | None = None,
    ) -> None:
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(
                f"st.executor(retries={retries!r}): give an int of 0 or more (how often a call "
                "whose worker died is run again)"
            )
        if max_workers is not None and (isinstance(max_workers, bool) or max_workers < 1):
            raise ValueError(
                f"st.executor(workers={max_workers!r}): give 1 or more (None: one per CPU)"
            )
        if (reason := starting_worker()) is not None:
            raise RuntimeError(f"st.executor(): {reason}")
        self._workers = worker_count(max_workers)
        self._ctx = mp_context or multiprocessing.get_context()
        self._init = (initializer, tuple(initargs))
        self._fallback = fallback
        self.retries = retries
        self._lock = threading.RLock()
        self._gen: _Generation | None = None
        self._retired: list[_Generation] = []  # broken or aborted: shutdown waits for them
        self._ids = itertools.count()
        self._closed = False
        #: How many fresh pools were started after a worker died.
        self.restarts = 0

    @property
    def max_workers(self) -> int:
        """How many worker processes run calls at once."""
        return self._workers

    @property
    def start_method(self) -> str:
        """How the workers are started: ``"fork"``, ``"forkserver"`` or ``"spawn"`` (those
        running now; before the first call, those the next call would start)."""
        gen = self._gen
        ctx = gen.ctx if gen is not None else self._context()
        return str(ctx.get_start_method())

    def _context(self) -> Any:
        if self._fallback is not None and self._fallback[1]() is not None:
            return self._fallback[0]
        return self._ctx

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._lock:
            if self._closed:
                name = getattr(fn, "__qualname__", type(fn).__qualname__)
                raise RuntimeError(
                    f"cannot schedule new futures after shutdown: submit({name}, ...) came "
                    "after this executor was shut down (its with block ended); submit inside "
                    "the block, or make a new one with st.executor()"
                )
            task = _Task(next(self._ids), _payload(fn, args, kwargs), called(fn, args, kwargs))
            task.future.add_done_callback(lambda f: _cancel(task) if f.cancelled() else None)
            self._send(task)
        return task.future

    def _send(self, task: _Task) -> None:
        with self._lock:
            gen = self._gen
            if gen is not None and gen.aborted.value and not self._closed:
                self._gen = None  # Ctrl-C reached its workers, which start nothing more:
                gen.pool.shutdown(wait=False, cancel_futures=True)  # the next call, a fresh pool
                self._retired.append(gen)
            for _ in range(3):
                if self._gen is None:
                    self._gen = _Generation(self._workers, self._context(), *self._init)
                gen = self._gen
                try:
                    task.inner = hold(gen.pool.submit(_call, task.payload, task.id))
                except BrokenExecutor:  # it broke since: a fresh one
                    self._retire(gen)
                    continue
                task.inner.add_done_callback(
                    lambda inner, gen=gen: self._settle(task, gen, inner)  # type: ignore[misc]
                )
                return
        settled(
            task.future.set_exception,
            WorkerLostError(f"call {task.id}, {task.what}: no worker could be started"),
        )

    def _retire(self, gen: _Generation) -> None:
        # a broken pool terminates and joins its own workers; the next send starts another
        if self._gen is gen:
            self._gen = None
            self.restarts += 1
            self._retired.append(gen)

    def _settle(self, task: _Task, gen: _Generation, inner: Future[Any]) -> None:
        if task.future.done():  # cancelled by the caller
            return
        if inner.cancelled():
            task.future.cancel()
            return
        error = inner.exception()
        if error is None:
            _deliver(task, inner.result())
            return
        if isinstance(error, Aborted):  # handed to a worker, but not started: aborted
            task.future.cancel()
            return
        if not isinstance(error, BrokenExecutor):
            settled(task.future.set_exception, restored(error))  # (a class of __main__: Shipped)
            return
        if gen.never_started():
            lost = WorkerLostError(
                f"call {task.id}, {task.what}, was lost: "
                + start_failed(gen.ctx.get_start_method())
            )
            lost.__cause__ = error
            with self._lock:
                self._retire(gen)
            settled(task.future.set_exception, lost)
            return
        killed = gen.killed(task.id)  # read now: the survivors are terminated right after
        if killed:
            task.deaths += 1
        else:
            task.spared += 1
        with self._lock:
            self._retire(gen)
            if self._closed or task.deaths > self.retries or task.spared > _FREE_RESUBMITS:
                why = (
                    "the pool was shut down"
                    if self._closed
                    else f"its worker died {task.deaths} time(s) with retries={self.retries}"
                    if task.deaths > self.retries
                    else f"the pool broke {task.spared} times around it"
                )
                lost = WorkerLostError(
                    f"call {task.id}, {task.what}, was lost: {why} (killed, out of memory, or crashed); "
                    "raise retries=, or look for what kills the worker"
                )
                lost.__cause__ = error
                settled(task.future.set_exception, lost)
                return
            self._send(task)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """As ``ProcessPoolExecutor.shutdown``; ``cancel_futures=True`` also cancels the calls
        already handed to the workers' queue but not started. Waiting, it also waits for
        the pools a lost worker broke to end their other workers, so that none runs on."""
        with self._lock:
            self._closed = True
            gen = self._gen
            retired, self._retired = self._retired, []
        if gen is not None:
            if cancel_futures:
                gen.aborted.value = 1
            gen.pool.shutdown(wait=wait, cancel_futures=cancel_futures)
        for old in retired if wait else ():
            old.pool.shutdown(wait=True)  # (its own thread terminates and joins its workers)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        # Leaving the block by an exception (Ctrl-C, a failed run) aborts the campaign: the
        # calls not started are cancelled, not run for nobody. A normal exit waits for all.
        self.shutdown(wait=True, cancel_futures=exc_type is not None)
        return False

    def __repr__(self) -> str:
        return (
            f"TorchPool(workers={self._workers}, retries={self.retries}, "
            f"start_method={self.start_method!r})"
        )


def _deliver(task: _Task, result: Any) -> None:
    """Set ``task``'s result: a ``Packed`` one unpickled here (a result of the user's own
    function, from the user's own worker), or the error naming the call if it fails."""
    if task.future.done():  # cancelled meanwhile (map cancels the rest when one raises)
        return
    if type(result) is not Packed:
        settled(task.future.set_result, result)
        return
    try:
        value = pickle.loads(result)  # the user's own function's result, from their own worker
    except Exception as e:
        error = RuntimeError(
            f"call {task.id}, {task.what}: its result came back from its worker but cannot be unpickled in "
            f"this process: {type(e).__qualname__}: {e}; return plain data (tensors, "
            "numbers, strings, lists and dicts of them), or make its class importable here"
        )
        error.__cause__ = e
        settled(task.future.set_exception, error)
        return
    settled(task.future.set_result, value)


def _cancel(task: _Task) -> None:
    if task.inner is not None:
        task.inner.cancel()


def _payload(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """The call as cloudpickle bytes; what cannot be pickled is named (the function, or
    which argument), since cloudpickle's own message names only a type."""
    try:
        payload: bytes = cloudpickle.dumps((fn, args, kwargs))
        return payload
    except Exception as e:
        name = getattr(fn, "__qualname__", type(fn).__qualname__)
        parts = [("the function", fn)] + [
            (f"positional argument {i}", a) for i, a in enumerate(args)
        ]
        parts += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
        for what, value in parts:
            try:
                cloudpickle.dumps(value)
            except Exception:
                add_note(
                    e,
                    f"submit({name}, ...): {what} ({type(value).__qualname__}) cannot be "
                    "pickled to go to a worker process; pass what it is made from (a path, "
                    "a config dict, a seed) and build it inside the function",
                )
                break
        raise
