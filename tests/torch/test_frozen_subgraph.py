"""A frozen subgraph node runs as a frozen plain node does: eval mode, ``ctx.training``
False, no grad — on the hot path and the keyed path, cached or not — and a module holding
a subgraph pickles."""

from __future__ import annotations

import copy
import io

import torch
from torch import nn
from torch.testing import assert_close

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque, Recorder

from .tensor_nodes import Linear


class Drop(Node):
    """Drops out through ctx.training (the documented idiom); counts its calls and keeps
    what the last one saw: (ctx.training, grad enabled)."""

    calls = 0
    last = (True, True)

    def __init__(self, data: bool = False) -> None:
        self.lin = nn.Linear(4, 4)
        self.data = data

    def forward(self, x, ctx):
        Drop.calls += 1
        Drop.last = (ctx.training, torch.is_grad_enabled())
        y = nn.functional.dropout(self.lin(x), 0.5, training=ctx.training)
        return Done(y if self.data else Opaque(y))


def _pair(data: bool = False) -> tuple[Drop, Drop]:
    torch.manual_seed(0)
    a = Drop(data)
    b = Drop(data)
    b.lin.load_state_dict(a.lin.state_dict())
    return a, b


def _plain(node: Drop) -> Graph:
    """The node frozen directly, before a trainable head."""
    return Graph().node("mid", node).node("c", Linear(4, 2)).edge("mid", "c").freeze("mid")


def _sub(node: Drop) -> Graph:
    """The same node inside a subgraph, the subgraph frozen."""
    sub = Graph().node("d", node)
    return Graph().node("mid", sub).node("c", Linear(4, 2)).edge("mid", "c").freeze("mid")


def test_a_frozen_subgraph_runs_its_nodes_as_a_frozen_node_runs():
    a, b = _pair()
    plain, sub = _plain(a), _sub(b)
    sub["c"].lin.load_state_dict(plain["c"].lin.state_dict())
    x = torch.randn(3, 4)
    for keyed in (False, True):  # the hot path, then the keyed path (a watcher listens)
        if keyed:
            plain.watchers.append(Recorder())
            sub.watchers.append(Recorder())
        Drop.calls, Drop.last = 0, (True, True)
        want = st.module(plain).train()(x)
        assert (Drop.calls, Drop.last) == (1, (False, False))
        Drop.last = (True, True)
        m = st.module(sub).train()
        first = m(x)
        assert Drop.last == (False, False)  # ctx.training False, under no_grad
        second = m(x)
        assert (Drop.calls, Drop.last) == (3, (False, False))
        assert_close(first, want)  # no dropout mask, either call
        assert_close(second, want)
        assert not b.lin.training and not b.lin.weight.requires_grad


def test_a_frozen_subgraph_put_back_in_training_mode_runs_in_eval_mode():
    _, b = _pair()
    b.lin = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    g = _sub(b)
    m = st.module(g).train()
    b.lin.train()  # on the user's own handle, after the freeze
    x = torch.randn(3, 4)
    assert_close(m(x), m(x))
    assert not b.lin[1].training


def test_a_frozen_cached_subgraph_remembers_the_output_without_dropout():
    """What a frozen cached node remembers: computed in eval mode, whatever the mode."""
    a, b = _pair(data=True)
    x = torch.randn(8, 4)
    with torch.no_grad():
        clean = a.lin(x)
    plain, sub = _plain(a).cache("mid"), _sub(b).cache("mid")
    st.module(plain).train()(x)
    st.module(sub).train()(x)  # a training step fills the cache

    seen = {}

    class Spy(Node):
        def forward(self, h, ctx):
            seen["h"] = h
            return Done(Opaque(h))

    for g in (plain, sub):
        spy = Graph().node("mid", g["mid"]).node("spy", Spy()).edge("mid", "spy")
        spy.freeze("mid").cache("mid").keeper = g.keeper
        Drop.calls = 0
        st.module(spy).eval()(x)
        assert Drop.calls == 0  # served by the keeper
        assert_close(seen["h"], clean)


def test_a_module_with_a_subgraph_saves_loads_and_deep_copies():
    torch.manual_seed(0)
    block = Graph.somatize(Linear(4, 4).with_id("p") >> Linear(4, 4).with_id("q"))
    g = Graph().node("a", Linear(4, 4)).node("block", block).node("head", Linear(4, 2))
    g.edge("a", "block").edge("block", "head").freeze("block")
    m = st.module(g)
    x = torch.randn(2, 4)
    want = m(x).detach()
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)  # (a file this test made)
    twin = copy.deepcopy(m)
    for other in (loaded, twin):
        assert_close(other(x), want)
        assert not other.get_parameter("block.p.lin.weight").requires_grad  # still frozen
        with torch.no_grad():  # each copy runs its own nodes
            other.get_parameter("a.lin.weight").zero_()
        assert not torch.equal(other(x), want)
    assert_close(m(x), want)
