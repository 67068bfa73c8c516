"""The composition language: >> and |, default and explicit ids."""

from __future__ import annotations

from typing import Any

import pytest

from somatize import Ctx, Done, DuplicateNodeError, Graph, Node
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


def test_explicit_ids_win_and_defaults_step_around_them() -> None:
    nodes, _ = build(Classify() >> Classify().with_id("classify") >> Encode().with_id("x"))
    assert [n for n, _ in nodes] == ["classify_2", "classify", "x"]


def test_one_explicit_id_on_two_nodes_is_an_error() -> None:
    with pytest.raises(DuplicateNodeError, match="id 'x' is given to two different nodes"):
        build(Classify().with_id("x") >> Encode().with_id("x"))
    c = Classify()
    with pytest.raises(DuplicateNodeError, match="two ids, 'a' and 'b'"):
        build(c.with_id("a") >> c.with_id("b"))


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
