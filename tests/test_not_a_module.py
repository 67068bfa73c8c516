"""A Node or a ``>>`` expression used as the nn.Module it is not (``somatize/not_a_module.py``;
the Graph's own refusals are in ``test_graph_as_module.py``): calling it, or reaching for a
module method, raises an error naming what to write instead."""

from __future__ import annotations

from typing import Any

import pytest

from somatize import Ctx, Done, Graph, Node


class Scale(Node):
    def __init__(self, by: int) -> None:
        self.by = by

    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x * self.by)


def test_calling_a_node_like_a_module_names_the_graph_and_forward() -> None:
    with pytest.raises(TypeError, match=r"node Scale\(2\) is called like a module") as info:
        Scale(2)(3)
    said = str(info.value)
    assert "st.module(Graph.somatize(node))(x)" in said
    assert "node.forward(x, Ctx('scale'))" in said
    assert Scale(2).forward(3, Ctx("scale")) == Done(6)  # (what it says works)


@pytest.mark.parametrize("name", ["parameters", "to", "train", "eval", "state_dict"])
def test_a_module_method_on_a_node_names_its_modules_and_st_module(name: str) -> None:
    with pytest.raises(AttributeError, match=rf"^'Scale' object has no {name}\(\) — a Node") as e:
        getattr(Scale(2), name)
    assert f"node.lin.{name}(...)" in str(e.value) and f"st.module(g).{name}(...)" in str(e.value)
    assert not hasattr(Scale(2), name)  # still an AttributeError: hasattr works
    with pytest.raises(AttributeError, match="'Scale' object has no attribute 'nope'$"):
        Scale(2).nope  # noqa: B018 — other names keep Python's own message


def test_parameters_on_a_node_also_names_st_parameters() -> None:
    with pytest.raises(AttributeError, match=r"st\.parameters\(g\) for an optimizer"):
        Scale(2).parameters()  # type: ignore[operator]


def test_a_node_may_define_those_names_itself() -> None:
    class Tiny(Node):
        def __init__(self) -> None:
            self.to = "cpu"  # an attribute of its own, under a refused name

        def train(self) -> str:
            return "its own"

        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done(x)

    assert Tiny().to == "cpu" and Tiny().train() == "its own"
    assert Graph.somatize(Tiny()).forward(1) == 1


def test_calling_an_expression_names_graph_somatize() -> None:
    expr = Scale(2) >> Scale(3)
    with pytest.raises(TypeError, match=r"not a graph: build it once, g = Graph\.somatize"):
        expr(1)
    with pytest.raises(AttributeError, match=r"has no forward: build the graph once"):
        expr.forward(1)  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match=r"'Par' object has no parameters\(\).*somatize"):
        (Scale(2) | Scale(3)).parameters()  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match=r"'Ref' object has no to\(\)"):
        Scale(2).with_id("s").to("cuda")  # type: ignore[attr-defined]
    assert Graph.somatize(expr).forward(1) == 6
