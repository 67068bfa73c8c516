"""A frozen node in the middle passes gradients through to the trainable nodes before it,
as a PyTorch layer with ``requires_grad=False`` does: differential tests against plain torch
(outputs and gradients), the Trainer training the node upstream, and the errors of a frozen
node whose output carries gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import somatize.torch as st
from somatize import CacheError, Done, Graph, Node, Opaque, Recorder, ValueConversionError
from somatize.watchers import CacheRows

from .tensor_nodes import Linear


def _chain(sub: bool = False) -> tuple[Graph, nn.Sequential]:
    """a >> b >> c with b frozen (as a node, or as a subgraph holding it), and the same
    network in plain torch with b's parameters requires_grad=False."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 8), nn.Linear(8, 2))
    ref[2].requires_grad_(False)
    ref[1].eval()  # a frozen node runs in eval mode: its dropout is off
    nodes = [Linear(4, 8), Linear(8, 8), Linear(8, 2)]
    for node, layer in zip(nodes, (ref[0], ref[2], ref[3])):
        node.lin.load_state_dict(layer.state_dict())
    b: Node | Graph = nodes[1]
    if sub:
        b = Graph().node("inner", nodes[1])
    g = Graph().node("a", nodes[0]).node("b", b).node("c", nodes[2])
    return g.edge("a", "b").edge("b", "c").freeze("b"), ref


@pytest.mark.parametrize("sub", [False, True], ids=["node", "subgraph"])
def test_gradients_pass_through_a_frozen_middle_node_as_in_plain_torch(sub):
    g, ref = _chain(sub)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    out = st.module(g).train()(x)
    ref.train()
    ref[1].eval()
    want = ref(x)
    assert_close(out, want)
    nn.functional.cross_entropy(out, y).backward()
    nn.functional.cross_entropy(want, y).backward()
    for name, layer in (("a", ref[0]), ("c", ref[3])):
        lin = g[name].lin
        assert_close(lin.weight.grad, layer.weight.grad)
        assert_close(lin.bias.grad, layer.bias.grad)
    b = g["b"]["inner"] if sub else g["b"]
    assert b.lin.weight.grad is None and not b.lin.weight.requires_grad
    assert len(st.parameters(g)) == 4


def test_the_trainer_trains_the_node_before_a_frozen_one():
    g, ref = _chain()
    before = {n: g[n].lin.weight.detach().clone() for n in "abc"}
    data = [(torch.randn(16, 4), torch.randint(0, 2, (16,))) for _ in range(3)]
    st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=st.Options(progress=False, shuffle=False),
    ).fit(g, data)
    opt = torch.optim.SGD([p for p in ref.parameters() if p.requires_grad], lr=0.1)
    for x, y in data:  # the same steps by hand
        ref.train()
        ref[1].eval()
        opt.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        opt.step()
    assert not torch.equal(g["a"].lin.weight, before["a"])
    assert torch.equal(g["b"].lin.weight, before["b"])
    for n, layer in (("a", ref[0]), ("c", ref[3])):
        assert_close(g[n].lin.weight, layer.weight)


class Data(Node):
    """Returns its output as data (no Opaque), as a frozen node after a batch may."""

    def __init__(self) -> None:
        self.lin = nn.Linear(4, 4)

    def forward(self, x, ctx):
        return Done(self.lin(x))


def test_a_frozen_node_returning_data_after_a_trainable_one_is_told_to_return_opaque():
    g = Graph().node("a", Linear(4, 4)).node("b", Data()).edge("a", "b").freeze("b")
    with pytest.raises(ValueConversionError, match=r"node 'b' is frozen, but its input requires"):
        st.module(g)(torch.ones(2, 4))
    alone = Graph().node("b", Data()).freeze("b")  # first in the graph: data, as before
    assert not st.module(alone)(torch.ones(2, 4)).requires_grad


def test_a_frozen_cached_node_after_a_trainable_one_is_an_error_saying_why():
    g = Graph().node("a", Linear(4, 4)).node("b", Data()).edge("a", "b")
    g.freeze("b").cache("b")
    with pytest.raises(CacheError) as e:
        st.module(g)(torch.ones(2, 4))
    msg = str(e.value)
    assert "node 'b' is cached but its input from node 'a' is Opaque" in msg
    assert "passes gradients through" in msg and "freeze node 'a' too" in msg


def test_a_frozen_node_fed_a_dict_that_requires_grad_passes_gradients():
    class Pick(Node):
        def __init__(self) -> None:
            self.lin = nn.Linear(4, 4)

        def forward(self, d, ctx):
            return Done(Opaque(self.lin(d["img"])))

    g = Graph().node("pick", Pick()).freeze("pick")
    img = torch.randn(2, 4, requires_grad=True)
    st.module(g)(Opaque({"img": img})).sum().backward()
    want = torch.autograd.grad(g["pick"].lin(img).sum(), img)[0]
    assert_close(img.grad, want)


class Normalise(Node):
    """No weights: a preprocessing step written in the house style, returning Opaque."""

    def __init__(self, opaque: bool) -> None:
        self.opaque = opaque

    def forward(self, x, ctx):
        y = (x - 0.5) * 2
        return Done(Opaque(y) if self.opaque else y)


@pytest.mark.parametrize("frozen", [False, True])
def test_a_step_returning_opaque_before_a_cached_node_is_told_to_return_done_x(frozen):
    def graph(opaque: bool) -> Graph:
        torch.manual_seed(0)
        g = Graph().node("norm", Normalise(opaque)).node("enc", Linear(4, 4)).edge("norm", "enc")
        if frozen:
            g.freeze("norm")
        return g.freeze("enc").cache("enc", per="example")

    with pytest.raises(CacheError) as e:
        st.module(graph(opaque=True))(torch.ones(2, 4))
    msg = str(e.value)
    assert "its input from node 'norm' is Opaque" in msg
    assert "Done(x), not Done(Opaque(x))" in msg
    g = graph(opaque=False)  # the fix the message gives: nothing to freeze, no weights
    rec = Recorder()
    g.watchers.append(rec)
    model = st.module(g)
    model(torch.ones(2, 4))
    model(torch.ones(2, 4))
    assert [(e.hits, e.misses) for e in rec.of(CacheRows)] == [(0, 2), (2, 0)]
