"""Runs remembered by content: ``st.remember(train_one, keeper=DiskKeeper("runs"))``.

A call's key is the function's identity (its code and the user helpers it calls, as
for nodes) and its arguments' content (tensors and state dicts through the codecs).
A finished ``TrainResult`` is stored in the keeper through the codecs — never pickled —
and a call with the same key returns it without running. Each run has a checkpoint
directory named by its key (``run_checkpointing()`` inside the function): a call after a
kill resumes from the last checkpoint. A second process asking for a run that is
computing waits for it (a lock per key), then recalls it. Under torchrun the ranks of a
job call together: rank 0 takes the lock and decides, the others follow (one DDP run).

Example:
    >>> import tempfile
    >>> from somatize import DiskKeeper
    >>> def train_one(seed): ...            # builds a graph, returns trainer.fit(...)
    >>> train = remember(train_one, keeper=DiskKeeper(tempfile.mkdtemp()))
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import os
import shutil
import tempfile
import time
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing import util as mp_util
from pathlib import Path
from typing import Any

from .. import runkey, runs
from ..changes import key_parts
from ..errors import KeeperError, ValueConversionError
from ..keepers import Keeper
from ..stack import outside
from . import ddp, recalled
from .checkpoint import Checkpointing
from .codecs import default_codecs
from .remember_args import adapt
from .remember_ranks import RUN, RUN_UNKEYED, call_ranks
from .result import TrainResult
from .result_store import FIELDS, RememberedResult, decode_result, encode_result

__all__ = ["Remembered", "RememberedResult", "remember", "run_checkpointing"]


@dataclass(frozen=True)
class _Current:
    key: str
    checkpoints: Path | None


_current: contextvars.ContextVar[_Current | None] = contextvars.ContextVar(
    "somatize_remembered_run", default=None
)


def run_checkpointing(*, every_steps: int | None = None, keep: int = 3) -> Checkpointing:
    """Where the remembered run being computed checkpoints: a directory named by its key.

    Give it to the Trainer and fit with ``resume="last"``: a call after a kill resumes
    from the last checkpoint, bitwise. Outside a remembered run (a plain call of the
    function), a fresh temporary directory — there is nothing to resume — removed when
    this process exits (a worker process of a pool too), so a sweep of plain calls leaves
    no checkpoints behind in the temporary folder.

    Example:
        >>> def train_one(seed):  # doctest: +SKIP
        ...     trainer = st.Trainer(..., checkpoint=st.run_checkpointing(every_steps=50))
        ...     return trainer.fit(g, data, resume="last")
    """
    current = _current.get()
    path = current.checkpoints if current is not None else None
    if path is None:
        path = _scratch()
    return Checkpointing(path, every_steps=every_steps, keep=keep)


def _scratch() -> Path:
    """A temporary directory removed when this process exits: by multiprocessing's exit
    hook, which runs in the main process at exit and in a pool's worker as it ends (where
    ``atexit`` does not), and only in the process that made it (not in a forked child)."""
    path = Path(tempfile.mkdtemp(prefix="somatize-run-"))
    mp_util.Finalize(
        None, shutil.rmtree, args=(path,), kwargs={"ignore_errors": True}, exitpriority=0
    )
    return path


class Remembered:
    """A training function whose finished runs are remembered (made by ``remember``).

    Calling it returns a ``RememberedResult``. ``key(...)`` and ``explain(...)`` take
    the same arguments as the function.
    """

    def __init__(
        self,
        fn: Callable[..., TrainResult],
        keeper: Keeper,
        exclude: Sequence[str],
        dir: str | os.PathLike[str] | None,
    ) -> None:
        if not isinstance(fn, types.FunctionType):
            raise TypeError(
                f"st.remember takes a function defined with def, not a {type(fn).__qualname__}"
            )
        if isinstance(exclude, str):
            exclude = (exclude,)
        if dir is None:
            base = getattr(keeper, "path", None)
            if base is None:
                raise ValueError(
                    f"{keeper!r} has no directory for the runs' checkpoints and records; "
                    "pass dir=... to st.remember (or use a DiskKeeper)"
                )
            dir = Path(base) / runs.FOLDER
        self.fn, self.keeper, self.exclude = fn, keeper, tuple(exclude)
        self.store = runs.RunStore(dir)
        self.codecs = default_codecs()
        self._identity: tuple[str, dict[str, str], str] | None = None  # set when shipped
        unknown = sorted(set(self.exclude) - set(inspect.signature(fn).parameters))
        if unknown:
            raise ValueError(
                f"exclude names {', '.join(map(repr, unknown))}, which {fn.__qualname__} does "
                f"not take; its arguments: {', '.join(inspect.signature(fn).parameters)}"
            )
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", "remembered")
        self.__doc__ = fn.__doc__

    def __getstate__(self) -> dict[str, Any]:
        # the identity is computed where the function is defined (its source is there)
        state = {**self.__dict__, "codecs": None}
        state["_identity"] = self._identity or key_parts(self.fn, self.codecs)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.codecs = default_codecs()

    def __repr__(self) -> str:
        return f"remember({self.fn.__qualname__}, keeper={self.keeper!r})"

    def call_key(self, *args: Any, **kwargs: Any) -> runkey.CallKey:
        return runkey.call_key(
            self.fn,
            args,
            kwargs,
            exclude=self.exclude,
            codecs=self.codecs,
            adapt=adapt,
            identity=self._identity,
        )

    def key(self, *args: Any, **kwargs: Any) -> str:
        """The key a call with these arguments has."""
        return self.call_key(*args, **kwargs).key

    def explain(self, *args: Any, **kwargs: Any) -> str:
        """Why a call with these arguments would be recalled, or which key part differs
        from the nearest remembered run (the code, a helper, an argument)."""
        ck = self.call_key(*args, **kwargs)
        return runs.explain(self.store, ck, self._recall(ck.key) is not None)

    def _recall(self, key: str) -> RememberedResult | None:
        record = self.store.record(key)
        if record is None or record.get("status") != "done":
            return None
        data = self.keeper.get(key)
        if data is None:
            return None
        result = decode_result(data, self.codecs, key)
        if result is not None:
            self.store.touch(key)
        return result

    def __call__(self, *args: Any, **kwargs: Any) -> RememberedResult:
        ck = self.call_key(*args, **kwargs)
        rank, world, _ = ddp.setup()  # (the group fit would make; it stays for the fit)
        if world > 1:
            return call_ranks(self, ck, args, kwargs, rank)
        found = self._recall(ck.key)
        if found is None:
            with self.store.lock(ck.key):  # a second caller waits here, then recalls
                found = self._recall(ck.key)  # computed meanwhile by the lock's holder
                if found is None:
                    return self._compute(ck, args, kwargs)
        recalled.tell(ck, found)  # one line: nothing was trained, and how to train again
        return found

    def forget(self, *args: Any, **kwargs: Any) -> bool:
        """Forget the run a call with these arguments has — its record, its result and its
        checkpoints — so the next such call trains it again (after a change its key does
        not see: a file read by path, an environment variable). Returns whether there was
        one.

        Raises:
            KeeperError: that run is being computed now, by another call holding its lock.

        Example:
            >>> train.forget(3)  # doctest: +SKIP
            True
            >>> train(3).recalled  # doctest: +SKIP
            False
        """
        return recalled.forget(self.store, self.key(*args, **kwargs), self.keeper)

    def _follow(
        self, ck: runkey.CallKey, args: Sequence[Any], kwargs: Mapping[str, Any], keyed: bool
    ) -> RememberedResult:
        """A DDP rank other than 0 runs the same fit, with rank 0's checkpoint directory
        (``keyed``) or, as rank 0, a temporary one; rank 0 records the run."""
        checkpoints = self.store.checkpoints(ck.key) if keyed else None
        token = _current.set(_Current(ck.key, checkpoints))
        try:
            result = self.fn(*args, **kwargs)
        finally:
            _current.reset(token)
        return self._returned(result, ck.key) if isinstance(result, TrainResult) else result

    def _compute(
        self,
        ck: runkey.CallKey,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        tell: Callable[[int], None] | None = None,
    ) -> RememberedResult:
        problems: list[str] = []
        checkpoints: Path | None = self.store.checkpoints(ck.key)
        record = {
            "function": ck.function,
            "code": ck.code,
            "helpers": ck.helpers,
            "versions": ck.versions,
            "args": ck.args,
            "summary": ck.summary,
            "excluded": list(ck.excluded),
            "started": time.time(),
        }
        try:
            self.store.write(ck.key, {**record, "status": "started"})
        except KeeperError as e:
            problems.append(str(e))
            checkpoints = None  # checkpoints go to a temporary directory instead
        if tell is not None:  # under torchrun: the other ranks run it too, checkpointed alike
            tell(RUN if checkpoints is not None else RUN_UNKEYED)
        token = _current.set(_Current(ck.key, checkpoints))
        try:
            result = self.fn(*args, **kwargs)
        except BaseException as e:
            failed = {**record, "status": "failed", "error": f"{type(e).__name__}: {e}"}
            if not problems:
                try:
                    self.store.write(ck.key, failed)
                except KeeperError as e:
                    problems.append(str(e))
            raise
        finally:
            _current.reset(token)
        if not isinstance(result, TrainResult):
            why = f"{ck.function} returned a {type(result).__qualname__}, not a TrainResult"
            self._unremembered(ck.key, record, why, problems)
            warnings.warn(f"{why}: its run is not remembered", RuntimeWarning, stacklevel=outside())
            return result  # type: ignore[no-any-return]
        if result.pruned and self._pruner_outside_key(args, kwargs) is not None:
            # stopped by what the key does not hold (a study's trial): forgotten, checkpoints
            # too, so a later call (without the trial, in another study) trains in full
            with contextlib.suppress(OSError):
                self.store.remove(ck.key)
            return self._returned(result, ck.key)
        try:
            payload = encode_result(result, self.codecs)
        except ValueConversionError as e:
            self._unremembered(ck.key, record, str(e), problems)
            warnings.warn(
                f"{e}; the run's result is returned but not remembered",
                RuntimeWarning,
                stacklevel=outside(),
            )
            return self._returned(result, ck.key)
        try:
            self.keeper.put(ck.key, payload)
            summary = result.summary()
            self.store.write(
                ck.key,
                {
                    **record,
                    "status": "done",
                    "finished": time.time(),
                    "bytes": len(payload),
                    "result": {k: v for k, v in summary.items() if k != "metrics"},
                    "metrics": summary.get("metrics", {}),
                },
            )
        except KeeperError as e:
            problems.append(str(e))
        for problem in problems:
            warnings.warn(
                f"KeeperError: {problem}; the run's result is returned but not remembered",
                RuntimeWarning,
                stacklevel=outside(),
            )
        return self._returned(result, ck.key)

    def _pruner_outside_key(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
        """The excluded argument that is a pruner (``report`` and ``should_prune``: an
        Optuna ``Trial``), whose decisions depend on what the run's key does not hold."""
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs).arguments
        except TypeError:
            return None
        for name in self.exclude:
            value = bound.get(name)
            if callable(getattr(value, "report", None)) and callable(
                getattr(value, "should_prune", None)
            ):
                return name
        return None

    def _unremembered(
        self, key: str, record: dict[str, Any], why: str, problems: list[str]
    ) -> None:
        """The run finished but what it returned cannot be stored: its record says so (not
        ``started``, which reads as a run killed)."""
        if problems:
            return
        with contextlib.suppress(KeeperError):
            self.store.write(
                key, {**record, "status": "unremembered", "finished": time.time(), "error": why}
            )

    @staticmethod
    def _returned(result: TrainResult, key: str) -> RememberedResult:
        fields = {f.name: getattr(result, f.name) for f in FIELDS}
        return RememberedResult(**fields, recalled=False, key=key)


