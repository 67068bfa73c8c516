"""Execution: walking a plan.

Two paths share one contract:

* the **hot path** — every value Opaque or unremembered data, nothing cached, no
  watcher: a plain loop that calls each node, unwraps ``Opaque`` and validates data.
  No hashing, no timing, no allocation beyond the call and its ``Ctx``; it traces
  under ``torch.compile(..., fullgraph=True)`` as one graph (``hot_path.py``).
* the **keyed path** — when a node is cached or named, a watcher listens, or a
  subgraph needs it: keys, keeper reads and writes, events with durations.

The keyed path's loop is ``keyed.walk``, which also runs the slices of a plan placed on
several hosts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from types import MethodType
from typing import TYPE_CHECKING, Any

from .catalog import Catalog
from .errors import CacheError
from .hot_path import HotPath, Slots, _slots
from .keyed import Env, Forward, Walk, keyed_impl, recipe_key, walk
from .memory import Memory, NodeKeys
from .node import Ctx, Done, Run
from .pick import Pick
from .plan import compile
from .values import Opaque, digest

if TYPE_CHECKING:
    from .codecs import Codec
    from .keepers import Keeper
    from .placement import Placement
    from .plan import Plan
    from .topology import Topology
    from .watchers import Watcher

__all__ = ["Outcome", "Program"]


def _none(node: str) -> None:  # the device of every node, when the graph places none
    return None


#: A runtime's hook: ``(node_id, impl, forward) -> forward`` (``Graph.use(wrap=...)``).
Wrap = Callable[[str, Any, Callable[[Any, Ctx], Any]], Callable[[Any, Ctx], Any]]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one execution produced: the output value (unwrapped), whether it is Opaque,
    its recipe key (None when Opaque), and the metrics nodes returned, by node id."""

    value: Any
    opaque: bool
    key: str | None
    metrics: Mapping[str, Mapping[str, Any]]


