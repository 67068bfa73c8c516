"""A graph's module under what plain PyTorch code does to a module: a frozen node stays frozen
through a module-wide ``requires_grad_`` toggle, ``model.<node>.<attr>`` is the node's own
after a swap, and a ``torch.func`` transform of a caching graph is refused by name."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque


class Lin(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 4)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def chain() -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(Lin().with_id("a") >> Lin().with_id("b") >> Lin().with_id("c"))


@pytest.mark.parametrize("toggled", ["the module", "a module holding it"])
def test_a_frozen_node_stays_frozen_through_a_requires_grad_toggle(toggled):
    # before: requires_grad_(True) turned the frozen node back on, st.parameters(g) held
    # it, and a step changed it (a GAN's alternation toggles whole modules so)
    g = chain().freeze("b")
    m = st.module(g)
    outer = nn.Sequential(m)
    target = m if toggled == "the module" else outer
    target.requires_grad_(False)
    target.requires_grad_(True)
    frozen = g["b"].lin.weight
    before = frozen.detach().clone()
    params = st.parameters(g)
    assert all(p is not frozen for p in params) and not frozen.requires_grad
    opt = torch.optim.SGD(params, lr=0.1)
    m(torch.randn(8, 4)).pow(2).sum().backward()
    opt.step()
    assert torch.equal(frozen, before) and frozen.grad is None
    assert st.model_summary(g).rows[1].trainable == 0


def test_a_nodes_layer_read_through_the_module_is_the_one_swapped_in():
    # before: model.b.lin was the old layer (and a hook registered on it never fired)
    g = chain()
    m = st.module(g)
    m(torch.randn(2, 4))
    g["b"].lin = nn.Linear(4, 4)
    assert m.b.lin is g["b"].lin
    seen = []
    m.b.lin.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
    m(torch.randn(3, 4))
    assert seen == [torch.Size([3, 4])]


class Embed(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(8, 16)

    def forward(self, x, ctx):
        return Done(self.lin(x))


class Head(Node):
    def __init__(self) -> None:
        self.out = nn.Linear(16, 3)

    def forward(self, h, ctx):
        return Done(Opaque(self.out(h)))


def test_a_torch_func_transform_of_a_caching_graph_is_refused_by_name():
    # before: "Cannot access data pointer of Tensor that doesn't have storage", from the
    # hashing of a transform's wrapper tensor
    torch.manual_seed(0)
    g = Graph.somatize(Embed().with_id("enc") >> Head().with_id("head"))
    g.freeze("enc").cache("enc")
    m = st.module(g).eval()
    x = torch.randn(4, 8)
    with pytest.raises(TypeError, match=r"caches 'enc'.*torch.func transform.*cache\('enc', False"):
        vmap(lambda xi: m(xi[None]))(x)
    params = {k: v.detach() for k, v in m.named_parameters() if k.startswith("head")}
    with pytest.raises(TypeError, match="torch.func transform"):
        grad(lambda p: functional_call(m, p, (x,)).sum())(params)
    g.cache("enc", False)  # the fix the error names: then the transforms work
    per_example = vmap(grad(lambda p, xi: functional_call(m, p, (xi[None],)).sum()), (None, 0))
    assert per_example(params, x)["head.out.weight"].shape == (4, 3, 16)
