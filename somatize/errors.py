"""Every error somatize raises, in one tree.

Each leaf also subclasses the nearest built-in, so ``except TypeError`` or
``except ValueError`` written against plain Python keeps working::

    SomatizeError (Exception)
    ├── ValueConversionError (TypeError)     a value cannot cross an edge as data
    │   └── CrossingError                    an Opaque value would have to cross hosts
    ├── NodeError (TypeError)                a node broke its contract (returned no Done, ...)
    ├── DeclarationError (TypeError)         a cached node's arguments cannot enter its key
    ├── GraphError (ValueError)              the graph is malformed
    │   ├── CycleError                       the edges form a cycle (the message names it)
    │   ├── DuplicateNodeError               two nodes share an id
    │   ├── MissingNodeError (also KeyError) an id that is not in the graph
    │   └── EmptyGraphError                  a graph with no nodes was run or compiled
    ├── MissingValueError (KeyError)         a node read ctx.values[name] the run was not given
    ├── CacheError (ValueError)              caching asked of something that cannot be cached
    ├── KeeperError (OSError)                a keeper could not store or read an entry
    ├── TransportError (RuntimeError)        a slice could not be carried to its host or run there
    │   └── WorkerLostError (also BrokenExecutor)  a worker died running a call, past its retries
    ├── CheckpointError (ValueError)         a checkpoint is missing, torn or not ours
    ├── NonFiniteError (FloatingPointError)  a training step's loss is NaN or infinite
    ├── SettingError (ValueError, TypeError) a Trainer setting or its input is wrong
    ├── StateError (ValueError)              a state dict does not fit the graph
    ├── AggregationError (ValueError)        client updates cannot be combined
    └── MissingExtraError (ImportError)      an optional dependency is not installed
"""

from __future__ import annotations

from concurrent.futures import BrokenExecutor


class SomatizeError(Exception):
    """The root of every error somatize raises."""


class ValueConversionError(SomatizeError, TypeError):
    """A value cannot cross an edge as data: convert it, or wrap it in ``Opaque``."""

    #: A codec's refusal worded for the graph's input, where the fix differs (set by the
    #: codec; None: the message fits every value)
    as_input: str | None = None


class CrossingError(ValueConversionError):
    """An ``Opaque`` value would have to move to another host; the message names the edge."""


class NodeError(SomatizeError, TypeError):
    """A node broke its contract, for example by returning something other than ``Done``."""


class DeclarationError(SomatizeError, TypeError):
    """A cached node's constructor arguments cannot be written into its key."""


class GraphError(SomatizeError, ValueError):
    """The graph is malformed."""


class CycleError(GraphError):
    """The edges form a cycle; the message names the nodes on it."""


class DuplicateNodeError(GraphError):
    """Two nodes were given the same id."""


class MissingNodeError(GraphError, KeyError):
    """An id names no node of the graph."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class EmptyGraphError(GraphError):
    """A graph without nodes was compiled or run."""


class MissingValueError(SomatizeError, KeyError):
    """A node read ``ctx.values[name]`` in a run not given that name (or no values at all;
    ``g.forward(x, values={name: ...})`` passes them)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class CacheError(SomatizeError, ValueError):
    """Caching was asked of something that cannot be cached (an Opaque input or output)."""


class KeeperError(SomatizeError, OSError):
    """A keeper could not store or read an entry."""


class TransportError(SomatizeError, RuntimeError):
    """A slice of a plan could not be carried to its host (no transport, code that does not
    pickle) or its worker was lost; the message names the slice and the host."""


class WorkerLostError(TransportError, BrokenExecutor):
    """A pool's worker died (killed, out of memory, crashed) while running a call, more
    times than the pool re-runs it; ``except BrokenExecutor`` still catches it."""


class CheckpointError(SomatizeError, ValueError):
    """A checkpoint is missing, truncated, corrupt or not written by somatize."""


class NonFiniteError(SomatizeError, FloatingPointError):
    """A training step's loss is NaN or infinite; the message names the step, epoch and batch."""


class SettingError(SomatizeError, ValueError, TypeError):
    """A Trainer setting (or what it was given to train on) is wrong; the message names the
    value and the fix. Both a ``ValueError`` and a ``TypeError``, so either ``except`` works."""


class StateError(SomatizeError, ValueError):
    """A state dict does not fit the graph: missing or unexpected keys, wrong shapes."""


class AggregationError(SomatizeError, ValueError):
    """Client updates cannot be combined (mismatched keys, shapes, non-finite values...)."""


class MissingExtraError(SomatizeError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""


def require(module: str, extra: str) -> object:
    """Import an optional dependency, or raise an error naming the extra that provides it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(
            f"{module!r} is not installed; install it with: pip install 'somatize[{extra}]'"
        ) from e


def add_note(e: BaseException, note: str) -> None:
    """Add ``note`` to ``e``'s notes once (``BaseException.add_note`` on Python >= 3.11; the
    ``__notes__`` list before, which the exceptiongroup backport prints). A note survives
    the pickling of ``e`` back from a worker process."""
    if note in getattr(e, "__notes__", ()):
        return
    add = getattr(e, "add_note", None)
    if add is not None:
        add(note)
    else:
        setattr(e, "__notes__", [*getattr(e, "__notes__", ()), note])  # noqa: B010 (3.10 stubs)
