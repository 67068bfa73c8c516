"""A Graph used as if it were an nn.Module: calling, module methods and iterating each
raise an error naming the fix (st.module(g), st.parameters(g))."""

from __future__ import annotations

import pytest

from somatize import Graph, MissingNodeError
from tests.graph_nodes import Add

# The nodes count their calls in CALLS, which their keys cannot (and need not) see.
pytestmark = pytest.mark.filterwarnings("ignore:node class .* reads the global CALLS")


# -- a graph used as if it were an nn.Module ------------------------------------------


def test_calling_a_graph_like_a_module_names_forward_and_module() -> None:
    g = Graph.somatize(Add(1))
    with pytest.raises(TypeError, match=r"g\.forward\(x\).*st\.module\(g\)"):
        g(1)


@pytest.mark.parametrize("name", ["parameters", "state_dict", "to", "train", "eval", "cuda"])
def test_a_module_method_on_a_graph_names_module(name: str) -> None:
    g = Graph.somatize(Add(1))
    with pytest.raises(AttributeError, match=rf"no {name}\(\).*st\.module\(g\)\.{name}"):
        getattr(g, name)
    assert not hasattr(g, name)  # still an AttributeError: hasattr and getattr(..., None) work
    with pytest.raises(AttributeError, match="'Graph' object has no attribute 'nope'$"):
        g.nope  # noqa: B018 — other names keep Python's own message


def test_graph_answers_those_names_without_a_getattr() -> None:
    # a class with __getattr__ gets no specialised attribute reads in CPython: every
    # attribute of every Graph read slower, and building a 1,000-node graph took 15-30% more
    assert not any("__getattr__" in vars(c) for c in Graph.__mro__ if c is not object)


def test_iterating_a_graph_like_a_module_names_parameters() -> None:
    # torch.optim.Adam(g) does list(g), which indexes 0, 1, ... through __getitem__
    g = Graph.somatize(Add(1))
    with pytest.raises(TypeError, match=r"by node id.*st\.parameters\(g\)"):
        list(g)
    with pytest.raises(MissingNodeError, match="no node 'nope'"):
        g["nope"]
