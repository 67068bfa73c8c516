"""Many runs as plain Python: ``summarize`` over results, and a process pool fit for torch.

A campaign is a list of ``TrainResult``s, made by any ``concurrent.futures.Executor``::

    with st.executor(workers=2) as pool:
        results = list(pool.map(train_one_seed, range(5)))
    print(st.summarize(results, "val_acc"))

``executor()`` returns a process pool configured for torch work; Dask's
``Client(...).get_executor()`` works unchanged for many machines. Executors run
whatever code they are sent (cloudpickle is used to ship functions defined in
``__main__`` or interactively): use them only with machines and code you trust.
"""

from __future__ import annotations

import importlib
import math
import multiprocessing
import os
import statistics
import sys
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from ..counted import counted
from ..errors import SettingError
from ..stack import outside
from .intervals import mean_interval
from .options import improves
from .pool import TorchPool

__all__ = ["Summary", "executor", "summarize"]


@dataclass(frozen=True)
class Summary:
    """Statistics of one metric over runs. ``str()`` gives a readable table.

    Attributes:
        metric: the metric summarised.
        values: its value in each run, in run order.
        n, mean, std (sample standard deviation; 0 for one run), min, max.
        best: the index of the best run (by ``mode``).
        mode: ``"min"`` or ``"max"`` — which way is better.
        ci: the 95% confidence interval of the mean, ``(low, high)``: Student's t over
            n - 1 degrees of freedom (five runs: mean ± 2.78·std/√5); (NaN, NaN) for one run.
    """

    metric: str
    values: tuple[float, ...]
    n: int
    mean: float
    std: float
    min: float
    max: float
    best: int
    mode: str

    @property
    def ci(self) -> tuple[float, float]:
        """The 95% confidence interval of ``mean`` (see the class's docstring)."""
        return mean_interval([v for v in self.values if not math.isnan(v)])

    def __str__(self) -> str:
        width = max(len(str(self.n - 1)), 3)
        rows = [f"{'run':>{width}}  {self.metric}"]
        for i, v in enumerate(self.values):
            rows.append(f"{i:>{width}}  {v:.4f}{'  <- best' if i == self.best else ''}")
        low, high = self.ci
        ci = "" if math.isnan(low) else f"95% CI {low:.4f} to {high:.4f}, "
        spread = f" ± {self.std:.4f}" if self.n > 1 else ""  # (one run: no spread to show)
        rows.append(
            f"{self.metric}: {self.mean:.4f}{spread} over {counted(self.n, 'run')} "
            f"({ci}min {self.min:.4f}, max {self.max:.4f})"
        )
        return "\n".join(rows)


def summarize(
    results: Sequence[Any],
    metric: str,
    *,
    mode: Literal["min", "max"] | None = None,
    nan: Literal["raise", "omit"] = "raise",
) -> Summary:
    """n, mean, std, min, max of ``metric`` over runs, and which run was best.

    Args:
        results: ``TrainResult``s (their last evaluated value of ``metric`` is used), or numbers.
        metric: e.g. ``"val_acc"``, ``"val_loss"``.
        mode: which way is better; by default what the name says, as for
            ``Options(monitor=)``: ``"min"`` for a loss or an error (``val_loss``,
            ``val_mse``, ``val_ppl``), ``"max"`` for an accuracy, F1, AUC... and otherwise,
            with a warning to say which.
        nan: a run whose value is NaN (a diverged run) raises by default; ``"omit"``
            leaves such runs out of the statistics (``values`` still lists them, ``n``
            counts the rest).

    Raises:
        ValueError: no results, a None among them (a run ``run_all`` lost or saw fail:
            pass ``runs.finished``), or a NaN value with ``nan="raise"`` (naming the runs).
        TypeError: ``run_all``'s ``Runs`` itself, or an entry neither a result nor a number.

    Example:
        >>> s = summarize([0.9, 0.95, 0.92], "val_acc")
        >>> round(s.mean, 4), s.best
        (0.9233, 1)
    """
    if hasattr(results, "finished") and hasattr(results, "lost"):
        raise TypeError(
            f"summarize({metric!r}) takes a list of results, not run_all's "
            f"{type(results).__qualname__}; pass runs.finished (the runs that finished)"
        )
    if not results:
        raise ValueError(
            f"no results to summarize for {metric!r}: the list is empty; pass at least one "
            "run's result (run_all's runs.finished is empty when every run failed or was "
            "lost: see runs.failed and runs.lost)"
        )
    values = tuple(_value(r, i, metric) for i, r in enumerate(results))
    if mode is None:
        mode = improves(metric) or "max"
        if improves(metric) is None and len(results) > 1:
            warnings.warn(
                f"summarize({metric!r}): the name does not say which way it improves, so "
                "best is the run with the largest value; pass mode='min' if lower is better "
                "(or mode='max' to say so)",
                UserWarning,
                stacklevel=outside(),
            )
    if nan not in ("raise", "omit"):
        raise ValueError(f"nan must be 'raise' or 'omit', not {nan!r}")
    if mode not in (None, "min", "max"):
        raise ValueError(
            f"summarize({metric!r}, mode={mode!r}): mode is 'min' (lower is better), 'max', "
            "or None to read it from the metric's name"
        )
    bad = [i for i, v in enumerate(values) if math.isnan(v)]
    if bad and nan == "raise":
        raise ValueError(
            f"{metric!r} is NaN in run(s) {bad[:10]} (diverged?); fix those runs or pass "
            "nan='omit' to summarize the others"
        )
    used = [v for v in values if not math.isnan(v)]
    if not used:
        raise ValueError(
            f"{metric!r} is NaN in every run (all {len(values)}); nothing to summarize — look for "
            "a too-high learning rate or bad data, or summarize a metric that is finite"
        )
    pick = min if mode == "min" else max
    return Summary(
        metric=metric,
        values=values,
        n=len(used),
        mean=statistics.fmean(used),
        std=statistics.stdev(used) if len(used) > 1 else 0.0,
        min=min(used),
        max=max(used),
        best=values.index(pick(used)),
        mode=mode,
    )


