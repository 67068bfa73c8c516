"""Execution: walking a plan.

Two paths share one contract:

* the **hot path** — every value Opaque or unremembered data, nothing cached, no
  watcher: a plain loop that calls each node, unwraps ``Opaque`` and validates data.
  No hashing, no timing, no allocation beyond the call and its ``Ctx``; it traces
  under ``torch.compile(..., fullgraph=True)`` as one graph.
* the **keyed path** — when a node is cached or named, a watcher listens, or a
  subgraph needs it: keys, keeper reads and writes, events with durations.

The keyed path's loop is ``keyed.walk``, which also runs the slices of a plan placed on
several hosts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import CacheError
from .keyed import Env, Forward, Walk, _where, keyed_impl, name_node, recipe_key, walk
from .memory import Memory, NodeKeys
from .node import Ctx, Done, Run, not_done
from .values import Opaque, check, digest

if TYPE_CHECKING:
    from .catalog import Catalog
    from .codecs import Codec
    from .keepers import Keeper
    from .plan import Plan
    from .watchers import Watcher

__all__ = ["Outcome", "Program"]

_new_ctx = tuple.__new__


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one execution produced: the output value (unwrapped), whether it is Opaque,
    its recipe key (None when Opaque), and the metrics nodes returned, by node id."""

    value: Any
    opaque: bool
    key: str | None
    metrics: Mapping[str, Mapping[str, Any]]


