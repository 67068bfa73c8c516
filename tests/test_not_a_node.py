"""What somatize says when something else is given where a node or a node id goes
(``somatize/not_a_node.py``): composed with ``>>`` / ``|``, added with ``g.node``, or named
in ``g.edge`` / ``g.freeze`` — each error names the spelling that works."""

from __future__ import annotations

import types
from typing import Any

import pytest

from somatize import Ctx, Done, Graph, MissingNodeError, Node
from somatize.not_a_node import instead, is_torch_module


class Inc(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x + 1)


# A stand-in for torch's nn.Module, known as torch knows it (the engine imports no torch).
Module = type("Module", (), {"__module__": "torch.nn.modules.module"})
Linear = type("Linear", (Module,), {})


class NodeLike:  # a node written without its base class, the way a newcomer might
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x)


def test_an_nn_module_is_known_by_its_class_without_torch() -> None:
    assert is_torch_module(Linear) and not is_torch_module(Inc)


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (Linear(), r"a Linear is an nn\.Module, not a Node: a node holds it, class LinearNode"),
        (Linear, r"Linear is an nn\.Module class; hold an instance in a node"),
        (Inc, r"Inc is a class: give an instance, Inc\(\.\.\.\)"),
        (lambda x: x, r"a function is not a Node: write a class, class Step\(Node\)"),
        ([Inc(), Inc()], r"a fork is written with \|, not a list or tuple: a >> \(b \| c\)"),
        ((Inc(),), r"a fork is written with \|"),
        (
            NodeLike(),
            r"NodeLike has a forward but does not subclass Node: write class NodeLike\(Node\)",
        ),
    ],
)
def test_composing_what_is_not_a_node_names_what_to_write(given: Any, said: str) -> None:
    with pytest.raises(TypeError, match=r"cannot compose a .* with >> or \|; .*" + said):
        Inc() >> given
    with pytest.raises(TypeError, match=said):
        Graph.somatize(given)
    with pytest.raises(TypeError, match=said):
        Graph().node("n", given)


def test_anything_else_keeps_the_plain_refusal() -> None:
    assert instead(3) == "" and instead(types) == ""
    with pytest.raises(TypeError, match=r"cannot compose a int with >> or \|; only Nodes.*bine$"):
        Inc() >> 3  # type: ignore[operator]
    with pytest.raises(TypeError, match=r"node 'n': int is not a Node or Graph; subclass"):
        Graph().node("n", 3)  # type: ignore[arg-type]


def test_g_node_given_an_expression_a_with_id_or_its_arguments_swapped() -> None:
    with pytest.raises(
        TypeError,
        match=r"node 'a': a Seq is an expression .* g\.node\('a', "
        r"Graph\.somatize\(expr\)\)",
    ):
        Graph().node("a", Inc() >> Inc())  # type: ignore[arg-type]
    with pytest.raises(
        TypeError,
        match=r"Inc\(\)\.with_id\(\.\.\.\) names a node inside .* "
        r"g\.node\('a', node\)",
    ):
        Graph().node("a", Inc().with_id("b"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"the id comes first: g\.node\('a', Inc\(\)\)"):
        Graph().node(Inc(), "a")  # type: ignore[arg-type]


def test_a_node_given_for_its_id_is_told_its_id() -> None:
    a, b = Inc(), Inc()
    g = Graph().node("a", a).node("b", b)
    for call in (lambda: g.edge(a, b), lambda: g.freeze(a), lambda: g.cache(b)):  # type: ignore[arg-type]
        with pytest.raises(MissingNodeError, match=r"named by its id, a str: this one is '[ab]'"):
            call()
    assert g.edges() == ()  # (nothing changed)


def test_several_ids_at_once_are_told_to_chain() -> None:
    g = Graph().node("a", Inc()).node("b", Inc())
    with pytest.raises(
        MissingNodeError,
        match=r"one node id \(a str\) at a time.*"
        r"g\.freeze\('a'\)\.freeze\('b'\)",
    ):
        g.freeze(["a", "b"])  # type: ignore[arg-type]
    assert g.memory.frozen == set()