def remember(
    fn: Callable[..., TrainResult],
    *,
    keeper: Keeper,
    exclude: Sequence[str] = (),
    dir: str | os.PathLike[str] | None = None,
) -> Remembered:
    """Remember the finished runs of a training function, by its code and its arguments.

    What ``fn`` reads from outside Python — environment variables, files by path, the
    clock — enters no key: read it in the caller and pass it as an argument.

    Args:
        fn: a function returning a ``TrainResult`` (from ``Trainer.fit``).
        keeper: where results are stored (a ``DiskKeeper`` shared by processes).
        exclude: argument names left out of the key (a pool, a logger, a device). A run
            stopped by a pruner passed this way (an Optuna ``trial``) is not remembered:
            its stop was the study's verdict, which the key does not hold.
        dir: the runs' records and checkpoints (default: ``remembered/`` in the keeper's
            directory); ``somatize runs --dir DIR [--keeper KEEPER_DIR]`` lists and cleans
            them.

    Returns:
        A callable with ``fn``'s arguments returning a ``RememberedResult``;
        ``.recalled`` says whether it was read back without running.

    Raises:
        ValueConversionError: when called, for an argument that cannot enter the key
            (a lambda, an open file, a generator, an arbitrary object); the message
            names it and says how to pass it, or to exclude it.

    Example:
        >>> train = remember(train_one, keeper=DiskKeeper("runs"))  # doctest: +SKIP
        >>> results = [train(seed) for seed in range(5)]  # doctest: +SKIP
    """
    return Remembered(fn, keeper, exclude, dir)
