"""A node's tensor attribute that requires grad but is not an nn.Parameter is registered as
a buffer, never trained: module(g) warns, once per node attribute, naming both and the fix
(holdings.node_holdings)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import StateError


class W(Node):
    def __init__(self) -> None:
        self.w = torch.randn(4, 2, requires_grad=True)

    def forward(self, x, ctx):
        return Done(Opaque(x @ self.w))


class Fixed(Node):
    """What the warning says to write, and a tensor meant to stay (no grad)."""

    def __init__(self) -> None:
        self.w = nn.Parameter(torch.randn(4, 2))
        self.scale = torch.ones(2)

    def forward(self, x, ctx):
        return Done(Opaque(x @ self.w * self.scale))


class Outer(Node):
    def __init__(self) -> None:
        self.inner = W()

    def forward(self, x, ctx):
        return self.inner.forward(x, ctx)


def quiet(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught]


def test_a_tensor_requiring_grad_warns_naming_node_attribute_and_fix():
    g = Graph.somatize(W())
    with pytest.warns(
        UserWarning,
        match=r"'w' of node 'w' is a tensor that requires grad, but not an nn.Parameter.*"
        r"st.parameters\(g\) leaves it out.*self.w = nn.Parameter\(",
    ):
        st.module(g)
    assert st.parameters(g) == []  # what it warns about: the tensor is a buffer


def test_it_warns_once_per_node_attribute():
    node = W()
    with pytest.warns(UserWarning, match="'w' of node 'w'"):
        st.module(Graph.somatize(node))
    assert quiet(lambda: st.module(Graph.somatize(node))) == []  # registered again: quiet
    other = quiet(lambda: st.module(Graph.somatize(W())))  # another node: its own warning
    assert len(other) == 1 and "'w' of node 'w'" in other[0]


def test_a_nested_node_is_named_by_its_path():
    with pytest.warns(UserWarning, match=r"'w' of node 'outer.inner'"):
        st.module(Graph.somatize(Outer()))


def test_parameters_and_tensors_without_grad_do_not_warn_and_train():
    g = Graph.somatize(Fixed())
    assert quiet(lambda: st.module(g)) == []
    before = g["fixed"].w.detach().clone()
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5),
        options=st.Options(progress=False),
    ).fit(g, [(x, y)])
    assert not torch.equal(before, g["fixed"].w)  # the parameter trained


class Listed(Node):
    """Parameters in a list: nn.Module registers none of them, and neither does module(g)."""

    def __init__(self, box) -> None:
        self.ws = box(nn.Parameter(torch.ones(4)) for _ in range(2))

    def forward(self, x, ctx):
        return Done(Opaque(x * self.ws[0] * self.ws[1]))


@pytest.mark.parametrize("box", [list, tuple])
def test_a_parameter_inside_a_list_is_refused_naming_it_and_the_fix(box):
    g = Graph.somatize(Listed(box))
    with pytest.raises(StateError) as caught:
        st.parameters(g)
    message = str(caught.value)
    assert f"listed.ws[0] is an nn.Parameter inside a {box.__name__}" in message
    assert "no optimizer would train it" in message and "nn.ParameterList" in message


def test_a_tensor_requiring_grad_inside_a_dict_is_refused_too():
    class Keyed(Node):
        def __init__(self) -> None:
            self.ws = {"a": torch.ones(4, requires_grad=True)}

        def forward(self, x, ctx):
            return Done(Opaque(x * self.ws["a"]))

    with pytest.raises(StateError, match=r"keyed.ws\['a'\] is a tensor that requires grad"):
        st.module(Graph.somatize(Keyed()))


def test_in_a_parameter_list_they_train_as_in_plain_pytorch():
    node = Listed(nn.ParameterList)
    g = Graph.somatize(node)
    names = [n for n, _ in st.module(g).named_parameters()]
    assert names == ["listed.ws.0", "listed.ws.1"]
    x = torch.randn(3, 4)
    out = st.module(g)(x)
    out.sum().backward()
    ref = torch.ones(4, requires_grad=True), torch.ones(4, requires_grad=True)
    (x * ref[0] * ref[1]).sum().backward()
    torch.testing.assert_close(node.ws[0].grad, ref[0].grad)
