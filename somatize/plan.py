"""Plan: when — ordered steps derived from topology and placement.

``compile`` turns a topology into steps in a topological order, grouped into
stages of independent steps. It *decomposes rather than flattens*: a node that is
itself a graph becomes one step holding its own plan, so the subgraph can be
cached, shipped, rendered and compiled as a unit.

``distribute`` reads the host map: consecutive steps on one host form a ``Slice``
(what a Transport carries), and a value moving between hosts becomes an explicit
``Crossing``. A device never changes the plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .errors import GraphError
from .placement import LOCAL, Placement
from .topology import Topology

__all__ = ["Crossing", "DistributedPlan", "Plan", "Slice", "Step", "compile", "distribute"]


@dataclass(frozen=True)
class Step:
    """Run one node.

    Attributes:
        node: the node id.
        inputs: ids of the nodes whose values it receives, in order; () for a root.
        host: where it runs (from the placement).
        plan: for a node that is a graph, its own plan.
    """

    node: str
    inputs: tuple[str, ...]
    host: str = LOCAL
    plan: Plan | None = None


@dataclass(frozen=True)
class Plan:
    """Ordered steps, stages of independent steps, and the nodes whose values are the output."""

    topology: Topology
    steps: tuple[Step, ...]
    stages: tuple[tuple[int, ...], ...]
    output: tuple[str, ...]
    placement: Placement = field(default_factory=Placement)

    def step(self, node: str) -> Step:
        for s in self.steps:
            if s.node == node:
                return s
        raise KeyError(node)

    def __len__(self) -> int:
        return len(self.steps)


def compile(
    topology: Topology,
    placement: Placement | None = None,
    placements: Mapping[str, Placement] | None = None,
) -> Plan:
    """Order a topology into a plan.

    Args:
        topology: what to run.
        placement: hosts and devices of its nodes.
        placements: placements of subgraph nodes' inner nodes, by subgraph id.

    Raises:
        EmptyGraphError: the topology has no nodes. (Cycles are caught by ``Topology``.)

    Example:
        >>> t = Topology(("a", "b", "c"), (("a", "b"), ("a", "c")))
        >>> [s.node for s in compile(t).steps], compile(t).stages
        (['a', 'b', 'c'], ((0,), (1, 2)))
    """
    topology.require_nonempty()
    placement = placement or Placement()
    placements = placements or {}
    subgraphs = topology.subgraphs
    preds = topology._preds
    hosts = placement.hosts
    steps: list[Step] = []
    stages: list[tuple[int, ...]] = []
    for level in topology.levels:
        first = len(steps)
        for node in level:  # (one Step per node: its fields set as the dataclass's __init__ does)
            sub = subgraphs.get(node) if subgraphs else None
            step = _new(Step)
            step.__dict__.update(
                node=node,
                inputs=preds.get(node, ()),
                host=hosts.get(node, LOCAL),
                plan=compile(sub, placements.get(node)) if sub is not None else None,
            )
            steps.append(step)
        stages.append(tuple(range(first, len(steps))))
    return Plan(topology, tuple(steps), tuple(stages), topology.sinks, placement)


_new = object.__new__


@dataclass(frozen=True)
class Crossing:
    """A value moving between hosts, before the slice that reads it.

    Attributes:
        slot: the node whose output moves, or None for the graph's input.
        source: the host that holds the value.
        target: the host that reads it.
    """

    slot: str | None
    source: str
    target: str

    def __str__(self) -> str:
        return f"{self.slot if self.slot is not None else 'input'}: {self.source} -> {self.target}"


@dataclass(frozen=True)
class Slice:
    """Consecutive steps of a plan on one host: what a ``Transport`` carries.

    Attributes:
        host: where the steps run.
        steps: the steps, in plan order.
        inputs: values read from outside the slice, in first-use order: node ids, and
            None for the graph's input.
        outputs: nodes of the slice whose values are read after it: by a later slice,
            or as the graph's output.
    """

    host: str
    steps: tuple[Step, ...]
    inputs: tuple[str | None, ...]
    outputs: tuple[str, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(s.node for s in self.steps)

    def __str__(self) -> str:
        return f"Slice({self.host}: {', '.join(self.nodes)})"


@dataclass(frozen=True)
class DistributedPlan:
    """A plan cut into slices by host, with a crossing wherever a value changes host.

    ``parts`` alternate as the run proceeds: the crossings a slice needs come just
    before it; crossings of the graph's output back to ``LOCAL`` (the caller) come last.
    """

    plan: Plan
    parts: tuple[Slice | Crossing, ...]

    @property
    def slices(self) -> tuple[Slice, ...]:
        return tuple(p for p in self.parts if isinstance(p, Slice))

    @property
    def crossings(self) -> tuple[Crossing, ...]:
        return tuple(p for p in self.parts if isinstance(p, Crossing))

    @property
    def hosts(self) -> tuple[str, ...]:
        """Every host that runs a slice, in order of first use."""
        return tuple(dict.fromkeys(s.host for s in self.slices))


def distribute(plan: Plan, placement: Placement | None = None) -> DistributedPlan:
    """Cut a plan into per-host slices and name every value that changes host.

    Consecutive steps (in plan order) on one host form a slice. A value read on a host
    other than the one that made it becomes a ``Crossing`` before the slice that reads
    it; the graph's input starts on ``LOCAL`` (the caller), and output made elsewhere
    crosses back to it. Only hosts matter: devices never change the plan.

    Args:
        plan: the plan to cut.
        placement: the host map to read (default: the plan's own placement).

    Raises:
        GraphError: a subgraph node has inner nodes on other hosts (a subgraph moves
            as one unit: place the subgraph node itself).

    Example:
        >>> t = Topology(("a", "b", "c"), (("a", "b"), ("b", "c")))
        >>> p = Placement().place("b", host="box")
        >>> for part in distribute(compile(t, p)).parts:
        ...     print(part)
        Slice(local: a)
        a: local -> box
        Slice(box: b)
        b: box -> local
        Slice(local: c)
    """
    placement = placement if placement is not None else plan.placement
    for s in plan.steps:
        if s.plan is not None and s.plan.placement.multi_host:
            placed = [k for k, h in s.plan.placement.hosts.items() if h != LOCAL]
            raise GraphError(
                f"node {s.node!r} is a subgraph with inner nodes placed on other hosts; a "
                f"subgraph moves as one unit — place the subgraph node itself "
                f"(g.place({s.node!r}, host=...)) and put its inner nodes back on 'local' "
                f"(sub.place({placed[0]!r}, host='local'))"
            )
    groups: list[list[Step]] = []
    for s in plan.steps:
        s = replace(s, host=placement.host(s.node))
        if groups and groups[-1][0].host == s.host:
            groups[-1].append(s)
        else:
            groups.append([s])
    home = {s.node: i for i, group in enumerate(groups) for s in group}
    later_readers: dict[str, int] = {}  # node -> index of the last slice reading it
    for s in plan.steps:
        for r in s.inputs:
            later_readers[r] = max(later_readers.get(r, -1), home[s.node])
    parts: list[Slice | Crossing] = []
    for index, group in enumerate(groups):
        host = group[0].host
        inputs: dict[str | None, None] = {}
        for s in group:
            for slot in s.inputs or (None,):
                if slot is None or home[slot] != index:
                    inputs[slot] = None
        for slot in inputs:
            source = LOCAL if slot is None else placement.host(slot)
            if source != host:
                parts.append(Crossing(slot, source, host))
        outputs = tuple(
            s.node for s in group if later_readers.get(s.node, -1) > index or s.node in plan.output
        )
        parts.append(Slice(host, tuple(group), tuple(inputs), outputs))
    for o in plan.output:
        if placement.host(o) != LOCAL:
            parts.append(Crossing(o, placement.host(o), LOCAL))
    return DistributedPlan(plan, tuple(parts))
