"""Topology: ids and edges as validated, serialisable, comparable data."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from somatize import (
    CycleError,
    DuplicateNodeError,
    EmptyGraphError,
    GraphError,
    MissingNodeError,
    Topology,
)
from somatize.topology import Builder


@st.composite
def dags(draw: st.DrawFn) -> Topology:
    """A random DAG: edges only go from a lower rank to a higher one; ids added in any order."""
    n = draw(st.integers(1, 12))
    ranked = [f"n{i}" for i in range(n)]
    edges = [
        (ranked[i], ranked[j]) for i in range(n) for j in range(i + 1, n) if draw(st.booleans())
    ]
    order = draw(st.permutations(ranked))
    edges = draw(st.permutations(edges))
    return Topology(tuple(order), tuple(edges))


def test_json_round_trip_is_equal_with_subgraphs() -> None:
    inner = Topology(("x", "y"), (("x", "y"),))
    t = Topology(("a", "sub", "b"), (("a", "sub"), ("sub", "b"), ("a", "b")), {"sub": inner})
    back = Topology.from_json(t.to_json())
    assert back == t
    assert back.digest == t.digest
    assert hash(back) == hash(t)
    assert json.loads(t.to_json())["subgraphs"]["sub"]["edges"] == [["x", "y"]]


@settings(max_examples=200)
@given(dags())
def test_json_round_trip_of_random_dags(t: Topology) -> None:
    back = Topology.from_json(t.to_json())
    assert back == t and back.digest == t.digest
    assert back.order == t.order


def test_digest_is_stable_and_sensitive() -> None:
    t = Topology(("a", "b", "c"), (("a", "c"), ("b", "c")))
    assert t.digest == Topology(("a", "b", "c"), (("a", "c"), ("b", "c"))).digest
    # pinned: a changed digest means every serialised topology changed meaning
    assert t.digest == "cab31e70472d3ab3af7dd11e8f83f4e191389817cb08d4c18750f68eff3fa708"
    assert t.digest != Topology(("a", "b", "c"), (("b", "c"), ("a", "c"))).digest  # input order
    assert t.digest != Topology(("b", "a", "c"), (("a", "c"), ("b", "c"))).digest
    assert t != Topology(("a", "b", "c"), (("b", "c"), ("a", "c")))


def test_predecessors_keep_edge_order_roots_and_sinks() -> None:
    t = Topology(("a", "b", "c", "d"), (("b", "d"), ("a", "d"), ("a", "c")))
    assert t.predecessors("d") == ("b", "a")
    assert t.successors("a") == ("d", "c")
    assert t.roots == ("a", "b")
    assert t.sinks == ("c", "d")
    assert t.levels == (("a", "b"), ("c", "d"))


def test_a_cycle_is_named() -> None:
    with pytest.raises(
        CycleError, match=r"cycle: (a -> b -> c -> a|b -> c -> a -> b|c -> a -> b -> c)"
    ):
        Topology(("a", "b", "c", "d"), (("d", "a"), ("a", "b"), ("b", "c"), ("c", "a")))
    with pytest.raises(CycleError, match="'a' -> 'a' connects a node to itself; leave it out"):
        Topology(("a",), (("a", "a"),))
    with pytest.raises(CycleError, match="cycle: a -> b -> a; remove one of its edges"):
        Topology(("a", "b"), (("a", "b"), ("b", "a")))


def test_duplicate_ids_missing_nodes_bad_ids_and_empty() -> None:
    with pytest.raises(DuplicateNodeError, match="'a' is used twice"):
        Topology(("a", "b", "a"))
    with pytest.raises(MissingNodeError, match=r"'a' -> 'z' names 'z', which is not a node"):
        Topology(("a",), (("a", "z"),))
    with pytest.raises(MissingNodeError, match=r"subgraph 'q' is not a node .*\(nodes: a\)"):
        Topology(("a",), (), {"q": Topology(("x",))})
    with pytest.raises(GraphError, match="given twice; add it once"):
        Topology(("a", "b"), (("a", "b"), ("a", "b")))
    with pytest.raises(GraphError, match="non-empty string"):
        Topology(("",))
    with pytest.raises(EmptyGraphError, match=r"g\.node"):
        Topology(()).require_nonempty()
    err = MissingNodeError("no node 'z'")
    assert isinstance(err, KeyError) and str(err) == "no node 'z'"  # not quoted like KeyError


@settings(max_examples=300)
@given(dags(), st.randoms())
def test_adding_a_back_edge_always_raises_a_cycle_naming_it(
    t: Topology, rnd: random.Random
) -> None:
    order = t.order
    if len(order) < 2 or not t.edges:
        return
    a, b = rnd.choice(t.edges)  # a before b; b -> ... -> a closes a cycle through a -> b
    with pytest.raises(CycleError) as info:
        Topology(t.nodes, (*t.edges, (b, a)))
    named = str(info.value).split(": ", 1)[1].split(";")[0].split(" -> ")  # (then the fix)
    assert named[0] == named[-1]
    for x, y in itertools.pairwise(named):
        assert (x, y) in {*t.edges, (b, a)}


@settings(max_examples=200)
@given(st.integers(2, 9), st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8)), max_size=30))
def test_the_incremental_builder_accepts_exactly_what_topology_accepts(
    n: int, tries: list[tuple[int, int]]
) -> None:
    """Edge by edge, in any order: the builder (what Graph.edge uses) keeps an edge exactly
    when the whole Topology with it is valid, and raises the same error class otherwise."""
    nodes = tuple(f"n{i}" for i in range(n))
    b = Builder()
    for node in nodes:
        b.add_node(node)
    kept: list[tuple[str, str]] = []
    for i, j in tries:
        e = (f"n{i % n}", f"n{j % n}")
        try:
            Topology(nodes, (*kept, e))
            expected: type[Exception] | None = None
        except GraphError as err:
            expected = type(err)
        try:
            b.add_edge(*e)
            got: type[Exception] | None = None
        except GraphError as err:
            got = type(err)
            if "has a cycle" in str(err):  # the cycle named is one that the edge closes
                named = str(err).split(": ", 1)[1].split(";")[0].split(" -> ")
                assert named[0] == named[-1] == e[0] and named[1] == e[1]
                assert all(p in {*kept, e} for p in itertools.pairwise(named))
        assert got == expected
        if got is None:
            kept.append(e)
        assert b.edges == kept
        # the kept order is a topological order of what was kept
        position = b._ord
        assert all(position[x] < position[y] for x, y in kept)


@settings(max_examples=200)
@given(dags(), st.randoms())
def test_the_builders_topology_equals_the_checked_one(t: Topology, rnd: random.Random) -> None:
    """``Builder.topology()`` (what a Graph compiles, unchecked) has the same nodes, edges,
    levels, order, inputs, roots, sinks and digest as ``Topology(...)``, built from scratch
    and checked — edges added in any order, so the kept order moves (``_moved``) or not."""
    b = Builder()
    for node in t.nodes:
        b.add_node(node)
    for a, z in t.edges:
        b.add_edge(a, z)
    sub = Topology(("x",))
    subs = {t.nodes[0]: sub} if rnd.random() < 0.5 else {}
    checked = Topology(t.nodes, t.edges, subs)
    fast = b.topology(subs)
    assert fast == checked and fast.digest == checked.digest
    assert fast.levels == checked.levels and fast.order == checked.order
    assert fast.roots == checked.roots and fast.sinks == checked.sinks
    for n in t.nodes:
        assert fast.predecessors(n) == checked.predecessors(n)
        assert fast.successors(n) == checked.successors(n)
    assert dict(fast.subgraphs) == subs and fast.subgraphs is not subs
