"""An exception raised in a worker process, made fit to travel back to the caller.

An executor pickles what a worker raised, and the caller's process unpickles it. Two kinds
fail on the way, and a ``ProcessPoolExecutor`` that cannot unpickle an exception breaks for
good (every later call fails with ``BrokenProcessPool``, as if a worker had died):

* an exception whose class came to the worker **by value** with the code it ran (a class of
  ``__main__``, or of the user's own module that ``somatize.shipping`` pickles by value):
  plain pickle refers to a class by its module and name, and the worker's copy is not the
  object found there. It travels as ``Shipped``, its cloudpickle bytes, and ``restored``
  gives it back on the caller's side — as an instance of the caller's own class (cloudpickle
  maps a class it shipped by value back to the original), so ``except MyError`` catches it;
* one that does not unpickle at all (an ``__init__`` that takes other arguments than it
  passes to ``super().__init__``): it arrives as a ``RuntimeError`` naming it, the call and
  the fix, its traceback in a note.

The bytes are cloudpickle's, read only by the process that sent the code to its own
executor, as the results of ``TorchPool`` are (docs/campaigns.md).
"""

from __future__ import annotations

import dataclasses
import pickle
import traceback
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any, NoReturn

from .errors import add_note

__all__ = ["Shipped", "called", "portable", "raise_alone", "restored"]


class Shipped(Exception):
    """A worker's exception as cloudpickle bytes (its class came by value); ``restored``
    gives the exception itself back."""

    def __init__(self, blob: bytes, text: str) -> None:
        super().__init__(blob, text)
        self.blob, self.text = blob, text

    def __str__(self) -> str:
        return self.text


def portable(
    e: BaseException, task: str, dumps: Callable[[Any], Any] = ForkingPickler.dumps
) -> BaseException:
    """``e`` where it unpickles after ``dumps`` (how it travels back: the executor's pickle
    by default); else ``Shipped`` where cloudpickle carries it; else a ``RuntimeError``
    naming ``e`` and ``task`` (``"call 3, fn(...),"``), ``e``'s notes and traceback its notes.
    """
    try:
        pickle.loads(dumps(e))  # the worker's own exception, as the parent would read it
        return e
    except Exception as plain:
        why: Exception = plain
    try:
        import cloudpickle

        blob = cloudpickle.dumps(e)
        pickle.loads(blob)  # (one that cannot be rebuilt here cannot be there either)
        shipped = Shipped(blob, f"{task} raised {type(e).__qualname__}: {e}")
        pickle.loads(dumps(shipped))
        return shipped
    except Exception as deeper:  # (its class by value failed plain pickle first)
        why = deeper if isinstance(why, pickle.PicklingError) else why
    error = RuntimeError(
        f"{task} raised {type(e).__qualname__}: {e} — which cannot "
        f"be pickled back from the worker ({type(why).__qualname__}: {why}), "
        "so it arrives as this RuntimeError. To get the exception itself, make it picklable: "
        "pass super().__init__() every argument __init__ takes (or define __reduce__)"
    )
    for note in getattr(e, "__notes__", ()):  # what they say of e holds of this one
        add_note(error, note)
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()
    add_note(error, f"the original traceback, in the worker:\n{text}")
    return error


def restored(e: BaseException) -> BaseException:
    """On the caller's side: the exception a ``Shipped`` carries, else ``e`` itself."""
    if not isinstance(e, Shipped):
        return e
    try:
        original: BaseException = pickle.loads(e.blob)  # the user's own worker's bytes (above)
        return original
    except Exception as why:
        return RuntimeError(
            f"{e.text} — which came back from the worker but cannot be rebuilt here "
            f"({type(why).__qualname__}: {why})"
        )


def raise_alone(error: BaseException) -> NoReturn:
    """Raise ``error`` unchained; call it after the ``except`` block, not in it. Raised there,
    it would chain the exception it replaces (``__context__``), which a pickler that keeps
    chains (tblib's, which importing ``dask.distributed`` installs) carries back, to fail."""
    error.__context__ = None
    raise error


def called(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A call as its errors name it: ``train(0.1, seed=3)``, so a sweep's failed or lost
    call says which it was. Only plain values are shown (numbers, short strings, and
    dataclasses, lists, tuples and dicts of them), others by their type (``<Tensor>``):
    no ``__repr__`` of the user's is run, and it costs little at every submit."""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    shown = [_shown(a, 2) for a in args[:6]] + [
        f"{k}={_shown(v, 2)}" for k, v in list(kwargs.items())[:6]
    ]
    if len(args) > 6 or len(kwargs) > 6:
        shown.append("...")
    return f"{name}({', '.join(shown)})"


_PLAIN = (bool, int, float, type(None))


def _shown(value: Any, depth: int) -> str:
    if isinstance(value, _PLAIN):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:37] + "...")
    if depth > 0 and type(value) in (list, tuple) and len(value) <= 8:
        inner = ", ".join(_shown(v, depth - 1) for v in value)
        return f"[{inner}]" if type(value) is list else f"({inner}{',' if len(value) == 1 else ''})"
    if depth > 0 and type(value) is dict and len(value) <= 8:
        return (
            "{"
            + ", ".join(f"{_shown(k, 0)}: {_shown(v, depth - 1)}" for k, v in value.items())
            + "}"
        )
    if depth > 0 and dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [f for f in dataclasses.fields(value) if f.repr][:8]
        inner = ", ".join(
            f"{f.name}={_shown(getattr(value, f.name, None), depth - 1)}" for f in fields
        )
        return f"{type(value).__qualname__}({inner})"
    return f"<{type(value).__qualname__}>"
