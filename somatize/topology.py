"""Topology: what exists — node ids and edges. Pure data.

A ``Topology`` serialises to JSON, compares by value and has a digest. The order
of edges into a node is the order in which that node receives its inputs. A node
that is itself a graph carries its own topology in ``subgraphs``.

Example:
    >>> t = Topology(("a", "b"), (("a", "b"),))
    >>> Topology.from_json(t.to_json()) == t
    True
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .errors import CycleError, DuplicateNodeError, EmptyGraphError, GraphError, MissingNodeError
from .values import digest

__all__ = ["Builder", "Topology", "check_id"]


def check_id(node_id: object) -> None:
    """Raise ``GraphError`` unless ``node_id`` is a string that is not empty or blank."""
    if not isinstance(node_id, str) or not node_id.strip():
        raise GraphError(
            f"node id {node_id!r} is not a non-empty string; give a name such as 'encoder'"
        )


@dataclass(frozen=True)
class Topology:
    """Node ids and edges, validated on construction.

    Attributes:
        nodes: node ids, in the order they were added.
        edges: ``(source, target)`` pairs; their order into a node is its input order.
        subgraphs: for nodes that are graphs, their own topology.

    Raises:
        DuplicateNodeError, MissingNodeError, CycleError, GraphError: each naming the
        offending ids.
    """

    nodes: tuple[str, ...]
    edges: tuple[tuple[str, str], ...] = ()
    subgraphs: Mapping[str, Topology] = field(default_factory=dict)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for n in self.nodes:
            check_id(n)
            if n in seen:
                raise DuplicateNodeError(f"node id {n!r} is used twice; give each node its own id")
            seen.add(n)
        pairs: set[tuple[str, str]] = set()
        for a, b in self.edges:
            for end in (a, b):
                if end not in seen:
                    raise MissingNodeError(
                        f"edge {a!r} -> {b!r} names {end!r}, which is not a node of the graph; "
                        f"add it first (nodes: {', '.join(self.nodes) or 'none'})"
                    )
            if a == b:
                raise CycleError(
                    f"edge {a!r} -> {b!r} connects a node to itself; leave it out (a graph runs "
                    "each node once: to apply one twice, add a second node)"
                )
            if (a, b) in pairs:
                raise GraphError(
                    f"edge {a!r} -> {b!r} is given twice; add it once (a node reads each input "
                    "once, and may use it twice)"
                )
            pairs.add((a, b))
        for n in self.subgraphs:
            if n not in seen:
                raise MissingNodeError(
                    f"subgraph {n!r} is not a node of the graph; subgraphs maps node ids to "
                    f"their topologies (nodes: {', '.join(self.nodes) or 'none'})"
                )
        self.order  # noqa: B018 -- raises CycleError on a cycle

    def predecessors(self, node: str) -> tuple[str, ...]:
        """The nodes feeding ``node``, in input order."""
        return self._preds.get(node, ())

    def successors(self, node: str) -> tuple[str, ...]:
        return self._succs.get(node, ())

    @cached_property
    def _preds(self) -> dict[str, tuple[str, ...]]:
        preds: dict[str, list[str]] = {}
        for a, b in self.edges:
            preds.setdefault(b, []).append(a)
        return {k: tuple(v) for k, v in preds.items()}

    @cached_property
    def _succs(self) -> dict[str, tuple[str, ...]]:
        succs: dict[str, list[str]] = {}
        for a, b in self.edges:
            succs.setdefault(a, []).append(b)
        return {k: tuple(v) for k, v in succs.items()}

    @property
    def roots(self) -> tuple[str, ...]:
        """Nodes with no predecessors: they receive the graph's input."""
        return tuple(n for n in self.nodes if n not in self._preds)

    @cached_property
    def sinks(self) -> tuple[str, ...]:
        """Nodes with no successors: their values are the graph's output."""
        return tuple(n for n in self.nodes if n not in self._succs)

    @cached_property
    def levels(self) -> tuple[tuple[str, ...], ...]:
        """Nodes grouped by depth: each level depends only on earlier levels."""
        depth: dict[str, int] = {}
        indegree = {n: len(self._preds.get(n, ())) for n in self.nodes}
        ready = [n for n in self.nodes if indegree[n] == 0]
        for n in ready:
            depth[n] = 0
        i = 0
        while i < len(ready):
            n = ready[i]
            i += 1
            for s in self._succs.get(n, ()):
                depth[s] = max(depth.get(s, 0), depth[n] + 1)
                indegree[s] -= 1
                if indegree[s] == 0:
                    ready.append(s)
        if len(ready) != len(self.nodes):
            raise CycleError(
                f"the graph has a cycle: {' -> '.join(self._find_cycle())}; remove one of its "
                "edges (a graph runs each node once, in order)"
            )
        groups: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
        for n in self.nodes:
            groups[depth[n]].append(n)
        return tuple(tuple(g) for g in groups)

    @property
    def order(self) -> tuple[str, ...]:
        """A topological order: levels in turn, insertion order within a level."""
        return tuple(n for level in self.levels for n in level)

    def _find_cycle(self) -> list[str]:
        color: dict[str, int] = {}
        stack: list[str] = []

        def visit(n: str) -> list[str] | None:
            color[n] = 1
            stack.append(n)
            for s in self._succs.get(n, ()):
                if color.get(s) == 1:
                    return [*stack[stack.index(s) :], s]
                if s not in color:
                    found = visit(s)
                    if found:
                        return found
            stack.pop()
            color[n] = 2
            return None

        for n in self.nodes:
            if n not in color:
                found = visit(n)
                if found:
                    return found
        return []

    def require_nonempty(self) -> None:
        if not self.nodes:
            raise EmptyGraphError("the graph has no nodes; add one with g.node(id, impl)")

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": list(self.nodes),
            "edges": [list(e) for e in self.edges],
            "subgraphs": {k: v.to_dict() for k, v in sorted(self.subgraphs.items())},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Topology:
        """The topology ``to_dict`` wrote: ``{"nodes": [id, ...], "edges": [[a, b], ...],
        "subgraphs": {id: {...}}}`` (``subgraphs`` may be left out).

        Raises:
            TypeError: ``d`` is not a mapping.
            GraphError: a field is missing or not of that form (naming it).
        """
        if not isinstance(d, Mapping):
            raise TypeError(
                f"Topology.from_dict takes a dict as to_dict writes it, not {d!r}; e.g. "
                "{'nodes': ['a', 'b'], 'edges': [['a', 'b']], 'subgraphs': {}}"
            )
        for name in ("nodes", "edges"):
            if name not in d:
                raise GraphError(
                    f"Topology.from_dict: the dict has no {name!r} (it has "
                    f"{', '.join(map(repr, d)) or 'nothing'}); a topology is {{'nodes': "
                    "['a', 'b'], 'edges': [['a', 'b']], 'subgraphs': {}}, as to_dict writes it"
                )
        nodes, edges, subgraphs = d["nodes"], d["edges"], d.get("subgraphs", {})
        if not isinstance(nodes, (list, tuple)):
            raise GraphError(
                f"Topology.from_dict: 'nodes' is {nodes!r}, not a list of node ids; e.g. "
                "'nodes': ['a', 'b']"
            )
        if not isinstance(edges, (list, tuple)):
            raise GraphError(
                f"Topology.from_dict: 'edges' is {edges!r}, not a list of [source, target] "
                "pairs; e.g. 'edges': [['a', 'b']]"
            )
        for e in edges:
            if not isinstance(e, (list, tuple)) or len(e) != 2:
                raise GraphError(
                    f"Topology.from_dict: edge {e!r} in 'edges' is not a [source, target] "
                    "pair of node ids; e.g. 'edges': [['a', 'b']]"
                )
        if not isinstance(subgraphs, Mapping):
            raise GraphError(
                f"Topology.from_dict: 'subgraphs' is {subgraphs!r}, not a dict of node id "
                "to topology dict; e.g. 'subgraphs': {} for none"
            )
        return cls(
            tuple(nodes),
            tuple((a, b) for a, b in edges),
            {k: cls.from_dict(v) for k, v in subgraphs.items()},
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Topology:
        return cls.from_dict(json.loads(text))

    @cached_property
    def digest(self) -> str:
        """A content key of the topology (nodes, edges in order, nested subgraphs)."""
        return digest(self.to_dict())

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Topology):
            return NotImplemented
        return (
            self.nodes == other.nodes
            and self.edges == other.edges
            and dict(self.subgraphs) == dict(other.subgraphs)
        )


