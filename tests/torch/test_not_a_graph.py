"""``st.module``, ``st.parameters``, ``st.state`` and ``st.load_state`` given something
other than a Graph (``somatize/torch/not_a_graph.py``): a node or a ``>>`` expression not
built yet, the graph's module itself, a plain ``nn.Module`` — each names the call to write."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Graph

from .tensor_nodes import Linear

CALLS = {
    "st.module": st.module,
    "st.parameters": st.parameters,
    "st.state": st.state,
    "st.load_state": lambda g: st.load_state(g, {}),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_node_or_an_expression_is_told_to_build_the_graph(call: str) -> None:
    for given, kind, what in (
        (Linear(2, 2), "Linear", "a node"),
        (Linear(2, 2) >> Linear(2, 2), "Seq", "an expression of nodes"),
    ):
        with pytest.raises(
            TypeError, match=rf"^{call}\(\) takes a somatize Graph, got {kind}: "
        ) as e:
            CALLS[call](given)
        assert f"{what}" in str(e.value) and f"Graph.somatize(...); {call}(g)" in str(e.value)


def test_the_graphs_module_is_told_to_pass_its_graph() -> None:
    g = Graph.somatize(Linear(2, 2))
    model = st.module(g)
    with pytest.raises(TypeError, match=r"st\.parameters\(model\.graph\) \(model\.parameters"):
        st.parameters(model)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"st\.state\(model\.graph\)"):
        st.state(model)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"a graph's module already: use it as it is"):
        st.module(model)  # type: ignore[arg-type]
    assert st.module(model.graph) is model and len(st.parameters(model.graph)) == 2


def test_a_plain_module_is_told_to_use_it_as_it_is_or_hold_it_in_a_node() -> None:
    with pytest.raises(TypeError, match=r"got Linear: a plain nn\.Module is used as it is") as e:
        st.parameters(nn.Linear(2, 2))  # type: ignore[arg-type]
    assert "class Model(Node)" in str(e.value)
    with pytest.raises(TypeError, match=r"^st\.module\(\) takes a somatize Graph, got int: build"):
        st.module(42)  # type: ignore[arg-type]
    assert torch.is_tensor(st.state(Graph.somatize(Linear(2, 2)))["linear.lin.weight"])
