"""Plan: when — ordered steps derived from topology and placement.

``compile`` turns a topology into steps in a topological order, grouped into
stages of independent steps. It *decomposes rather than flattens*: a node that is
itself a graph becomes one step holding its own plan, so the subgraph can be
cached, shipped, rendered and compiled as a unit. ``distribute`` (the seam for
running across hosts) reads the host map and inserts explicit crossing steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .placement import LOCAL, Placement
from .topology import Topology

__all__ = ["Plan", "Step", "compile"]


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
    steps: list[Step] = []
    stages: list[tuple[int, ...]] = []
    for level in topology.levels:
        stage = []
        for node in level:
            sub = topology.subgraphs.get(node)
            stage.append(len(steps))
            steps.append(
                Step(
                    node,
                    topology.predecessors(node),
                    placement.host(node),
                    compile(sub, placements.get(node)) if sub is not None else None,
                )
            )
        stages.append(tuple(stage))
    return Plan(topology, tuple(steps), tuple(stages), topology.sinks, placement)