class Builder:
    """A topology under construction, for ``Graph.node`` and ``Graph.edge``.

    Each edge is checked (self-loop, duplicate, cycle) in time proportional to the part
    of the graph it reorders, not to the whole graph: a topological order is kept as
    edges arrive (Pearce and Kelly's incremental algorithm), so an edge that agrees with
    it — every edge of a chain or fork built in written order — costs a comparison.
    Nothing here sorts the whole graph; ``Topology`` does that once, when it is built.
    """

    __slots__ = ("_moved", "_ord", "_pairs", "_preds", "_succs", "edges")

    def __init__(self) -> None:
        self._ord: dict[str, int] = {}  # node -> its position in a topological order
        self._succs: dict[str, list[str]] = {}
        self._preds: dict[str, list[str]] = {}
        self._pairs: set[tuple[str, str]] = set()
        self.edges: list[tuple[str, str]] = []
        self._moved = False  # whether the order ever differed from the order nodes came in

    def topology(self, subgraphs: Mapping[str, Topology] | None = None) -> Topology:
        """The ``Topology`` of what was added (nodes in the order they came), without checking
        again what ``add_node`` and ``add_edge`` checked: one pass over the order kept."""
        nodes = tuple(self._ord)
        preds = {k: tuple(v) for k, v in self._preds.items()}
        order = sorted(nodes, key=self._ord.__getitem__) if self._moved else nodes
        depth: dict[str, int] = {}
        groups: list[list[str]] = []  # the levels, each in the order its nodes came
        for n in order:  # a node's predecessors come before it in the order
            ps = preds.get(n)
            if ps is None:
                d = 0
            elif len(ps) == 1:
                d = depth[ps[0]] + 1
            else:
                d = max([depth[p] for p in ps]) + 1
            depth[n] = d
            if d < len(groups):  # (d is at most one past the deepest level so far)
                groups[d].append(n)
            else:
                groups.append([n])
        if self._moved:  # the order differs from the order nodes came: levels made again
            groups = [[] for _ in groups]
            for n in nodes:
                groups[depth[n]].append(n)
        t: Topology = object.__new__(Topology)  # (a frozen dataclass, built as its __init__ does)
        t.__dict__.update(
            nodes=nodes,
            edges=tuple(self.edges),
            subgraphs=dict(subgraphs or {}),
            _preds=preds,  # (successors are made from the edges if asked for)
            sinks=tuple([n for n in nodes if n not in self._succs]),
            levels=tuple(map(tuple, groups)),
        )
        return t

    def add_node(self, node: str) -> None:
        """Add a node (the caller has checked its id is new)."""
        check_id(node)
        self._ord[node] = len(self._ord)

    def add_edge(self, a: str, b: str) -> None:
        """Add ``a -> b`` between known nodes; raises, changing nothing, if it is invalid."""
        if a == b:
            raise CycleError(
                f"edge {a!r} -> {b!r} connects a node to itself; leave it out (a graph runs "
                "each node once: to apply one twice, add a second node)"
            )
        if (a, b) in self._pairs:
            raise GraphError(
                f"edge {a!r} -> {b!r} is given twice; add it once (a node reads each input "
                "once, and may use it twice)"
            )
        order = self._ord
        if order[b] < order[a]:
            self._reorder(a, b)
        self._pairs.add((a, b))
        self._succs.setdefault(a, []).append(b)
        self._preds.setdefault(b, []).append(a)
        self.edges.append((a, b))

    def _reorder(self, a: str, b: str) -> None:
        """Make room for ``a -> b`` where ``b`` comes first; CycleError if ``b`` reaches ``a``."""
        order = self._ord
        low, high = order[b], order[a]
        ahead: dict[str, str | None] = {b: None}  # reached from b (within the window) -> parent
        todo = [b]
        while todo:
            n = todo.pop()
            for s in self._succs.get(n, ()):
                if s == a:
                    path = [n]
                    while (up := ahead[path[-1]]) is not None:
                        path.append(up)
                    raise CycleError(
                        f"the graph has a cycle: {' -> '.join([a, *reversed(path), a])}; "
                        f"edge {a!r} -> {b!r} closes it: leave it out (a graph runs each "
                        "node once, in order)"
                    )
                if s not in ahead and order[s] < high:
                    ahead[s] = n
                    todo.append(s)
        behind = {a}  # reaching a (within the window)
        todo = [a]
        while todo:
            n = todo.pop()
            for p in self._preds.get(n, ()):
                if p not in behind and order[p] > low:
                    behind.add(p)
                    todo.append(p)
        moved = sorted(behind, key=order.__getitem__) + sorted(ahead, key=order.__getitem__)
        self._moved = True
        slots = sorted(order[n] for n in moved)
        for n, slot in zip(moved, slots):
            order[n] = slot
