"""Execution: walking a plan.

Two paths share one contract:

* the **hot path** — every value Opaque or unremembered data, nothing cached, no
  watcher: a plain loop that calls each node, unwraps ``Opaque`` and validates data.
  No hashing, no timing, no allocation beyond the call and its ``Ctx``; it traces
  under ``torch.compile(..., fullgraph=True)`` as one graph.
* the **keyed path** — when a node is cached or named, a watcher listens, or a
  subgraph needs it: keys, keeper reads and writes, events with durations.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import CacheError, DeclarationError, NodeError
from .memory import Memory, NodeKeys, key
from .node import Ctx, Done, Mapped, Run
from .values import Opaque, check, decode, digest, encode
from .watchers import CacheHit, CacheMiss, Metrics, NodeEnd, NodeStart, Watcher, notify

if TYPE_CHECKING:
    from .catalog import Catalog
    from .codecs import Codec
    from .keepers import Keeper
    from .plan import Plan

__all__ = ["Outcome", "Program"]

_INPUT = "the graph input"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one execution produced: the output value (unwrapped), whether it is Opaque,
    its recipe key (None when Opaque), and the metrics nodes returned, by node id."""

    value: Any
    opaque: bool
    key: str | None
    metrics: Mapping[str, Mapping[str, Any]]


