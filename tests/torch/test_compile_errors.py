"""A node dynamo cannot trace, under ``fullgraph=True``: the error names the node."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque

EAGER = {"backend": "eager", "fullgraph": True}  # dynamo's tracing, no codegen


def fit(model, **options):
    data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(2)]
    st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=st.Options(progress=False, **options),
    ).fit(model, data)


class Branchy(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 2)

    def forward(self, x, ctx):
        if x.sum() > 0:  # a branch on a tensor's value: dynamo cannot trace it
            return Done(Opaque(self.lin(x)))
        return Done(Opaque(-self.lin(x)))


class Pass(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 4)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def test_a_node_dynamo_cannot_trace_is_named_under_fullgraph():
    torch._dynamo.reset()
    inner = Graph.somatize(Pass().with_id("a") >> Branchy().with_id("b"))
    g = Graph.somatize(Pass().with_id("first") >> inner.with_id("sub"))
    with pytest.raises(RuntimeError) as caught:
        fit(g, compile=EAGER)
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "could not trace node 'sub.b' (Branchy.forward," in notes
    assert "without fullgraph=True" in notes
