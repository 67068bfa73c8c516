"""The composition language: >> and |, default and explicit ids."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from somatize import Ctx, Done, DuplicateNodeError, Graph, GraphError, Mapped, Node
from somatize.dsl import build, default_id


class Classify(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x)


class ClassifyHead(Classify):
    pass


class Encode(Classify):
    pass


def test_default_ids_are_snake_case_class_names_made_unique() -> None:
    nodes, edges = build(Encode() >> (Classify() | Classify() | ClassifyHead()))
    assert [n for n, _ in nodes] == ["encode", "classify", "classify_2", "classify_head"]
    assert edges == [("encode", "classify"), ("encode", "classify_2"), ("encode", "classify_head")]
    assert default_id(Classify().mapped()) == "classify"


def test_building_a_graph_leaves_nothing_for_the_cyclic_collector() -> None:
    # before: the walk over the expression was a closure calling itself, a cycle per build
    expr = Encode() >> (Classify() | ClassifyHead()) >> Classify()
    gc.collect()
    gc.disable()
    try:
        build(expr)
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_explicit_ids_win_and_defaults_step_around_them() -> None:
    nodes, _ = build(Classify() >> Classify().with_id("classify") >> Encode().with_id("x"))
    assert [n for n, _ in nodes] == ["classify_2", "classify", "x"]


def test_one_explicit_id_on_two_nodes_is_an_error() -> None:
    with pytest.raises(
        DuplicateNodeError, match=r"id 'x' is given to two different nodes; .*with_id\('x_2'\)"
    ):
        build(Classify().with_id("x") >> Encode().with_id("x"))


def test_one_instance_under_two_ids_is_two_nodes_sharing_it() -> None:
    """A siamese encoder in one line: (Pick(0) >> enc.with_id("l")) | (Pick(1) >> ...)."""
    c, p, q, j = Classify(), Encode(), Encode(), ClassifyHead()
    nodes, edges = build(((p >> c.with_id("l")) | (q >> c.with_id("r"))) >> j)
    assert [n for n, _ in nodes] == ["encode", "l", "encode_2", "r", "classify_head"]
    assert nodes[1][1] is c and nodes[3][1] is c
    head = "classify_head"
    assert edges == [("encode", "l"), ("encode_2", "r"), ("l", head), ("r", head)]
    nodes, edges = build(c.with_id("a") >> c.with_id("b"))  # (one after the other too)
    assert [n for n, _ in nodes] == ["a", "b"] and edges == [("a", "b")]
    # each id written twice is still one node written twice: shared, or refused as before
    nodes, edges = build((c.with_id("l") >> p) | (c.with_id("l") >> q) | c.with_id("r"))
    assert [n for n, _ in nodes] == ["l", "encode", "encode_2", "r"] and len(edges) == 2
    with pytest.raises(GraphError, match=r"'l' is written twice side by side"):
        build(p >> (c.with_id("l") | c.with_id("l")))


def test_an_instance_with_one_id_written_bare_is_that_node_and_with_two_is_refused() -> None:
    c = Classify()
    nodes, edges = build(Encode() >> ((c.with_id("enc") >> ClassifyHead()) | (c >> Encode())))
    assert [n for n, _ in nodes] == ["encode", "enc", "classify_head", "encode_2"]
    assert set(edges) == {("encode", "enc"), ("enc", "classify_head"), ("enc", "encode_2")}
    with pytest.raises(
        DuplicateNodeError, match=r"ids 'l', 'r' .*and once without an id.*with_id\('l'\)"
    ):
        build(c.with_id("l") >> c.with_id("r") >> c)


def test_with_id_then_mapped_is_mapped_then_with_id() -> None:
    class Inc(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done(x + 1)

    for expr in (Inc().with_id("enc").mapped(), Inc().mapped().with_id("enc")):
        nodes, _ = build(Classify() >> expr)
        assert [n for n, _ in nodes] == ["classify", "enc"]
        assert isinstance(nodes[1][1], Mapped) and type(nodes[1][1].inner) is Inc
        assert Graph.somatize(expr).forward([1, 2]) == [2, 3]  # item by item
    inc = Inc()
    ref = inc.with_id("enc").mapped()
    assert ref.impl.inner is inc and ref.id == "enc"  # the very node, mapped


def test_a_second_with_id_renames() -> None:
    c = Classify()
    nodes, edges = build(Encode() >> c.with_id("a").with_id("b"))
    assert [n for n, _ in nodes] == ["encode", "b"] and nodes[1][1] is c
    assert edges == [("encode", "b")]
    assert [n for n, _ in build(c.with_id("a").mapped().with_id("b"))[0]] == ["b"]


def test_mapped_after_with_id_refuses_a_graph_or_a_second_mapping_by_name() -> None:
    with pytest.raises(TypeError, match="node 'g' is a Graph, and only a Node is mapped"):
        Graph.somatize(Classify()).with_id("g").mapped()
    with pytest.raises(
        TypeError, match="node 'e' is mapped already, and mapped\\(\\) applies once"
    ):
        Classify().with_id("e").mapped().mapped()


def test_the_same_instance_written_twice_is_one_node() -> None:
    a, b, c = Encode(), Classify(), Classify()
    nodes, edges = build((a >> b) | (a >> c))
    assert [n for n, _ in nodes] == ["encode", "classify", "classify_2"]
    assert edges == [("encode", "classify"), ("encode", "classify_2")]


def test_fork_and_join_edges_in_written_order() -> None:
    a, b, c, d = Encode(), Classify(), ClassifyHead(), Encode()
    _, edges = build(a >> (b | c) >> d)
    assert edges == [
        ("encode", "classify"),
        ("encode", "classify_head"),
        ("classify", "encode_2"),
        ("classify_head", "encode_2"),
    ]
    _, edges = build(a >> (c | b) >> d)
    assert edges[-2:] == [("classify_head", "encode_2"), ("classify", "encode_2")]


def test_nested_sequences_inside_forks() -> None:
    a, b, c, d, e = (Encode() for _ in range(5))
    _, edges = build(a >> ((b >> c) | d) >> e)
    assert sorted(edges) == [
        ("encode", "encode_2"),
        ("encode", "encode_4"),
        ("encode_2", "encode_3"),
        ("encode_3", "encode_5"),
        ("encode_4", "encode_5"),
    ]
    assert [s for s, t in edges if t == "encode_5"] == ["encode_3", "encode_4"]  # written order


def test_only_nodes_and_graphs_compose() -> None:
    with pytest.raises(TypeError, match="cannot compose a int"):
        Encode() >> 3  # type: ignore[operator]
    with pytest.raises(TypeError, match="cannot compose a str"):
        "x" | Encode()  # type: ignore[operator]
    nodes, edges = build(Encode() >> Graph.somatize(Classify()))
    assert [n for n, _ in nodes] == ["encode", "graph"] and edges == [("encode", "graph")]


def test_expressions_that_share_a_prefix_stay_apart() -> None:
    """``>>`` and ``|`` extend an expression by linking to it, never by changing it."""
    a, b, c, d = Encode(), Classify(), Classify(), ClassifyHead()
    base = a >> b
    left, right = base >> c, base >> d
    assert [n for n, _ in build(left)[0]] == ["encode", "classify", "classify_2"]
    assert build(right)[1] == [("encode", "classify"), ("classify", "classify_head")]
    assert build(base)[1] == [("encode", "classify")]
    fork = b | c
    wider = fork | d
    assert build(a >> fork)[1] == [("encode", "classify"), ("encode", "classify_2")]
    assert len(build(a >> wider)[1]) == 3
    chain: Any = a
    for n in [b, c, d]:
        chain = chain >> n
    assert [type(p.impl) for p in chain.parts] == [Encode, Classify, Classify, ClassifyHead]
    assert [n for n, _ in build(chain)[0]] == ["encode", "classify", "classify_2", "classify_head"]


def test_many_nodes_of_one_class_get_ids_in_order_around_explicit_ones() -> None:
    nodes: list[Any] = [Classify() for _ in range(5)]
    nodes[2] = nodes[2].with_id("classify_3")  # an explicit id the defaults step around
    expr: Any = nodes[0]
    for n in nodes[1:]:
        expr = expr >> n
    ids = [n for n, _ in build(expr)[0]]
    assert ids == ["classify", "classify_2", "classify_3", "classify_4", "classify_5"]


def test_a_subgraph_takes_an_explicit_id_as_a_node_does() -> None:
    block = Graph.somatize(Encode() >> Classify())
    g = Graph.somatize(Encode() >> block.with_id("block") >> Classify())
    assert g.nodes() == ("encode", "block", "classify")
    assert g["block"] is block and g.forward(3) == 3
    with pytest.raises(DuplicateNodeError, match="id 'block' is given to two different nodes"):
        build(Encode().with_id("block") >> block.with_id("block"))


def test_a_node_shared_by_two_branches_after_a_predecessor_is_fed_once() -> None:
    pre, enc, a, b = Encode(), Classify(), ClassifyHead(), ClassifyHead()
    _, edges = build(pre >> ((enc >> a) | (enc >> b)))
    assert sorted(edges) == [
        ("classify", "classify_head"),
        ("classify", "classify_head_2"),
        ("encode", "classify"),
    ]
    _, edges = build(pre >> ((enc >> a) | enc) >> b)  # a residual: b gets (a, enc)
    assert sorted(edges) == [
        ("classify", "classify_head"),
        ("classify", "classify_head_2"),
        ("classify_head", "classify_head_2"),
        ("encode", "classify"),
    ]
    assert [s for s, t in edges if t == "classify_head_2"] == ["classify_head", "classify"]


def test_one_instance_side_by_side_or_ending_two_branches_is_an_error_naming_it() -> None:
    n, a, b, d = Classify(), Encode(), Encode(), ClassifyHead()
    for expr in (n | n, a >> (n | n), a >> ((n | n) >> d)):
        with pytest.raises(GraphError, match=r"node 'classify' is written twice side by side"):
            build(expr)
    with pytest.raises(
        GraphError, match=r"node 'classify' ends two branches of a fork.*'classify_head'"
    ) as info:
        build(((a >> n) | (b >> n)) >> d)
    assert "(a siamese encoder), give the instance an id per use, enc.with_id('left')" in str(
        info.value
    )
    assert len(build((a >> n) | (b >> n))[1]) == 2  # a join, written twice: nothing follows


def test_an_end_of_the_expression_that_feeds_a_node_is_refused_not_dropped() -> None:
    """A graph's outputs are its sinks: ``(enc >> a) | enc`` would return only ``a``."""
    enc, a = Encode(), Classify()
    with pytest.raises(GraphError, match=r"node 'encode' ends a branch .* also feeds 'classify'"):
        Graph.somatize((enc >> a) | enc)
    followed = Graph.somatize(((enc >> a) | enc) >> ClassifyHead())  # the join takes both
    assert followed.forward(1) == (1, 1)
    assert Graph.somatize((enc >> a) | (enc >> ClassifyHead())).forward(2) == (2, 2)


def test_a_composition_refuses_with_id_and_mapped_with_the_fix():
    a, b = Classify(), Encode()
    with pytest.raises(TypeError, match=r"Graph.somatize\(a >> b\).with_id\('x'\)"):
        (a >> b).with_id("x")
    with pytest.raises(TypeError, match=r"map each node"):
        (a | b).mapped()
