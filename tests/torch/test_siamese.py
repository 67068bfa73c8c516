"""A siamese encoder in one line, one instance under two ids (``enc.with_id("left")``,
``enc.with_id("right")``), against the hand-written module that calls its encoder twice:
outputs, gradients, batch-norm statistics and weights after optimizer steps, its
parameters held once."""

from __future__ import annotations

import torch
from torch import nn
from torch.testing import assert_close

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque, Pick

from .test_differential import Dense


class Cosine(Node):
    def forward(self, pair, ctx):
        left, right = pair
        return Done(Opaque(nn.functional.cosine_similarity(left, right)))


class HandSiamese(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Dropout(0.3))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return nn.functional.cosine_similarity(self.enc(a), self.enc(b))


def siamese() -> tuple[Dense, Graph, HandSiamese]:
    torch.manual_seed(0)
    enc = Dense(6, 5, 0.3)
    g = Graph.somatize(
        ((Pick(0) >> enc.with_id("left")) | (Pick(1) >> enc.with_id("right"))) >> Cosine()
    )
    hand = HandSiamese()
    hand.enc[0].load_state_dict(enc.lin.state_dict())
    hand.enc[1].load_state_dict(enc.norm.state_dict())
    return enc, g, hand


def test_one_instance_under_two_ids_matches_a_module_calling_its_encoder_twice() -> None:
    enc, g, hand = siamese()
    assert g.nodes() == ("pick", "left", "pick_2", "right", "cosine")
    assert g["left"] is enc and g["right"] is enc
    params = st.parameters(g)
    assert len(params) == len(list(hand.parameters())) == 4  # (the encoder's once)
    assert {id(p) for p in params} == {
        id(p) for p in (*enc.lin.parameters(), *enc.norm.parameters())
    }
    model = st.module(g).train()
    opt_graph = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    opt_hand = torch.optim.SGD(hand.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    for step in range(3):
        a, b = torch.randn(8, 6, generator=gen), torch.randn(8, 6, generator=gen)
        target = torch.rand(8, generator=gen)
        outs = []
        for net, opt in ((hand, opt_hand), (model, opt_graph)):
            torch.manual_seed(step)  # (the same dropout masks, drawn left then right)
            out = net(a, b)
            loss = nn.functional.mse_loss(out, target)
            opt.zero_grad()
            loss.backward()
            outs.append(out.detach())
            grads = [p.grad.clone() for p in (net.parameters() if net is hand else params)]
            outs.append(grads)  # type: ignore[arg-type]
            opt.step()
        assert_close(outs[2], outs[0])  # outputs
        for mine, theirs in zip(outs[3], outs[1], strict=True):  # gradients: both uses summed
            assert_close(mine, theirs)
    assert_close(enc.lin.weight, hand.enc[0].weight)
    assert_close(enc.norm.running_mean, hand.enc[1].running_mean)  # (updated by both uses)
    assert int(enc.norm.num_batches_tracked) == int(hand.enc[1].num_batches_tracked) == 6
    model.eval(), hand.eval()
    a, b = torch.randn(4, 6), torch.randn(4, 6)
    assert_close(model(a, b), hand(a, b))


def test_its_state_dict_names_the_encoder_under_both_ids_as_a_module_held_twice_does() -> None:
    _, g, _ = siamese()
    names = list(st.module(g).state_dict())
    assert [n for n in names if n.startswith("left.")] == [
        n.replace("right.", "left.", 1) for n in names if n.startswith("right.")
    ]
    assert "left.lin.weight" in names and "right.lin.weight" in names
    state = st.state(g)
    assert state["left.lin.weight"] is state["right.lin.weight"] or torch.equal(
        state["left.lin.weight"], state["right.lin.weight"]
    )
    lines = g.to_text().splitlines()
    assert [ln.split()[:2] for ln in lines if ln.split()[0] in ("left", "right")] == [
        ["left", "Dense"],
        ["right", "Dense"],
    ]
    assert '"left: Dense' in g.to_mermaid() and '"right: Dense' in g.to_mermaid()


def test_frozen_and_cached_per_example_each_id_keeps_its_own_rows() -> None:
    """Keys follow content: each id's rows are keyed by the encoder and its own input, so
    the two inputs' rows are apart, and a row both meet is one entry (the same output)."""
    _, g, hand = siamese()
    g.freeze("left").freeze("right").cache("left", per="example").cache("right", per="example")
    model = st.module(g)
    a, b = torch.randn(5, 6), torch.randn(5, 6)
    hand.eval()
    assert_close(model(a, b), hand(a, b))
    assert g.keeper.stats().entries == 10
    assert_close(model(a, b), hand(a, b))
    assert [str(g.explain(a, b)[n]) for n in ("left", "right")] == [
        "left: hit (5 of 5 examples hit)",
        "right: hit (5 of 5 examples hit)",
    ]
    model(b, a)  # each input on the other side: every row found
    assert g.keeper.stats().entries == 10