class Program(HotPath):
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
        wrap: Wrap | None = None,
    ) -> None:
        self._plan: Plan | None = plan
        self._plan_of: tuple[Topology, Placement, Mapping[str, Placement]] | None = None
        steps = ((s.node, s.inputs) for s in plan.steps)
        self._bind(plan.topology, plan.placement, steps, catalog, memory, codecs, subprograms, wrap)

    @classmethod
    def compiled(
        cls,
        topology: Topology,
        placement: Placement,
        placements: Mapping[str, Placement],
        catalog: Catalog,
        memory: Memory,
        codecs: Sequence[Codec],
        subprograms: Mapping[str, Program],
        wrap: Wrap | None = None,
    ) -> Program:
        """The program of ``compile(topology, placement, placements)``, whose ``Plan`` is made
        when first asked for: the hot path needs only the order of the steps and their inputs
        (what ``Graph`` builds; a plan's ``Step`` objects are for the keyed path across
        hosts, rendering and the user)."""
        topology.require_nonempty()
        program = cls.__new__(cls)
        program._plan = None
        program._plan_of = (topology, placement, placements)
        inputs = topology._preds.get
        steps = ((n, inputs(n, ())) for level in topology.levels for n in level)  # compile's order
        program._bind(topology, placement, steps, catalog, memory, codecs, subprograms, wrap)
        return program

    @property
    def plan(self) -> Plan:
        """The plan this program runs."""
        if self._plan is None:
            assert self._plan_of is not None  # (one of the two is always set)
            self._plan = compile(*self._plan_of)
        return self._plan

    def _bind(
        self,
        topology: Topology,
        placement: Placement,
        steps: Iterable[tuple[str, tuple[str, ...]]],
        catalog: Catalog,
        memory: Memory,
        codecs: Sequence[Codec],
        subprograms: Mapping[str, Program],
        wrap: Wrap | None,
    ) -> None:
        self.topology = topology
        self.placement = placement
        self.catalog = catalog
        self.memory = memory
        self.codecs = tuple(codecs)
        self.subprograms = dict(subprograms)
        self.output = topology.sinks
        devices = placement.devices
        self.wrap = wrap
        impls = catalog._impls if type(catalog) is Catalog else dict(catalog)
        subs = self.subprograms
        # The hot path's steps, built once: (id, forward, one, many, device). A run keeps
        # values in a list, the graph input at 0 and step i's output at i + 1: a step reads
        # slot ``one``, or, with several inputs, the slots ``many`` (else None): a slice when
        # they follow one another in order (a fork's branches joined), else a tuple.
        self.fast: list[tuple[str, Forward, int, Slots | None, str | None]] = []
        fast = self.fast.append
        device = devices.get if devices else _none
        slot: dict[str, int] = {}
        self._bound: dict[str, Any] = {}  # node -> its impl.forward when bound (forward_of)
        for node, inputs in steps:
            sub = subs.get(node) if subs else None
            if sub is not None:  # a subgraph is a node to the runtime too (frozen: eval mode)
                forward = sub.as_forward()
                if wrap is not None:
                    forward = wrap(node, impls[node], forward)
            elif wrap is None:
                forward = self._bound[node] = impls[node].forward
            else:
                impl = impls[node]
                self._bound[node] = own = impl.forward
                forward = wrap(node, impl, own)
            if len(inputs) == 1:
                fast((node, forward, slot[inputs[0]], None, device(node)))
            elif inputs:
                fast((node, forward, 0, _slots([slot[i] for i in inputs]), device(node)))
            else:
                fast((node, forward, 0, None, device(node)))
            slot[node] = len(slot) + 1
        self._out = tuple([slot[o] for o in self.output])
        self.keyed: bool = bool(memory.cached or memory.named) or any(
            p.keyed for p in self.subprograms.values()
        )
        self._needs_key = self._keyed_ancestry()
        self.watched = self._keying()
        # Picks are keyed by what they pick (keyed.py): the Picks whose key is needed, all
        self._all_picks = frozenset(n for n in topology.nodes if type(catalog[n]) is Pick)
        self._picks = self._all_picks & self._needs_key
        #: whether a run needs the content key of the graph input: a root whose key is
        #: needed, but not one cached per example only (it keys its rows by their content),
        #: nor a Pick (what it picks is hashed, not the images beside the texts it picks)
        self.input_keyed = bool(self._needs_key) and (
            any(
                n in self._needs_key
                and (n not in memory.per_example or n in memory.named)
                and (n not in self._picks or memory.remembers(n))
                for n in topology.roots
            )
            or any(p.keyed for p in self.subprograms.values())
        )
        for node in memory.per_example:
            impl = catalog[node]
            if node not in memory.frozen and not getattr(impl, "rowwise", False):
                raise CacheError(
                    f"node {node!r} is cached per example but is neither frozen nor row-wise: "
                    "in training mode its rows may interact (batch norm, attention across the "
                    f"batch), so one row's output is not a function of that row — freeze it "
                    f"(g.freeze({node!r})), set `rowwise = True` on {type(impl).__qualname__} if "
                    f"each row is computed alone, or cache it per batch (g.cache({node!r})). "
                    f"To train it (fine-tuning after a frozen probe), stop caching it, "
                    f"g.cache({node!r}, False): its weights change at every step, so nothing "
                    "it computes repeats"
                )

    @cached_property
    def steps(self) -> list[tuple[str, tuple[str, ...]]]:
        """The keyed path's steps: (id, inputs), in plan order."""
        names = ["", *(step[0] for step in self.fast)]  # slot -> node id
        return [
            (node, (names[one],) if one else ())
            if many is None
            else (node, tuple(names[many] if type(many) is slice else [names[i] for i in many]))
            for node, _, one, many, *_ in self.fast
        ]

    @cached_property
    def _forwards(self) -> dict[str, Forward]:
        """The hot path's forwards, by node id."""
        return {node: forward for node, forward, *_ in self.fast}

    @cached_property
    def _prepares(self) -> dict[str, Callable[[], None]]:
        """The ``prepare()`` of each wrapped forward that has one (in the wrap, or in one it
        wraps): called before the node's key is read, so the key holds what the forward
        will run with (a frozen node's modules put in eval mode first)."""
        found = {}
        for node, forward in self._forwards.items():
            f: Any = forward
            for _ in range(4):  # (wraps of wraps: a cached frozen node's is two deep)
                prepare = getattr(type(f), "prepare", None)
                if prepare is not None:
                    found[node] = f.prepare
                    break
                if "forward" not in getattr(type(f), "__slots__", ()):
                    break  # (a node's own forward: nothing more inside)
                f = f.forward
        return found

    def _forward(self, node: str, impl: Any) -> Forward:
        forward: Forward = impl.forward
        return self.wrap(node, impl, forward) if self.wrap is not None else forward

    def _keyed_ancestry(self) -> frozenset[str]:
        """Nodes whose key is needed: remembered nodes and everything upstream of them."""
        need: set[str] = set()
        memory = self.memory
        remembered = (*memory.cached, *memory.named)
        nodes = set(self.topology.nodes) if remembered else ()
        todo = [n for n in remembered if n in nodes]
        todo += [n for n, p in self.subprograms.items() if p.keyed]
        while todo:
            n = todo.pop()
            if n not in need:
                need.add(n)
                # a node cached per example keys its rows by content, not by its inputs' keys
                if n not in memory.per_example or n in memory.named:
                    todo.extend(self.topology.predecessors(n))
        return frozenset(need)

    def _keying(self) -> frozenset[str]:
        """Nodes whose key feeds a remembered node's key, or is a named node's own, and that
        are not cached themselves: the keyed walk runs them through the runtime's ``draws``,
        and keys one that drew by its output (``drawn.py``). Not a node before one cached
        per example only (its rows are keyed by their content), nor any without caching."""
        memory, need = self.memory, self._needs_key
        keying = {n for n in memory.named if n in need}
        for n in need:
            if n not in memory.per_example or n in memory.named:  # keyed by its inputs' keys
                keying.update(self.topology.predecessors(n))
        return frozenset(keying - memory.cached)

    def as_forward(self) -> Callable[[Any, Ctx], Done]:
        """This program as a node's forward (for a subgraph on the hot path)."""
        return _SubgraphForward(self)

    # -- the keyed path ---------------------------------------------------------------

    def forward_of(self, node: str, impl: Any) -> Forward:
        """The forward of ``impl`` at ``node``: the hot path's own when ``impl`` is the node's
        and its ``forward`` is the one bound when the program was built. One replaced since
        — on the instance (``node.forward = f``), on its class (``Enc.forward = f``), or by
        ``node.__class__ = Other`` — is bound anew, here and for the keyed runs after: the
        keyed path runs the forward that the node's key describes."""
        if impl is not self.catalog[node]:
            return self._forward(node, impl)
        bound = self._bound.get(node)
        if bound is not None and not _same_forward(bound, now := impl.forward):
            self._bound[node] = now
            self._forwards[node] = self._forward(node, impl)
        return self._forwards[node]

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
        needs_key = frozenset(self.topology.nodes) if need_key else self._needs_key

        prepares = self._prepares

        def key(node: str, impl: Any, in_keys: Sequence[str | None]) -> str | None:
            if node not in needs_key:
                return None
            prepare = prepares.get(node)
            if prepare is not None:
                prepare()
            return recipe_key(keys, impl, prefix + node, in_keys)

        def parts(node: str) -> tuple[str, str, str]:
            prepare = prepares.get(node)
            if prepare is not None:
                prepare()
            return keys.parts(keyed_impl(self.catalog[node]))

        env = Env(
            impls=self.catalog,
            forward=self.forward_of,
            subprogram=self.subprograms.get,
            key=key,
            parts=parts,
            memory=self.memory,
            codecs=self.codecs,
            devices=self.placement.devices,
            keeper=keeper,
            node_keys=keys,
            watchers=watchers,
            run=run,
            prefix=prefix,
            explained=explained,
            wrap=self.wrap,
            draws=getattr(self.wrap, "draws", None),
            watched=self.watched,
            picks=self._picks if not need_key else self._all_picks,
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


def _same_forward(a: Any, b: Any) -> bool:
    """Whether two reads of a node's ``forward`` are the same: the same object, or methods
    of the same function bound to the same node (each read makes a new bound method)."""
    return a is b or (
        type(a) is MethodType
        and type(b) is MethodType
        and a.__func__ is b.__func__
        and a.__self__ is b.__self__
    )


class _SubgraphForward:
    """A subgraph's program as a node's forward: a class, not a closure, so that a module
    holding the program stays picklable (``torch.save(model)``)."""

    __slots__ = ("program",)

    def __init__(self, program: Program) -> None:
        self.program = program

    def __call__(self, x: Any, ctx: Ctx) -> Done:
        value, metrics = self.program.run_fast(x, ctx.run)
        return Done(Opaque(value), metrics or None)
