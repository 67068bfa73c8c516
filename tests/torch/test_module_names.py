"""The names of module(g)'s state_dict, pinned: checkpoints, st.state and exported programs
are keyed by them, so a rename would stop old checkpoints loading (a deployment review's
guard). They do not depend on caching, freezing, mapping or the mode."""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from dataclasses import dataclass

import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, MemoryKeeper, Node

Pair = namedtuple("Pair", "a b")


@dataclass
class Box:
    enc: nn.Module
    k: int = 1


class Inner(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(2, 2)

    def forward(self, x, ctx):
        return Done(self.lin(x))


class Holds(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(2, 2)
        self.seq = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
        self.scale = nn.Parameter(torch.ones(2))
        self.shift = torch.zeros(2)
        self.items = [nn.Linear(2, 2), {"a": nn.Linear(2, 2)}, (nn.Linear(2, 2),)]
        self.table = OrderedDict(x=nn.Linear(2, 2))
        self.by_int = {3: nn.Linear(2, 2)}
        self.pair = Pair(nn.Linear(2, 2), nn.Linear(2, 2))
        self.box = Box(nn.Linear(2, 2))
        self.inner = Inner()

    def forward(self, x, ctx):
        return Done(self.lin(x) * self.scale + self.shift)


NAMES = [
    "h.box.enc.bias", "h.box.enc.weight", "h.by_int.3.bias", "h.by_int.3.weight",
    "h.inner.lin.bias", "h.inner.lin.weight", "h.items.0.bias", "h.items.0.weight",
    "h.items.1.a.bias", "h.items.1.a.weight", "h.items.2.0.bias", "h.items.2.0.weight",
    "h.lin.bias", "h.lin.weight", "h.pair.a.bias", "h.pair.a.weight", "h.pair.b.bias",
    "h.pair.b.weight", "h.scale", "h.seq.0.bias", "h.seq.0.weight", "h.seq.1.bias",
    "h.seq.1.num_batches_tracked", "h.seq.1.running_mean", "h.seq.1.running_var",
    "h.seq.1.weight", "h.shift", "h.table.x.bias", "h.table.x.weight",
    "m.lin.bias", "m.lin.weight", "sub.i.lin.bias", "sub.i.lin.weight",
]  # fmt: skip


def _graph(frozen: bool, cached: bool, eval_mode: bool) -> Graph:
    sub = Graph.somatize(Inner().with_id("i"))
    g = Graph.somatize(
        Holds().with_id("h") >> Inner().mapped().with_id("m") >> sub.with_id("sub"),
        keeper=MemoryKeeper(),
    )
    if frozen:
        g.freeze("h")
        if cached:
            g.cache("h")
    st.module(g).train(not eval_mode)
    return g


def test_the_state_dict_names_are_pinned_and_do_not_depend_on_settings():
    for frozen, cached, eval_mode in [
        (False, False, False),
        (True, False, True),
        (True, True, False),
    ]:
        g = _graph(frozen, cached, eval_mode)
        assert sorted(st.module(g).state_dict()) == NAMES
        assert sorted(st.state(g)) == NAMES
