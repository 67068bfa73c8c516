"""``run_all(pool, fn, items)``: a campaign over any executor, every run that finished
returned, the lost ones (and, with ``errors="return"``, the failed ones) reported by index."""

from __future__ import annotations

import importlib
import pickle
import reprlib
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import BrokenExecutor, Executor, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import add_note
from ..stack import outside

__all__ = ["Runs", "note_unpicklable", "run_all"]


@dataclass(frozen=True)
class Runs:
    """The outcome of ``run_all``: what finished, what was lost, and what failed.

    Attributes:
        results: one entry per item, in item order; None where the run was lost or failed.
        lost: item index -> why its run was lost (its worker died, more than retried).
        failed: item index -> the exception its run raised, with a note naming the item
            (``run_all(..., errors="return")`` only; with ``"raise"`` it is raised).
    """

    results: list[Any]
    lost: dict[int, str]
    failed: dict[int, BaseException] = field(default_factory=dict)

    @property
    def finished(self) -> list[Any]:
        """The results of the runs that finished, in item order (for ``summarize``, ``fedavg``)."""
        return [
            r for i, r in enumerate(self.results) if i not in self.lost and i not in self.failed
        ]


_short = reprlib.Repr()  # an item as a note shows it: a config, cut short where long
_short.maxstring = _short.maxother = 120
_short.maxdict = _short.maxlist = _short.maxtuple = 12


def _is_loss(e: BaseException) -> bool:
    # BrokenProcessPool and WorkerLostError are BrokenExecutors; Dask gives up with KilledWorker
    return isinstance(e, BrokenExecutor) or type(e).__name__ == "KilledWorker"


def run_all(
    pool: Executor,
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    *,
    errors: Literal["raise", "return"] = "raise",
) -> Runs:
    """Run ``fn`` over ``items`` on ``pool``; return every run that finishes.

    A run whose worker is lost (and is not re-run by the pool: ``st.executor`` re-runs it
    once, Dask reschedules it) is reported in ``Runs.lost`` by index; the other runs are
    unaffected. Interrupted (Ctrl-C), it cancels its runs not started, as ``map`` does.

    Args:
        pool: any ``concurrent.futures.Executor`` (``st.executor()``, a
            ``ProcessPoolExecutor``, ``client.get_executor(pure=False)``: Dask's is pure
            by default, running equal calls once, and run_all warns when items repeat).
        fn: ``fn(item) -> result``, one run.
        items: one per run (a seed, a config).
        errors: ``"raise"``: an exception ``fn`` raises is raised (the first, by index)
            once every run has settled. ``"return"``: it is kept in ``Runs.failed`` by
            index, its result None, and the campaign's other results are returned — a
            sweep keeps the configurations that ran when one diverges or runs out of memory.

    Example:
        >>> with executor(workers=2) as pool:  # doctest: +SKIP
        ...     runs = run_all(pool, train_one_seed, range(8), errors="return")
        >>> runs.lost, runs.failed              # doctest: +SKIP
        ({}, {})
    """
    if not callable(getattr(pool, "submit", None)):
        raise TypeError(
            f"run_all takes an executor (st.executor(), a ProcessPoolExecutor, "
            f"client.get_executor()), not {pool!r:.60}"
        )
    if errors not in ("raise", "return"):
        raise ValueError(
            f"errors must be 'raise' (a run that raises fails the campaign) or 'return' (it "
            f"is kept in Runs.failed), not {errors!r}"
        )
    if not hasattr(items, "__iter__") and not hasattr(items, "__getitem__"):
        raise TypeError(
            f"run_all(pool, fn, items): items holds one entry per run (range(8), a list of "
            f"configs), not {items!r:.60} ({type(items).__qualname__}); for one run, [item]"
        )
    items = list(items)
    _warn_if_dask_runs_repeats_once(pool, items)
    futures: list[Future[Any]] = []
    try:
        futures.extend(pool.submit(fn, item) for item in items)
        wait(futures)
    except BaseException:  # Ctrl-C: the runs not started are cancelled, as map does
        for f in futures:
            f.cancel()
        raise
    results: list[Any] = []
    lost: dict[int, str] = {}
    failed: dict[int, BaseException] = {}
    for i, f in enumerate(futures):
        e = f.exception()
        if e is None:
            results.append(f.result())
            continue
        results.append(None)
        if _is_loss(e):
            lost[i] = f"{type(e).__name__}: {e}"
            if type(e).__name__ == "BrokenProcessPool":
                lost[i] += _BROKEN
            continue
        note_unpicklable(e, fn, pool, "run_all")
        note = (
            f"run_all: raised by fn(items[{i}]) — items[{i}] = {_short.repr(items[i])}; run "
            "that item with fn(item) here to debug it"
        )
        if isinstance(e, TypeError) and type(items[i]) is tuple and "positional arg" in str(e):
            note += (
                " — run_all passes each item whole, as one argument: for items that are "
                "tuples of arguments, run_all(pool, lambda args: fn(*args), items) "
                "(st.executor ships lambdas)"
            )
        add_note(e, note)
        if errors == "raise":
            raise e
        failed[i] = e
    return Runs(results, lost, failed)


