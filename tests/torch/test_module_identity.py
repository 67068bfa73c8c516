"""``module(g)`` is one module per graph: a copy of the module is its graph copy's module,
and a module made again starts in the mode the last one was left in (found by an outside
audit: the new one was in training mode while the nodes' modules were in eval, so nodes
saw ctx.training True and ran their dropout)."""

from __future__ import annotations

import copy
import gc
import io

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque


class Drop(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 4)

    def forward(self, x, ctx):
        return Done(Opaque(F.dropout(self.lin(x), 0.5, training=ctx.training)))


def fresh() -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(Drop())


X = torch.randn(3, 4)


def copied(m: st.GraphModule, how: str) -> st.GraphModule:
    if how == "deepcopy":
        return copy.deepcopy(m)
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)  # (a file this test wrote)


@pytest.mark.parametrize("how", ["deepcopy", "torch.save"])
def test_a_copy_of_the_module_is_the_module_of_its_graph_copy(how):
    m = st.module(fresh()).eval()
    m2 = copied(m, how)
    assert m2.graph is not m.graph
    assert st.module(m2.graph) is m2 and not st.module(m2.graph).training
    with torch.no_grad():
        assert torch.equal(st.module(m2.graph)(X), m2.graph["drop"].lin(X))  # no dropout


def test_a_module_made_again_starts_in_the_mode_the_last_was_left_in():
    g = fresh()
    st.module(g).eval()
    gc.collect()  # (the first module is gone: nothing holds it)
    again = st.module(g)
    assert not again.training
    with torch.no_grad():
        assert torch.equal(again(X), g["drop"].lin(X))  # ctx.training False: no dropout
    again.train()
    del again
    gc.collect()
    assert st.module(g).training  # left in training mode: made again in it