def _value(result: Any, i: int, metric: str) -> float:
    """``metric`` of ``results[i]``: a result's last evaluated value, or a number."""
    if hasattr(result, "metric"):
        return float(result.metric(metric))
    if result is None:
        raise ValueError(
            f"summarize({metric!r}): results[{i}] is None — a run that failed or was lost "
            "(run_all's Runs.results holds None for those); pass runs.finished, or leave "
            "those runs out"
        )
    if isinstance(result, bool) or not hasattr(result, "__float__"):
        raise TypeError(
            f"summarize({metric!r}): results[{i}] is a {type(result).__qualname__}; it takes "
            "TrainResults (their last value of the metric) or numbers"
        )
    return float(result)


#: What every worker starts with: torch, somatize, and what a first run would otherwise
#: import lazily in each fresh worker — the first optimizer step loads torch's compiler
#: stack (``torch._dynamo``, with sympy: some 800 modules, over a second of CPU), which
#: made a pool of short runs slower than a loop. Under ``fork`` they are imported in this
#: process before the workers are forked; under ``forkserver``, once in the forkserver.
PRELOAD = (
    "torch",
    "torch._dynamo",
    "torch.profiler",
    "torch.optim",
    "somatize",
    "somatize.dsl",
    "somatize.torch",
)

StartMethod = Literal["fork", "forkserver", "spawn"]


def _init_worker(threads: int) -> None:
    import importlib

    import torch

    torch.set_num_threads(threads)
    for name in PRELOAD:  # already there under fork and forkserver; under spawn, imported here
        importlib.import_module(name)
    # A forked worker starts with the global generators of the process it was forked from,
    # so every worker would draw the same numbers (weights built before fit seeds the run,
    # data made at random): fresh seeds, as Python reseeds `random` after a fork and as
    # DataLoader seeds each worker apart. A run that seeds itself is unaffected.
    fresh = int.from_bytes(os.urandom(8), "little")
    torch.manual_seed(fresh)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(fresh % 2**32)


def _cuda_initialized() -> bool:
    import torch

    return bool(torch.cuda.is_initialized())


def _fork_unsafe(threads_per_worker: int = 1) -> str | None:
    """None if forking this process for workers is safe now, else why not.

    Safe: Linux; one torch thread per worker (after a fork, a multi-threaded OpenMP
    region in the child can hang for good once the parent has used OpenMP threads —
    measured: a worker's first 2-thread matmul never returned — while one thread never
    enters the OpenMP team); CUDA not initialized here (a forked child cannot use CUDA
    once the parent has); and no Python thread but this one (a thread holding a lock
    when the process forks leaves it held forever in the child). torch's own idle
    native threads are in every process that imported torch: forking with them, workers
    on one thread, is what torch's ``DataLoader`` does on Linux by default.
    """
    if (
        not sys.platform.startswith("linux")
        or "fork" not in multiprocessing.get_all_start_methods()
    ):
        return f"fork is not the platform's way to start processes ({sys.platform})"
    if threads_per_worker != 1:
        return f"threads_per_worker={threads_per_worker} (OpenMP threads in a forked worker)"
    if _cuda_initialized():
        return "CUDA is initialized in this process (a forked worker could not use it)"
    if threading.active_count() > 1:
        names = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
        return f"this process runs other threads ({', '.join(names[:3])})"
    return None


def _off_the_main_thread() -> str | None:
    """Why forking now is unsafe even with ``start_method="fork"`` said: a replacement pool
    is made by the broken pool's own thread, while this process's main thread runs on."""
    if threading.current_thread() is threading.main_thread():
        return None
    return (
        f"started from the thread {threading.current_thread().name} (a lost worker's replacement)"
    )


