"""SCAFFOLD (fl.scaffold, fl.variates) on a model with a frozen layer: only the parameters
that train are corrected, against hand-written steps."""

import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.torch import federated as fl


class TwoLayers(Node):
    def __init__(self):
        self.a, self.b = nn.Linear(4, 5), nn.Linear(5, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.b(torch.tanh(self.a(x)))))


GEN = torch.Generator().manual_seed(0)
BATCHES = [
    (torch.randn(8, 4, generator=GEN), torch.randint(0, 3, (8,), generator=GEN)) for _ in range(4)
]


def test_scaffold_on_a_graph_with_a_frozen_layer_equals_hand_written_steps():
    """fl.variates(g) leaves a frozen parameter out, so scaffold must not ask for it (it
    refused, saying to start from fl.variates(g), which is what the loop did)."""
    torch.manual_seed(0)
    g = Graph.somatize(TwoLayers())
    st.module(g).two_layers.a.weight.requires_grad_(False)  # a frozen (pretrained) weight
    c = {k: 0.1 * torch.randn(v.shape, generator=GEN) for k, v in fl.variates(g).items()}
    ci = {k: 0.1 * torch.randn(v.shape, generator=GEN) for k, v in c.items()}
    assert "two_layers.a.weight" not in c
    start = st.state(g)
    ref = TwoLayers()
    for name, p in ref.a.named_parameters():
        p.data.copy_(start[f"two_layers.a.{name}"])
    for name, p in ref.b.named_parameters():
        p.data.copy_(start[f"two_layers.b.{name}"])
    lr = 0.1
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=fl.scaffold(lambda ps: torch.optim.SGD(ps, lr=lr), g, c, ci),
        epochs=1,
        seed=0,
        options=st.Options(progress=False, shuffle=False),
    )
    result = trainer.fit(g, BATCHES)
    params = {f"two_layers.{m}.{n}": p for m in "ab" for n, p in getattr(ref, m).named_parameters()}
    for x, y in BATCHES:  # y ← y − η (g(y) − cᵢ + c), the frozen weight left alone
        for p in params.values():
            p.grad = None
        nn.functional.cross_entropy(ref.b(torch.tanh(ref.a(x))), y).backward()
        with torch.no_grad():
            for k, p in params.items():
                if k in c:
                    p -= lr * (p.grad + c[k] - ci[k])
    for k, p in params.items():
        torch.testing.assert_close(result.state[k], p.detach())
    assert torch.equal(result.state["two_layers.a.weight"], start["two_layers.a.weight"])
    new = fl.control_variate(start, result, c, ci, lr=lr)
    assert set(new) == set(c)


def test_scaffold_given_another_graph_or_no_variates_says_what_to_pass():
    import pytest

    from somatize.errors import AggregationError

    g, other = Graph.somatize(TwoLayers()), Graph.somatize(TwoLayers())
    c = fl.variates(g)
    make = fl.scaffold(lambda ps: torch.optim.SGD(ps, lr=0.1), g, c, c)
    with pytest.raises(AggregationError, match=r"parameter \(5, 4\) that is not one of g's"):
        make(st.parameters(other))  # the optimizer of another graph's parameters
    with pytest.raises(AggregationError, match="deltas is empty; pass each"):
        fl.server_variate(c, [], clients=10)
