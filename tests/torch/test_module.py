"""``module(g)``: registration of the nodes' modules (in attributes, lists, dicts, subgraphs,
mapped and held nodes), names that cannot be module names, and one module per graph."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import NodeError, StateError

from .tensor_nodes import Linear


class Holder(Node):
    """Modules in every place a node may keep them."""

    def __init__(self) -> None:
        self.lin = nn.Linear(2, 2)
        self.scale = nn.Parameter(torch.ones(2))
        self.offset = torch.zeros(2)  # a plain tensor: a buffer
        self.blocks = [nn.Linear(2, 2), nn.Linear(2, 2)]
        self.heads = {"fr": nn.Linear(2, 1), "en": nn.Linear(2, 1)}
        self.nested = {"deep": [nn.Linear(2, 2)]}
        self.note = "not a module"

    def forward(self, x, ctx):
        h = self.lin(x) * self.scale + self.offset
        for b in self.blocks:
            h = b(h)
        h = self.nested["deep"][0](h)
        return Done(Opaque(self.heads["fr"](h) + self.heads["en"](h)))


HOLDER_KEYS = [
    "holder.blocks.0.bias",
    "holder.blocks.0.weight",
    "holder.blocks.1.bias",
    "holder.blocks.1.weight",
    "holder.heads.en.bias",
    "holder.heads.en.weight",
    "holder.heads.fr.bias",
    "holder.heads.fr.weight",
    "holder.lin.bias",
    "holder.lin.weight",
    "holder.nested.deep.0.bias",
    "holder.nested.deep.0.weight",
    "holder.offset",
    "holder.scale",
]


def test_modules_in_attributes_lists_and_dicts_register_under_the_node_id():
    g = Graph.somatize(Holder())
    assert sorted(st.module(g).state_dict()) == HOLDER_KEYS
    assert sorted(st.module(Graph.somatize(Holder())).state_dict()) == HOLDER_KEYS  # stable
    params = dict(st.module(g).named_parameters())
    assert params["holder.heads.fr.weight"] is g["holder"].heads["fr"].weight
    assert params["holder.scale"] is g["holder"].scale
    assert "holder.offset" not in params  # a buffer, not a parameter


def test_subgraph_modules_register_nested():
    sub = Graph().node("inner", Linear(3, 3))
    g = Graph().node("first", Linear(3, 3)).node("sub", sub).edge("first", "sub")
    m = st.module(g)
    assert sorted(m.state_dict()) == [
        "first.lin.bias",
        "first.lin.weight",
        "sub.inner.lin.bias",
        "sub.inner.lin.weight",
    ]
    assert dict(m.named_parameters())["sub.inner.lin.weight"] is sub["inner"].lin.weight
    m(torch.ones(1, 3)).sum().backward()
    assert sub["inner"].lin.weight.grad is not None


def test_subgraph_written_in_an_expression_registers_under_its_default_id_graph():
    g = Graph.somatize(Linear(2, 2) >> Graph.somatize(Linear(2, 2)) >> Linear(2, 2))
    m = st.module(g)
    assert "graph.linear.lin.weight" in m.state_dict()
    assert m.graph is g  # the attribute stays the graph; the node's modules are a child
    m.train()
    m.step = 4
    assert m.step == 4 and dict(m.named_children())["graph"].training
    st.load_state(g, st.state(g))
    assert m(torch.ones(1, 2)).shape == (1, 2)
    named = Graph.somatize(Linear(2, 2) >> Graph.somatize(Linear(2, 2)).with_id("block"))
    assert sorted(st.module(named).state_dict())[:2] == [
        "block.linear.lin.bias",
        "block.linear.lin.weight",
    ]


def test_mapped_node_registers_its_inner_nodes_modules():
    class Scale(Node):
        def __init__(self) -> None:
            self.lin = nn.Linear(2, 2)

        def forward(self, x, ctx):
            return Done(Opaque(self.lin(x)))

    g = Graph.somatize(Scale().mapped())
    assert sorted(st.module(g).state_dict()) == ["scale.lin.bias", "scale.lin.weight"]
    assert len(st.parameters(g)) == 2


def test_node_held_by_a_node_registers_nested():
    class Outer(Node):
        def __init__(self) -> None:
            self.helper = Linear(2, 2)

        def forward(self, x, ctx):
            return self.helper.forward(x, ctx)

    assert sorted(st.module(Graph.somatize(Outer())).state_dict()) == [
        "outer.helper.lin.bias",
        "outer.helper.lin.weight",
    ]


def test_ids_that_cannot_name_modules_are_refused_only_when_they_hold_modules():
    class Plain(Node):
        def forward(self, x, ctx):
            return Done(x)

    for bad in ("a.b", "forward", "training"):
        g = Graph().node(bad, Linear(2, 2))
        with pytest.raises(StateError, match=rf"node '{bad}' holds modules.*another id"):
            st.module(g)
    # the same ids on a node without modules are fine
    assert st.module(Graph().node("a.b", Plain())).state_dict() == {}


def test_attributes_that_cannot_name_modules_are_refused():
    class Shadow(Node):
        def __init__(self) -> None:
            self.modules = [nn.Linear(2, 2)]  # nn.Module.modules() exists
            self.training = True  # plain data under a module's name: fine

        def forward(self, x, ctx):
            return Done(Opaque(x))

    with pytest.raises(StateError, match=r"node 'shadow'.*attribute 'modules'.*rename"):
        st.module(Graph.somatize(Shadow()))


def test_dict_keys_that_cannot_name_modules_are_refused():
    class Bad(Node):
        def __init__(self) -> None:
            self.heads = {"a.b": nn.Linear(2, 2)}

        def forward(self, x, ctx):
            return Done(Opaque(x))

    with pytest.raises(StateError, match=r"bad\.heads\['a\.b'\].*without '\.'"):
        st.module(Graph.somatize(Bad()))


def test_module_is_one_per_graph_and_does_not_keep_the_graph_alive():
    g = Graph.somatize(Linear(2, 2))
    m = st.module(g)
    assert st.module(g) is m
    assert st.module(Graph.somatize(Linear(2, 2))) is not m
    ref = weakref.ref(g)
    del g, m
    gc.collect()
    assert ref() is None


def test_module_rejects_what_is_not_a_graph():
    with pytest.raises(TypeError, match="somatize Graph"):
        st.module(nn.Linear(2, 2))


@pytest.mark.parametrize("first", ["Node", "Module"])
def test_a_node_that_is_an_nn_module_too_is_refused_when_added(first):
    """A PyTorch user's guess, ``class Enc(nn.Module, Node)``: refused when added, naming the
    fix; ``module(g)`` said the node held something in an attribute called ``_modules``."""

    class Enc(*((Node, nn.Module) if first == "Node" else (nn.Module, Node))):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x, ctx):
            return Done(Opaque(self.lin(x)))

    with pytest.raises(NodeError, match=r"^node 'enc': .*Enc is an nn\.Module as well as a Node"):
        st.module(Graph.somatize(Enc()))