_BROKEN = (
    " — one worker died, and a plain ProcessPoolExecutor then fails every run not finished "
    "(this one may never have started) and stays broken; st.executor(workers=...) re-runs "
    "the dead worker's run and resubmits the others"
)


def _warn_if_dask_runs_repeats_once(pool: Executor, items: list[Any]) -> None:
    """Dask's ``client.get_executor()`` is pure by default: calls with equal arguments are
    one task, run once, whose result each gets — repeats of an unseeded run are one run,
    repeated (``summarize``: std 0). Warn, with the fix, where ``items`` repeat on it.

    Without importing dask here: the executor is known by its type's name; the options it
    was made with are its ``_kwargs`` (distributed's ``ClientExecutor`` has kept them there
    since it was written; gone, no warning); equal calls are those dask's own ``tokenize``
    (imported already, with the executor) gives one key, as ``Client.submit`` does."""
    kind = type(pool)
    if kind.__name__ != "ClientExecutor" or not kind.__module__.startswith("distributed."):
        return
    options = getattr(pool, "_kwargs", None)
    if not isinstance(options, dict) or not options.get("pure", True):
        return
    try:
        tokenize = importlib.import_module("dask.base").tokenize
        keys = [tokenize(item) for item in items]
    except Exception:  # (an item dask cannot tokenize: its own error comes at submit)
        return
    first: dict[str, int] = {}
    repeats = [(first[k], i) for i, k in enumerate(keys) if first.setdefault(k, i) != i]
    if repeats:
        j, i = repeats[0]
        warnings.warn(
            f"run_all: items[{j}] and items[{i}] are the same call ({len(repeats)} repeat(s) in "
            "all), and Dask's client.get_executor() is pure by default: it runs equal calls "
            "once, and each gets that one result — repeats of an unseeded run would be one "
            "run, repeated (summarize: std 0). For repeats meant to differ, use "
            "client.get_executor(pure=False); for seeded runs, give each item its own seed",
            UserWarning,
            stacklevel=outside(),
        )


def note_unpicklable(e: BaseException, fn: Callable[..., Any], pool: Executor, caller: str) -> None:
    """Where ``e`` is ``pool`` failing to pickle ``fn`` (a lambda, a closure: a plain
    ``ProcessPoolExecutor`` pickles functions by reference), say so on ``e``, with the fix."""
    if not isinstance(pool, ProcessPoolExecutor) or "pickle" not in str(e).lower():
        return  # (st.executor and Dask ship functions with cloudpickle)
    try:
        pickle.dumps(fn)
    except Exception:
        name = getattr(fn, "__qualname__", type(fn).__qualname__)
        add_note(
            e,
            f"{caller}: the function {name} cannot be pickled to go to the "
            f"{type(pool).__qualname__}'s workers, which pickle functions by reference; use "
            "st.executor(...), which ships code with cloudpickle, or define the function at "
            "module level",
        )