def _where(node: str) -> str:
    return f"the output of node {node!r}"


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
        self.fast: list[
            tuple[str, Callable[[Any, Ctx], Any], tuple[str, ...], str | None, str]
        ] = []
        self.wrap = wrap
        for s in plan.steps:
            sub = self.subprograms.get(s.node)
            forward = (
                sub.as_forward() if sub is not None else self._forward(s.node, catalog[s.node])
            )
            self.fast.append((s.node, forward, s.inputs, devices.device(s.node), _where(s.node)))
        self.keyed: bool = bool(memory.cached or memory.named) or any(
            p.keyed for p in self.subprograms.values()
        )
        self._needs_key = self._keyed_ancestry()

    def _forward(self, node: str, impl: Any) -> Callable[[Any, Ctx], Any]:
        forward: Callable[[Any, Ctx], Any] = impl.forward
        return self.wrap(node, impl, forward) if self.wrap is not None else forward

    def _keyed_ancestry(self) -> frozenset[str]:
        """Nodes whose key is needed: remembered nodes and everything upstream of them."""
        need: set[str] = set()
        todo = [n for n in self.plan.topology.nodes if self.memory.remembers(n)]
        todo += [n for n, p in self.subprograms.items() if p.keyed]
        while todo:
            n = todo.pop()
            if n not in need:
                need.add(n)
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
        for node, forward, inputs, device, where in self.fast:
            if not inputs:
                inp = x
            elif len(inputs) == 1:
                inp = values[inputs[0]]
            else:
                inp = tuple([values[i] for i in inputs])
            done = forward(inp, Ctx(node, device, run))
            if type(done) is not Done:
                raise _not_done(node, self.catalog[node], done)
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
    ) -> Outcome:
        """Run with keys, the keeper and watchers.

        Args:
            x_key: the input's content key (None when Opaque or not needed).
            need_key: the caller needs the output's key, so every node is keyed.
            keyless_from: for a subgraph whose input has no key, where that began.
        """
        values: dict[str, Any] = {}
        vkeys: dict[str, str | None] = {}  # recipe keys; they run through Opaque values too
        opaque: set[str] = set()  # nodes whose output is Opaque
        keyless: dict[str, str] = {}  # node -> the Opaque input its missing key traces back to
        metrics: dict[str, Any] = {}
        memory = self.memory
        needs_key = frozenset(self.plan.topology.nodes) if need_key else self._needs_key
        the_input = f"the input of subgraph {prefix[:-1]!r}" if prefix else _INPUT
        for node, forward, inputs, device, _ in self.fast:
            label = prefix + node
            if not inputs:
                inp, in_keys = x, [x_key]
                source = the_input if x_opaque else None
                if x_key is None and (x_opaque or keyless_from is not None):
                    keyless[node] = keyless_from or the_input
            else:
                got = [values[i] for i in inputs]
                inp = got[0] if len(inputs) == 1 else tuple(got)
                in_keys = [vkeys[i] for i in inputs]
                source = next((f"node {prefix + i!r}" for i in inputs if i in opaque), None)
                origin = next((keyless[i] for i in inputs if i in keyless), None)
                if origin is not None:
                    keyless[node] = origin
            impl = self.catalog[node]
            remembered = memory.remembers(node)
            # a cached mapped node is cached item by item, never as a whole list
            per_item = node in memory.cached and isinstance(impl, Mapped)
            if remembered and source is not None:
                raise CacheError(
                    f"node {label!r} is cached but its input from {source} is Opaque; "
                    f"Opaque values cannot enter a key — return data (a detached tensor) from "
                    f"{source}, or stop caching {label!r}"
                )
            node_key = None
            # Keys start from the content of the graph input; below an Opaque input there are none
            # (a cached mapped node still keys each item by its content).
            if node in keyless and remembered and (not per_item or node in memory.named):
                raise CacheError(
                    f"node {label!r} is cached or named but has no key: upstream, "
                    f"{keyless[node]} is Opaque, and keys start from the content of the graph "
                    f"input — pass data (a detached tensor) as the input, or stop caching {label!r}"
                )
            if node in needs_key and node not in keyless:
                try:
                    node_key = keys.of(impl, in_keys)
                except DeclarationError as e:
                    raise DeclarationError(
                        f"node {label!r} needs a key (it is cached or named, or feeds a node "
                        f"that is) but {e}"
                    ) from None
            if node_key is not None and node in memory.cached and not per_item:
                hit = keeper.get(node_key) if keeper is not None else None
                if hit is not None:
                    notify(watchers, CacheHit(run.id, label, node_key))
                    if node in memory.named and keeper is not None:  # the name follows each run
                        keeper.name(memory.named[node], node_key)
                    values[node], vkeys[node] = decode(hit, self.codecs), node_key
                    continue
                notify(watchers, CacheMiss(run.id, label, node_key))

            ctx = Ctx(node, device, run)
            sub = self.subprograms.get(node)
            node_metrics = None
            notify(watchers, NodeStart(run.id, label, run.step))
            start = time.perf_counter()
            try:
                if sub is not None:
                    sub_key = None
                    if node_key is not None:
                        sub_key = in_keys[0] if len(in_keys) == 1 else digest(tuple(in_keys))
                    o = sub.run_keyed(
                        inp,
                        source is not None,
                        sub_key,
                        run,
                        keys,
                        keeper,
                        watchers,
                        label + "/",
                        need_key=node_key is not None,
                        keyless_from=keyless.get(node),
                    )
                    value, is_opaque = o.value, o.opaque
                    metrics.update({f"{node}/{k}": v for k, v in o.metrics.items()})
                elif per_item:
                    value = self._mapped(impl, inp, ctx, label, keys, keeper, watchers)
                    is_opaque = False
                else:
                    done = forward(inp, ctx)
                    if type(done) is not Done:
                        raise _not_done(label, impl, done)
                    value, node_metrics = done
                    is_opaque = type(value) is Opaque
                    if is_opaque:
                        value = value.value
            except Exception as e:
                if hasattr(e, "add_note") and not isinstance(e, (NodeError, CacheError)):
                    e.add_note(f"raised by node {label!r} ({type(impl).__qualname__})")
                raise
            notify(watchers, NodeEnd(run.id, label, run.step, time.perf_counter() - start))

            if is_opaque:
                if remembered:
                    raise CacheError(
                        f"node {label!r} is cached or named but returned Opaque; Opaque values "
                        f"are never stored — return data (a detached tensor) or stop caching {label!r}"
                    )
                opaque.add(node)
            elif remembered and node_key is not None and keeper is not None:
                if not per_item or node in memory.named:  # a name needs the whole list stored
                    data = encode(value, self.codecs, _where(label))
                    keeper.put(node_key, data, pinned=node in memory.pinned)
                if node in memory.named:
                    keeper.name(memory.named[node], node_key)
            elif sub is None:
                check(value, self.codecs, _where(label))
            values[node], vkeys[node] = value, node_key
            if node_metrics:
                metrics[node] = node_metrics
                notify(watchers, Metrics(run.id, label, run.step, node_metrics))
        out = self.output
        if len(out) == 1:
            sink = out[0]
            return Outcome(values[sink], sink in opaque, vkeys[sink], metrics)
        ks = [vkeys[o] for o in out]
        out_key = None if any(k is None for k in ks) else digest(tuple(ks))
        return Outcome(
            tuple(values[o] for o in out), any(o in opaque for o in out), out_key, metrics
        )

    def _mapped(
        self,
        impl: Mapped,
        items: Any,
        ctx: Ctx,
        label: str,
        keys: NodeKeys,
        keeper: Keeper | None,
        watchers: Sequence[Watcher],
    ) -> list[Any]:
        """A cached mapped node: each item keyed by its own content; only misses computed."""
        if type(items) is not list and type(items) is not tuple:
            raise NodeError(
                f"mapped node {label!r} received a {type(items).__name__}; it takes a list"
            )
        out = []
        pinned = ctx.node in self.memory.pinned
        inner = self._forward(ctx.node, impl.inner)
        # The recipe of one item: the inner node on that item's content (not the mapped
        # node's own key, which a list whose item is a whole earlier input would share).
        # The inner node's parts are read once per batch, not once per item.
        parts = keys.parts(impl.inner)
        for i, item in enumerate(items):
            item_key = key(
                *parts, [digest(item, self.codecs, f"item {i} of the input of {label!r}")]
            )
            hit = keeper.get(item_key) if keeper is not None else None
            if hit is not None:
                notify(watchers, CacheHit(ctx.run.id, f"{label}[{i}]", item_key))
                out.append(decode(hit, self.codecs))
                continue
            notify(watchers, CacheMiss(ctx.run.id, f"{label}[{i}]", item_key))
            done = inner(item, ctx)
            if type(done) is not Done:
                raise _not_done(label, impl.inner, done)
            value = done.value
            if type(value) is Opaque:
                raise CacheError(
                    f"cached mapped node {label!r} returned Opaque for item {i}; "
                    "cached items must be data — return data or stop caching it"
                )
            if keeper is not None:
                keeper.put(
                    item_key,
                    encode(value, self.codecs, f"item {i} of {_where(label)}"),
                    pinned=pinned,
                )
            out.append(value)
        return out


def _not_done(node: str, impl: Any, got: Any) -> NodeError:
    return NodeError(
        f"node {node!r} ({type(impl).__qualname__}) returned {type(got).__name__} instead of Done "
        "— end forward with `return Done(value)`"
    )
