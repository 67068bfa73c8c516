"""What a ``TorchPool`` worker process runs: its start, each call, and the exception a call
raises, made fit to travel back.

* A worker **exits when its parent dies.** A process pool's workers outlive a parent that
  is killed (SIGKILL, the out-of-memory killer): re-parented to init, they would run every
  queued call and then idle for good, holding their memory. A thread of the worker's own
  waits for the pool's process to exit (on Linux a pidfd of it; elsewhere it looks every
  second). Not ``prctl(PR_SET_PDEATHSIG)``: it fires when the *thread* that forked the
  worker exits, and ``TorchPool`` forks a broken pool's replacement from that pool's
  manager thread, which exits right after; nor the worker's parent: under forkserver it is
  the server, which outlives the pool's process as long as its workers do.
* A call's exception **arrives as itself, or as a RuntimeError naming it**: the parent
  unpickles what a worker raised, and one that does not unpickle breaks the whole process
  pool — every call fails with ``BrokenProcessPool``, and ``TorchPool`` would take it for a
  dead worker. ``somatize.remote_errors.portable`` makes it fit to travel (a class of
  ``__main__`` as cloudpickle bytes, which the pool restores; one that unpickles nowhere as a
  ``RuntimeError`` naming it).
* A call's **result is pickled by the worker** (``Packed``) and unpickled by the pool as
  that call's: a result that does not unpickle in the parent (its class missing there, a
  ``__reduce__`` that fails) fails that call with a ``RuntimeError`` naming it, where the
  executor, unpickling it itself, would break the whole pool. Its tensors travel as bytes
  (plain ``pickle``), not by torch's shared-memory reducer, which holds a file descriptor
  in the parent per tensor for as long as the result lives: a few state dicts of some
  hundred tensors each reached the usual limit of 1024 open files.
* A call the pool aborted before it started (``shutdown(cancel_futures=True)``, an exception
  leaving the ``with`` block) is not run, even one already handed to the workers' queue.
  A call interrupted by Ctrl-C (a ``KeyboardInterrupt`` out of the run) aborts the pool
  itself, at once: the workers, interrupted too, would otherwise start the next queued
  calls before the parent reaches its shutdown. Between calls a worker ignores Ctrl-C: an
  idle worker it killed broke the pool, whose running calls were then sent again.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import cloudpickle

from ..errors import add_note
from ..platforms import alive
from ..remote_errors import called, portable, raise_alone

__all__: list[str] = []

_worker: dict[str, Any] = {}  # in a worker process: its slot, and the pool's abort flag


class Aborted(Exception):
    """In a worker: the call was not started, the pool having been aborted."""


_GUARD = 'if __name__ == "__main__":'


def _main_file(name: str = "__main__") -> str | None:
    """The script this program runs as ``__main__`` (None: ``python -c``, a REPL, Jupyter);
    in a worker importing it, ``__mp_main__``."""
    file = getattr(sys.modules.get(name), "__file__", None)
    return file if isinstance(file, str) else None


def starting_worker() -> str | None:
    """In a worker of ``spawn`` or ``forkserver`` that is still importing the program's
    main module (to find its functions): why no pool may be made here, naming the fix.
    None elsewhere."""
    if not getattr(multiprocessing.current_process(), "_inheriting", False):
        return None
    return (
        f"a pool was made while a worker process imported this program's main module "
        f"({_main_file('__mp_main__') or '__main__'}), as workers started by 'spawn' (Windows, macOS) or "
        f"'forkserver' do: put the code that makes the pool or starts the runs under "
        f"`{_GUARD}`, or every worker runs it again as it starts"
    )


def start_failed(method: str) -> str:
    """Why a pool none of whose workers started (each exited while starting) is given up:
    under ``spawn``/``forkserver``, most likely a script without the ``__main__`` guard."""
    why = (
        "no worker of the pool started: each exited while starting, before running "
        "anything (the workers' own error is on stderr)"
    )
    file = _main_file()
    if method not in ("spawn", "forkserver") or file is None:
        return why
    return (
        f"{why}. Workers started by {method!r} (Windows' way, and macOS's) first import "
        f"this program's main module, {file}: the code there that makes the pool or starts "
        f"the runs must sit under `{_GUARD}`, or every worker runs it again as it starts"
    )


_WINDOWS_MOST = 61  # ProcessPoolExecutor's limit there (WaitForMultipleObjects' 64 handles)


def worker_count(requested: int | None) -> int:
    """``requested``, or one worker per CPU; on Windows at most ``_WINDOWS_MOST``."""
    if sys.platform != "win32":
        return requested or os.cpu_count() or 1
    if requested is None:
        return min(_WINDOWS_MOST, os.cpu_count() or 1)
    if requested > _WINDOWS_MOST:
        raise ValueError(
            f"st.executor(workers={requested}): Windows runs at most {_WINDOWS_MOST} "
            f"worker processes in one pool; give {_WINDOWS_MOST} or fewer"
        )
    return requested


def _watch_parent(parent: int) -> None:
    """Exit this worker as soon as ``parent``, the pool's process, has exited (not only its
    direct parent: under forkserver that is the server, which the workers keep alive)."""
    try:  # Linux: a descriptor of that very process, readable once it has exited
        fd: int | None = os.pidfd_open(parent)
    except ProcessLookupError:  # it died before this worker got here
        os._exit(1)
    except (AttributeError, OSError):  # not Linux (or an old kernel): look every second
        fd = None

    def watch() -> None:
        if fd is not None:
            waiter = select.poll()  # (not select.select, which takes no fd past 1023)
            waiter.register(fd, select.POLLIN)
            while not waiter.poll():
                pass
        else:
            while alive(parent):  # (not os.kill(parent, 0): on Windows it ends it)
                time.sleep(1.0)
        os._exit(1)  # orphaned: the calls left would run for nobody

    threading.Thread(target=watch, name="somatize-parent-watch", daemon=True).start()


def _start(
    slots: Any,
    claimed: Any,
    aborted: Any,
    parent: int,
    initializer: Callable[..., Any] | None,
    args: tuple[Any, ...],
) -> None:
    # Everything the worker inherited (torch, the parent's data) lives as long as the worker:
    # out of the collector's reach, a full collection scans only what the worker made since —
    # not millions of inherited objects, touching (copying) each of their pages.
    gc.freeze()
    _watch_parent(parent)
    with claimed.get_lock():
        index = claimed.value
        claimed.value += 1
    _worker["aborted"] = aborted
    if 2 * index + 1 < len(slots):
        slots[2 * index], slots[2 * index + 1] = os.getpid(), -1
        _worker["slots"], _worker["index"] = slots, index
    if initializer is not None:
        initializer(*args)
    if threading.current_thread() is threading.main_thread():
        # Between calls a worker ignores Ctrl-C: the standard-library loop, interrupted as it
        # waits for a call, lets the worker die, the pool breaks, and the calls running on
        # the others were sent again to a fresh pool — runs started by Ctrl-C. A call runs
        # with the handler the worker started with (Python's: KeyboardInterrupt).
        _worker["sigint"] = signal.signal(signal.SIGINT, signal.SIG_IGN)


class Packed(bytes):
    """A call's result, pickled by the worker (plain ``pickle``: a tensor goes as its bytes,
    holding no file descriptor here) and unpickled by ``TorchPool`` as that call's own: a
    result that does not unpickle in the parent fails its call, where the pool would break."""

    __slots__ = ()


def _call(payload: bytes, task: int) -> Any:
    aborted = _worker.get("aborted")
    if aborted is not None and aborted.value:
        raise Aborted(task)
    slots, index = _worker.get("slots"), _worker.get("index", 0)
    if slots is not None:
        slots[2 * index + 1] = task
    sigint = _worker.get("sigint")
    fn: Any = None
    try:
        if sigint is not None:
            signal.signal(signal.SIGINT, sigint)
        fn, args, kwargs = cloudpickle.loads(payload)  # code the user sent to their own pool
        result = fn(*args, **kwargs)
        try:
            try:
                return Packed(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
            except pickle.PicklingError:  # a class of __main__ the payload rebuilt by value:
                return Packed(cloudpickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        except Exception as e:
            add_note(
                e,
                f"the call's result (a {type(result).__qualname__}) is pickled to go back "
                "to the parent process; return what can be: tensors, numbers, "
                "strings, lists and dicts of them (a TrainResult is)",
            )
            raise
    except KeyboardInterrupt:  # Ctrl-C: a terminal sends it to every worker too. The
        # standard-library loop would take the next queued call at once and run it to the end
        # (the parent aborts the pool only when it reaches shutdown): start none. A run that
        # catches the interrupt itself and returns does not get here.
        if aborted is not None:
            aborted.value = 1
        raise
    except Exception as e:
        what = called(fn, args, kwargs) if fn is not None else "fn(...)"
        error = portable(e, f"call {task}, {what},")
        if error is e:
            raise
    finally:
        if sigint is not None:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if slots is not None:
            slots[2 * index + 1] = -1
    raise_alone(error)