def _fallback() -> str:
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def _pick_start_method(requested: StartMethod | None = None, threads_per_worker: int = 1) -> str:
    """The start method ``executor(start_method=requested)`` uses.

    ``None`` (the default): ``"fork"`` where forking is safe — workers start in
    milliseconds, with everything this process imported — else ``"forkserver"`` (a
    server process started once, torch and ``PRELOAD`` imported there: about two
    seconds the first time, then fast), or ``"spawn"`` where there is no forkserver.

    Raises:
        ValueError: a method the platform lacks, or ``"fork"`` once CUDA is initialized.
    """
    methods = multiprocessing.get_all_start_methods()
    if requested is None:
        return "fork" if _fork_unsafe(threads_per_worker) is None else _fallback()
    if requested not in methods:
        raise ValueError(
            f"st.executor(start_method={requested!r}): this platform starts processes by "
            f"{', '.join(map(repr, methods))}; pass one of those, or None to let it pick"
        )
    if requested == "fork" and _cuda_initialized():
        raise ValueError(
            "start_method='fork' with CUDA initialized in this process: forked workers cannot "
            "use CUDA — pass start_method='forkserver' (or None, which picks it)"
        )
    return requested


def executor(
    workers: int | None = None,
    *,
    threads_per_worker: int = 1,
    retries: int = 1,
    start_method: StartMethod | None = None,
) -> TorchPool:
    """A process pool configured correctly for torch work.

    * workers start by ``fork`` where that is safe (Linux, one thread per worker, CUDA
      not initialized here, no Python thread but this one), else by ``forkserver``;
      ``PRELOAD`` (torch, somatize, what a first optimizer step imports) is imported
      first — here before forking, or once in the forkserver — so workers start fast
      and a worker's first run is as fast as its later ones. ``start_method=`` says
      which, explicitly (see docs/campaigns.md for why each is chosen);
    * ``torch.set_num_threads(threads_per_worker)`` in each worker — without it two
      workers on two cores thrash, and runs get many times slower;
    * torch's and numpy's global generators seeded afresh in each worker (forked ones
      would all draw the same numbers); a run that seeds itself is unaffected;
    * a worker that dies (killed, out of memory) costs a re-run of the call it was running
      and of the calls running beside it (the standard-library pool stops them all), on a
      fresh pool, not the campaign (``TorchPool``); the fresh pool's workers are started by
      ``forkserver``, never forked from the broken pool's thread;
    * a call's exception arrives as itself (a class of ``__main__`` too), or, where it would
      not unpickle here, as a ``RuntimeError`` that names it and the call (not as a broken
      pool); a worker exits when this process dies;
    * use it as a context manager for a clean shutdown: an exception leaving the block
      (Ctrl-C) cancels the calls not started, a normal exit waits for all.

    Args:
        workers: worker processes (default: the number of CPUs).
        threads_per_worker: torch intra-op threads in each worker.
        retries: how often a call whose worker died is re-run on a fresh worker.
        start_method: ``"fork"``, ``"forkserver"`` or ``"spawn"``; None picks (above).
            The method in use is ``pool.start_method``.

    Example:
        >>> with executor(workers=2) as pool:  # doctest: +SKIP
        ...     results = list(pool.map(train_one_seed, range(4)))
    """
    if workers is not None and (type(workers) is not int or workers < 1):
        raise SettingError(
            f"st.executor(workers={workers!r}): workers is a whole number of processes, at "
            "least 1; leave it out (None) for one per CPU"
        )
    if type(threads_per_worker) is not int or threads_per_worker < 1:
        raise SettingError(
            f"st.executor(threads_per_worker={threads_per_worker!r}): it is how many torch "
            "threads each worker runs (torch.set_num_threads), a whole number of at least 1; "
            "leave it at 1 when there are as many workers as cores"
        )
    chosen = _pick_start_method(start_method, threads_per_worker)
    ctx = multiprocessing.get_context(chosen)
    fallback = None
    if chosen == "fork":
        for name in PRELOAD:  # imported once here, so that every forked worker has them
            importlib.import_module(name)
        # picked by us: if forking turns unsafe, start the next way. Said explicitly: still
        # never forked from a thread (a replacement pool is made by the broken pool's thread)
        fallback = multiprocessing.get_context(_fallback())
    unsafe = (
        _off_the_main_thread
        if start_method == "fork"
        else partial(_fork_unsafe, threads_per_worker)
    )
    for c in (ctx, fallback):
        if c is not None and c.get_start_method() == "forkserver":
            c.set_forkserver_preload(list(PRELOAD))
    return TorchPool(
        max_workers=workers,  # (None: one per CPU, at most 61 on Windows)
        mp_context=ctx,
        initializer=_init_worker,
        initargs=(threads_per_worker,),
        retries=retries,
        fallback=(fallback, unsafe) if fallback else None,
    )
