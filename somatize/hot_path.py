"""The hot path: every value Opaque or unremembered data, nothing cached, no watcher.

A plain loop that calls each node, unwraps ``Opaque`` and validates data; no hashing, no
timing, no allocation beyond the call and its ``Ctx`` — and no ``Ctx`` either when a run
is like the one before (``bound``). It traces under ``torch.compile(..., fullgraph=True)``
as one graph. ``Program`` (``execute.py``) builds the steps it walks and inherits it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .errors import ValueConversionError
from .keyed import Forward, _where
from .node import Ctx, Done, Run, not_done
from .node_notes import name_node
from .values import Opaque, check

if TYPE_CHECKING:
    from .catalog import Catalog
    from .codecs import Codec
    from .topology import Topology

__all__ = ["Bound", "HotPath", "Slots"]

_new_ctx = tuple.__new__  # Ctx(...) without NamedTuple's Python-level __new__ (half the cost)

#: Several inputs' slots: a slice when they follow one another in order, else a tuple.
Slots = slice | tuple[int, ...]
#: A hot-path step bound to a run: (forward, slot or slice, ctx); its id is ``ctx.node``.
Bound = tuple[Forward, int | slice, Ctx]


def _slots(slots: list[int]) -> Slots:
    first = slots[0]
    if slots == list(range(first, first + len(slots))):
        return slice(first, first + len(slots))
    return tuple(slots)


def _gather(values: list[Any], many: Slots) -> tuple[Any, ...]:
    """The inputs of a step with several, in order: a tuple."""
    if type(many) is slice:
        return tuple(values[many])
    return tuple([values[i] for i in many])


def _joined(forward: Forward, many: Slots, ctx: Ctx) -> Bound:
    """A bound step with several inputs: it reads the values from its first input's slot to
    its last, a slice, as a step with one input reads its slot (no branch per step)."""
    if type(many) is slice:
        return _Joined(forward, None), many, ctx
    first = min(many)
    return _Joined(forward, tuple([i - first for i in many])), slice(first, max(many) + 1), ctx


class _Joined:
    """The forward of a bound step with several inputs, called with a slice of the values:
    the node's forward called with its inputs, a tuple (``picks``: their offsets in the
    slice, or None when the slice is its inputs)."""

    __slots__ = ("forward", "picks")

    def __init__(self, forward: Forward, picks: tuple[int, ...] | None) -> None:
        self.forward, self.picks = forward, picks

    def __call__(self, xs: list[Any], ctx: Ctx) -> Any:
        picks = self.picks
        return self.forward(tuple(xs) if picks is None else tuple([xs[i] for i in picks]), ctx)


class HotPath:
    """The hot path of a ``Program``: ``run_fast``, and the steps ``bound`` to a run."""

    #: (id, forward, one, many, device) per step, in order: see ``Program._bind``
    fast: list[tuple[str, Forward, int, Slots | None, str | None]]
    catalog: Catalog
    topology: Topology
    codecs: tuple[Codec, ...]
    subprograms: Mapping[str, Any]
    _out: tuple[int, ...]
    _kept: tuple[Run, list[Bound] | None] | None = None  # the last run, its steps (bound())

    def bound(self, run: Run) -> list[Bound] | None:
        """The hot path's steps bound to ``run`` — (forward, slot, ctx) — once the runs
        come equal (a model called again at the same step and mode: evaluation, inference,
        a plain PyTorch loop), so a run then makes no ``Ctx``; None while they do not
        (training: each step is another run), and ``run_fast`` makes each as it goes. What
        ``module(g)`` passes to ``run_fast`` outside a trace (a trace must not read or
        write what is kept)."""
        kept = self._kept
        if kept is not None and kept[0].values is run.values and kept[0] == run:
            steps = kept[1]
            if steps is None:  # (the second run alike: bound now, for the runs after it)
                steps = [
                    (forward, one, _new_ctx(Ctx, (node, device, run)))
                    if many is None
                    else _joined(forward, many, _new_ctx(Ctx, (node, device, run)))
                    for node, forward, one, many, device in self.fast
                ]
                self._kept = (run, steps)
            return steps
        self._kept = (run, None)
        return None

    def run_fast(
        self, x: Any, run: Run, bound: list[Bound] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Run every node in order; returns the (unwrapped) output and node metrics.
        ``bound``: the steps bound to ``run`` (``bound(run)``), else each step's ``Ctx`` is
        made as it runs. (Two loops alike but for that: each costs per node.)"""
        values = [x]  # by slot: the input, then each step's output in order
        metrics: dict[str, Any] = {}
        is_type, done_type, opaque_type = type, Done, Opaque  # (locals: read once per node)
        if bound is None:
            new = _new_ctx
            for node, forward, one, many, device in self.fast:
                try:  # (free in Python >= 3.11 while nothing raises)
                    done = forward(
                        values[one] if many is None else _gather(values, many),
                        new(Ctx, (node, device, run)),
                    )
                except Exception as e:
                    name_node(e, node, self.catalog[node], "", self._inputs(node), x, *self._ends())
                    raise
                if (
                    is_type(done) is done_type
                    and is_type(value := done[0]) is opaque_type
                    and done[1] is None
                ):  # (the common case, checked in one line)
                    values.append(value.value)
                else:
                    values.append(self._landed(node, done, metrics))
        else:
            for forward, at, ctx in bound:  # (several inputs: a slice of the values, see _Joined)
                try:
                    done = forward(values[at], ctx)
                except Exception as e:
                    node = ctx.node
                    name_node(e, node, self.catalog[node], "", self._inputs(node), x, *self._ends())
                    raise
                if (
                    is_type(done) is done_type
                    and is_type(value := done[0]) is opaque_type
                    and done[1] is None
                ):
                    values.append(value.value)
                else:
                    values.append(self._landed(ctx.node, done, metrics))
        out = self._out
        if len(out) == 1:
            return values[out[0]], metrics
        return tuple([values[o] for o in out]), metrics

    def _inputs(self, node: str) -> tuple[str, ...]:
        """The ids of ``node``'s inputs, in edge order (for an error's note)."""
        return self.topology.predecessors(node)

    def _ends(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The ids of the graph's roots and sinks (for an error's note)."""
        return self.topology.roots, self.topology.sinks

    def _landed(self, node: str, done: Any, metrics: dict[str, Any]) -> Any:
        """What a step returned, on the hot path, but for an ``Opaque`` without metrics: the
        value it passes on (data checked), its metrics put into ``metrics``; a ``Done`` it is
        not is an error naming the node."""
        if type(done) is not Done:
            raise not_done(node, self.catalog[node], done)
        value, reported = done
        if type(value) is Opaque:
            value = value.value
        else:
            codecs = self.codecs
            try:
                check(value, codecs)
                bad = False
            except ValueConversionError:
                bad = True
            if bad:  # checked again, naming the node: the name is made only when needed
                check(value, codecs, _where(node))
        if reported:
            if node in self.subprograms:  # by inner node: named as on the keyed path
                metrics.update({f"{node}/{k}": v for k, v in reported.items()})
            else:
                metrics[node] = reported
        return value

    def __getstate__(self) -> dict[str, Any]:
        # (the steps kept hold the last run's values, a mapping proxy: never pickled)
        return {**self.__dict__, "_kept": None}
