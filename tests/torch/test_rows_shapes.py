"""A node cached per example whose rows' shape depends on the batch (an output cut to the
batch's longest sequence) is named where its rows are computed: beside rows a batch hit,
and against the rows an earlier batch computed — a fit's first epoch — before a batch
served wholly from memory could get rows of another batch's length (found by an outside
audit: a head trained on such rows differed from the uncached one, without an error)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import somatize.torch as st
from somatize import CacheError, Done, Graph, MemoryKeeper, Node, Opaque


class Truncating(Node):
    """A text encoder cutting its per-token output to the batch's longest sequence."""

    def __init__(self):
        self.emb = nn.Embedding(10, 4)

    def forward(self, b, ctx):
        longest = int(b["mask"].sum(1).max()) if len(b["mask"]) else 0
        return Done(Opaque(self.emb(b["ids"][:, :longest])))  # (batch, longest, 4)


class MeanHead(Node):
    def __init__(self):
        self.lin = nn.Linear(4, 2)

    def forward(self, h, ctx):
        return Done(Opaque(self.lin(h.mean(1))))


IDS = torch.randint(1, 10, (4, 6), generator=torch.Generator().manual_seed(0))
MASK = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0], [1] * 6])


def cached(node: Node, keeper=None) -> Graph:
    g = Graph.somatize(node.with_id("enc"), keeper=MemoryKeeper() if keeper is None else keeper)
    g.freeze("enc").cache("enc", per="example")
    st.module(g)
    return g


def test_rows_of_another_shape_than_an_earlier_batch_computed_are_named():
    torch.manual_seed(0)
    g = cached(Truncating())
    g.forward({"ids": IDS[:2], "mask": MASK[:2]})  # rows 0 and 1 computed as (3, 4)
    with pytest.raises(CacheError) as e:  # rows 2 and 3, no hit among them, as (6, 4)
        g.forward({"ids": IDS[2:], "mask": MASK[2:]})
    message = str(e.value)
    assert "node 'enc'" in message and "(6, 4)" in message and "(3, 4)" in message
    assert "computed in an earlier batch" in message and "g.cache('enc')" in message


def test_rows_of_another_shape_beside_hits_are_named_and_not_stored():
    torch.manual_seed(0)
    keeper = MemoryKeeper()
    g = cached(Truncating(), keeper)
    g.forward({"ids": IDS[:2], "mask": MASK[:2]})
    with pytest.raises(CacheError, match="remembered for this input layout"):
        g.forward({"ids": IDS[:3], "mask": MASK[:3]})  # row 2 as (5, 4) beside two hits
    assert keeper.stats().entries == 2  # the row of another shape was not kept


def test_a_fit_over_such_a_node_fails_in_its_first_epoch_instead_of_training_otherwise():
    loader = DataLoader(TensorDataset(IDS, MASK, torch.tensor([0, 1, 0, 1])), batch_size=2)
    torch.manual_seed(0)
    g = Graph.somatize(Truncating().with_id("enc") >> MeanHead())
    g.freeze("enc").cache("enc", per="example")
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=2,
        split=lambda b: ({"ids": b[0], "mask": b[1]}, b[2]),
        options=st.Options(progress=False),
    )
    with pytest.raises(CacheError, match="computed in an earlier batch"):
        trainer.fit(g, loader)


class Fixed(Node):
    """A row-wise encoder; an empty batch gives an output of no particular shape."""

    def __init__(self):
        self.lin = nn.Linear(3, 2)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x) if len(x) else torch.zeros(0)))


def test_fixed_rows_after_an_empty_batch_are_served_as_without_the_cache():
    torch.manual_seed(0)
    node = Fixed()
    g = cached(node)
    x = torch.randn(5, 3)
    assert g.forward(x[:0]).shape == (0,)
    first, again = g.forward(x[:3]), g.forward(x)
    with torch.no_grad():
        want = node.lin(x)
    assert torch.allclose(first, want[:3]) and torch.allclose(again, want)