class Program:
    """A plan bound to its catalog, memory and codecs, ready to run many times.

    Built by ``Graph`` and rebuilt whenever the graph changes.
    """

    def __init__(
        self,
        plan: Plan,
        catalog: Catalog,
        memory: Memory,
        codecs: Sequence[Codec],
        subprograms: Mapping[str, Program],
        wrap: Callable[[str, Any, Callable[[Any, Ctx], Any]], Callable[[Any, Ctx], Any]]
        | None = None,
    ) -> None:
        self.plan = plan
        self.catalog = catalog
        self.memory = memory
        self.codecs = tuple(codecs)
        self.subprograms = dict(subprograms)
        self.output = plan.output
        devices = plan.placement
        # The hot path's steps: (id, forward, inputs, device, where) — built once.
        self.fast: list[tuple[str, Forward, tuple[str, ...], str | None, str]] = []
        self.wrap = wrap
        for s in plan.steps:
            sub = self.subprograms.get(s.node)
            forward = (
                sub.as_forward() if sub is not None else self._forward(s.node, catalog[s.node])
            )
            self.fast.append((s.node, forward, s.inputs, devices.device(s.node), _where(s.node)))
        # The keyed path's: (id, inputs), and the forwards above by id.
        self.steps = [(s.node, s.inputs) for s in plan.steps]
        self._forwards = {node: forward for node, forward, *_ in self.fast}
        self.keyed: bool = bool(memory.cached or memory.named) or any(
            p.keyed for p in self.subprograms.values()
        )
        self._needs_key = self._keyed_ancestry()
        #: whether a run needs the content key of the graph input (a root needs a key)
        self.input_keyed = any(n in self._needs_key for n in plan.topology.roots) or any(
            p.keyed for p in self.subprograms.values()
        )
        for node in memory.per_example:
            impl = catalog[node]
            if node not in memory.frozen and not getattr(impl, "rowwise", False):
                raise CacheError(
                    f"node {node!r} is cached per example but is neither frozen nor row-wise: "
                    "in training mode its rows may interact (batch norm, attention across the "
                    f"batch), so one row's output is not a function of that row — freeze it "
                    f"(g.freeze({node!r})), set `rowwise = True` on {type(impl).__qualname__} if "
                    f"each row is computed alone, or cache it per batch (g.cache({node!r}))"
                )

    def _forward(self, node: str, impl: Any) -> Forward:
        forward: Forward = impl.forward
        return self.wrap(node, impl, forward) if self.wrap is not None else forward

    def _keyed_ancestry(self) -> frozenset[str]:
        """Nodes whose key is needed: remembered nodes and everything upstream of them."""
        need: set[str] = set()
        memory = self.memory
        todo = [n for n in self.plan.topology.nodes if memory.remembers(n)]
        todo += [n for n, p in self.subprograms.items() if p.keyed]
        while todo:
            n = todo.pop()
            if n not in need:
                need.add(n)
                # a node cached per example keys its rows by content, not by its inputs' keys
                if n not in memory.per_example or n in memory.named:
                    todo.extend(self.plan.topology.predecessors(n))
        return frozenset(need)

    def as_forward(self) -> Callable[[Any, Ctx], Done]:
        """This program as a node's forward (for a subgraph on the hot path)."""

        def forward(x: Any, ctx: Ctx) -> Done:
            value, metrics = self.run_fast(x, ctx.run)
            return Done(Opaque(value), metrics or None)

        return forward

    # -- the hot path -----------------------------------------------------------------

    def run_fast(self, x: Any, run: Run) -> tuple[Any, dict[str, Any]]:
        """Run every node in order; returns the (unwrapped) output and node metrics."""
        values: dict[str, Any] = {}
        metrics: dict[str, Any] = {}
        codecs = self.codecs
        ctx = _new_ctx  # Ctx(...) without NamedTuple's Python-level __new__ (half the cost)
        for node, forward, inputs, device, where in self.fast:
            if not inputs:
                inp = x
            elif len(inputs) == 1:
                inp = values[inputs[0]]
            else:
                inp = tuple([values[i] for i in inputs])
            try:  # (free in Python >= 3.11 while nothing raises)
                done = forward(inp, ctx(Ctx, (node, device, run)))
            except Exception as e:
                name_node(e, node, self.catalog[node])
                raise
            if type(done) is not Done:
                raise not_done(node, self.catalog[node], done)
            value = done[0]
            if type(value) is Opaque:
                value = value.value
            else:
                check(value, codecs, where)
            values[node] = value
            if done[1]:
                if node in self.subprograms:  # by inner node: named as on the keyed path
                    metrics.update({f"{node}/{k}": v for k, v in done[1].items()})
                else:
                    metrics[node] = done[1]
        out = self.output
        if len(out) == 1:
            return values[out[0]], metrics
        return tuple([values[o] for o in out]), metrics

    # -- the keyed path ---------------------------------------------------------------

    def forward_of(self, node: str, impl: Any) -> Forward:
        """The forward of ``impl`` at ``node``: the hot path's own when ``impl`` is the node's."""
        return self._forwards[node] if impl is self.catalog[node] else self._forward(node, impl)

    def run_keyed(
        self,
        x: Any,
        x_opaque: bool,
        x_key: str | None,
        run: Run,
        keys: NodeKeys,
        keeper: Keeper | None,
        watchers: Sequence[Watcher],
        prefix: str = "",
        need_key: bool = False,
        keyless_from: str | None = None,
        explained: list[Any] | None = None,
    ) -> Outcome:
        """Run with keys, the keeper and watchers.

        Args:
            x_key: the input's content key (None when Opaque or not needed).
            need_key: the caller needs the output's key, so every node is keyed.
            keyless_from: for a subgraph whose input has no key, where that began.
            explained: collects each remembered node's lookup (``Graph.explain``).
        """
        needs_key = frozenset(self.plan.topology.nodes) if need_key else self._needs_key

        def key(node: str, impl: Any, in_keys: Sequence[str | None]) -> str | None:
            return recipe_key(keys, impl, prefix + node, in_keys) if node in needs_key else None

        env = Env(
            impls=self.catalog,
            forward=self.forward_of,
            subprogram=self.subprograms.get,
            key=key,
            parts=lambda node: keys.parts(keyed_impl(self.catalog[node])),
            memory=self.memory,
            codecs=self.codecs,
            devices=self.plan.placement.devices,
            keeper=keeper,
            node_keys=keys,
            watchers=watchers,
            run=run,
            prefix=prefix,
            explained=explained,
        )
        done = Walk()
        walk(env, self.steps, x, x_opaque, x_key, done, keyless_from)
        return self.outcome(done)

    def outcome(self, done: Walk) -> Outcome:
        """The Outcome of a walk over this program's steps."""
        values, keys, opaque, out = done.values, done.keys, done.opaque, self.output
        if len(out) == 1:
            return Outcome(values[out[0]], out[0] in opaque, keys.get(out[0]), done.metrics)
        ks = [keys.get(o) for o in out]
        out_key = None if any(k is None for k in ks) else digest(tuple(ks))
        return Outcome(
            tuple(values[o] for o in out), any(o in opaque for o in out), out_key, done.metrics
        )
