"""Graph building: the builder and the DSL, their errors leaving the graph unchanged, a
long chain built without sorting, and a graph that would contain itself."""

from __future__ import annotations

from typing import Any

import pytest

from somatize import CycleError, DuplicateNodeError, Graph, GraphError, MissingNodeError, Topology
from somatize.topology import Builder
from tests.graph_nodes import Add

# The nodes count their calls in CALLS, which their keys cannot (and need not) see.
pytestmark = pytest.mark.filterwarnings("ignore:node class .* reads the global CALLS")


# -- building -----------------------------------------------------------------------------


def test_nodes_given_as_to_nn_sequential_are_told_the_spelling_that_works() -> None:
    said = r"^Graph\(\) takes no nodes, got 1: .*Graph\.somatize\(a >> b\)"
    with pytest.raises(TypeError, match=said):
        Graph(Add(1) >> Add(2))  # type: ignore[arg-type]
    said = r"^Graph\.somatize takes one expression, got 2 arguments: join the nodes with >> "
    with pytest.raises(TypeError, match=said + r".*Graph\.somatize\(a >> b\)"):
        Graph.somatize(Add(1), Add(2))  # type: ignore[arg-type]
    assert Graph.somatize(Add(1) >> Add(2), watchers=[]).forward(0) == 3  # (keywords still go)


def test_explicit_builder_and_introspection() -> None:
    g = Graph()
    g.node("a", Add(1)).node("b", Add(2)).edge("a", "b")
    assert g.nodes() == ("a", "b") and g.edges() == (("a", "b"),)
    assert len(g) == 2 and "a" in g and "z" not in g
    assert isinstance(g["a"], Add)
    assert repr(g) == "Graph(2 nodes, 1 edges)"
    assert g.forward(0) == 3
    assert g.catalog["b"] is g["b"]


def test_builder_errors_leave_the_graph_unchanged() -> None:
    g = Graph().node("a", Add(1)).node("b", Add(2)).edge("a", "b")
    before = (g.nodes(), g.edges(), g.topology.digest)
    with pytest.raises(DuplicateNodeError, match="'a' is already in the graph"):
        g.node("a", Add(3))
    with pytest.raises(MissingNodeError, match="no node 'z' in the graph; nodes: a, b"):
        g.edge("a", "z")
    with pytest.raises(
        CycleError, match=r"cycle: (b -> a -> b|a -> b -> a); edge 'b' -> 'a' closes it: leave"
    ):
        g.edge("b", "a")
    with pytest.raises(GraphError, match="given twice"):
        g.edge("a", "b")
    with pytest.raises(CycleError, match="connects a node to itself"):
        g.edge("a", "a")
    with pytest.raises(GraphError, match="non-empty string"):
        g.node("", Add(1))
    for host in ("", 3):
        with pytest.raises(GraphError, match=rf"g\.place\('a', host={host!r}\): a host is a non-"):
            g.place("a", host=host)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="int is not a Node or Graph"):
        g.node("c", 3)  # type: ignore[arg-type]
    with pytest.raises(MissingNodeError, match="no node 'q'"):
        g.cache("q")
    assert (g.nodes(), g.edges(), g.topology.digest) == before
    assert g.forward(0) == 3


def test_building_a_long_chain_never_sorts_the_topology_until_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each edge is checked incrementally: 1,000 edges, built forwards, backwards and by the
    DSL, make no Topology and sort nothing; running makes one from the kept order, once,
    without checking again (no ``Topology.__post_init__``)."""
    built: list[int] = []
    checked: list[int] = []
    real, real_check = Builder.topology, Topology.__post_init__
    monkeypatch.setattr(Builder, "topology", lambda b, s=None: (built.append(1), real(b, s))[1])
    monkeypatch.setattr(Topology, "__post_init__", lambda t: (checked.append(1), real_check(t))[1])
    n = 1_000
    forwards = Graph()
    for i in range(n):
        forwards.node(f"n{i}", Add(1))
    for i in range(n - 1):
        forwards.edge(f"n{i}", f"n{i + 1}")
    backwards = Graph()  # each edge goes against insertion order: the kept order must move
    for i in range(n):
        backwards.node(f"n{i}", Add(1))
    for i in reversed(range(n - 1)):
        backwards.edge(f"n{i + 1}", f"n{i}")
    expr: Any = Add(1)
    for _ in range(n - 1):
        expr = expr >> Add(1)
    dsl = Graph.somatize(expr)
    assert built == []
    assert forwards.forward(0) == n and backwards.forward(0) == n and dsl.forward(0) == n
    assert len(built) == 3 and checked == []  # one Topology (one pass) per graph
    with pytest.raises(CycleError, match=r"cycle: n0 -> n999 -> n998 .* -> n1 -> n0"):
        backwards.edge("n0", "n999")
    assert len(dsl.nodes()) == n and dsl.nodes()[-1] == f"add_{n}"


def test_a_graph_cannot_contain_itself() -> None:
    g = Graph().node("a", Add(1))
    with pytest.raises(GraphError, match="cannot contain itself"):
        g.node("self", g)
    outer = Graph().node("g", g)
    with pytest.raises(GraphError, match="cannot contain itself"):
        g.node("outer", outer)
    assert g.nodes() == ("a",)
