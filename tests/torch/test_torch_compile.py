"""``torch.compile(module(g), fullgraph=True)``: one graph, zero breaks.

Checked with ``torch._dynamo.explain``, which traces without compiling.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch import nn
from torch.testing import assert_close

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque

from .tensor_nodes import Concat, Linear


class Act(Node):
    def __init__(self, dim: int):
        self.lin = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x, ctx):
        return Done(Opaque(torch.relu(self.norm(self.lin(x)))))


class Loss(Node):
    def forward(self, x, ctx):
        loss = x.pow(2).mean()
        return Done(Opaque(loss), metrics={"loss": loss.detach()})


class Detached(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 4)

    def forward(self, x, ctx):
        return Done(self.lin(x))  # data (the node is frozen): checked, not hashed


GRAPHS = {
    "chain": lambda: Graph.somatize(Act(4) >> Act(4) >> Linear(4, 2)),
    "fork": lambda: Graph.somatize(Act(4) >> (Linear(4, 3) | Linear(4, 5)) >> Concat()),
    "metrics": lambda: Graph.somatize(Act(4) >> Linear(4, 4) >> Loss()),
    "frozen": lambda: Graph.somatize(Detached().with_id("enc") >> Act(4) >> Linear(4, 2)).freeze(
        "enc"
    ),
    "subgraph": lambda: Graph.somatize(Act(4) >> Graph.somatize(Act(4) >> Act(4)) >> Linear(4, 2)),
}


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_graph_traces_as_one_graph_with_no_breaks(name):
    torch.manual_seed(0)
    g = GRAPHS[name]()
    assert len(g) >= 3
    m = st.module(g)
    x = torch.randn(2, 4)
    torch._dynamo.reset()
    report = torch._dynamo.explain(m)(x)
    assert report.graph_break_count == 0, report.break_reasons
    assert report.graph_count == 1
    assert_close(m(x), m(x))


def test_traced_graph_gives_the_eager_result_and_gradients():
    torch.manual_seed(0)
    g = GRAPHS["fork"]()
    m = st.module(g)
    x = torch.randn(3, 4)
    eager = m(x)
    eager.sum().backward()
    eager_grads = {k: p.grad.clone() for k, p in m.named_parameters()}
    m.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(m, backend="eager", fullgraph=True)  # dynamo only: no inductor
    out = compiled(x)
    assert_close(out, eager)
    out.sum().backward()
    for k, p in m.named_parameters():
        assert_close(p.grad, eager_grads[k], msg=k)


class Encode(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 4)

    def forward(self, x, ctx):
        return Done(self.lin(x))  # data (frozen): cacheable


@pytest.mark.parametrize("per", ["batch", "example"])
def test_a_cached_graph_compiled_is_refused_naming_the_node_and_the_fix(per):
    g = Graph.somatize(Encode().with_id("enc") >> Linear(4, 2)).freeze("enc")
    g.cache("enc", per="example") if per == "example" else g.cache("enc")
    torch._dynamo.reset()
    compiled = torch.compile(st.module(g), backend="eager")
    with pytest.raises(TypeError, match=r"caches 'enc'.*torch\.compile.*inside its node"):
        compiled(torch.randn(2, 4))
