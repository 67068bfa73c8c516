"""A batch that holds one example several times (a sampler drawing with replacement, an
oversampled rare class): the node cached per example computes each distinct row once, and
every place the row was asked for gets its output (found by an outside audit: 64 rows were
computed for 4 distinct examples)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

import somatize.torch as st
from somatize import DiskKeeper, Done, Graph, MemoryKeeper, Node, Opaque


class Counting(Node):
    """A frozen backbone returning a dict of rows; counts the rows it computes (in the class:
    an attribute of the node would be part of its state, so of its key)."""

    rows = 0

    def __init__(self) -> None:
        self.net = nn.Linear(4, 3)
        Counting.rows = 0

    def forward(self, x, ctx):
        Counting.rows += x.shape[0]
        h = self.net(x)
        return Done(Opaque({"h": h, "sq": (h * h).sum(1)}))


def cached(keeper) -> tuple[Graph, Counting]:
    torch.manual_seed(0)
    node = Counting()
    g = Graph.somatize(node.with_id("enc"), keeper=keeper).freeze("enc")
    return g.cache("enc", per="example"), node


@pytest.mark.parametrize("make", [MemoryKeeper, lambda: None, "disk"])
def test_a_row_repeated_in_a_batch_is_computed_once_and_given_everywhere(make, tmp_path):
    keeper = DiskKeeper(str(tmp_path)) if make == "disk" else make()
    g, node = cached(keeper)
    m = st.module(g)
    rows = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    order = torch.tensor([2, 0, 2, 2, 1, 0, 2])
    batch = rows[order]
    with torch.no_grad():
        want = node.net(batch)
    got = m(batch)
    assert node.rows == 3  # three distinct rows, seven asked for
    assert torch.equal(got["h"], want) and torch.equal(got["sq"], (want * want).sum(1))
    if keeper is not None:
        assert keeper.stats().entries == 3
        again = m(torch.cat([batch, rows[:1]]))  # every row a hit now, repeats too
        assert node.rows == 3 and torch.equal(again["h"][:-1], want)


def test_a_mix_of_hits_and_repeated_misses_comes_back_in_batch_order():
    g, node = cached(MemoryKeeper())
    m = st.module(g)
    rows = torch.randn(4, 4, generator=torch.Generator().manual_seed(2))
    m(rows[:1])  # row 0 known
    batch = rows[torch.tensor([3, 0, 1, 3, 0, 1, 2])]
    with torch.no_grad():
        want = node.net(batch)
    assert torch.equal(m(batch)["h"], want)
    assert node.rows == 1 + 3  # rows 1, 2, 3 computed once each


def test_an_oversampling_sampler_trains_as_the_uncached_graph_computing_only_distinct_rows():
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(40, 4, generator=gen), torch.randint(0, 3, (40,), generator=gen)
    weights = torch.ones(40)
    weights[:4] = 200.0  # four rare examples drawn most of the time

    class Head(Node):
        def __init__(self) -> None:
            self.out = nn.Linear(3, 3)

        def forward(self, h, ctx):
            return Done(Opaque(self.out(h["h"])))

    def fit(cache: bool) -> tuple[dict[str, torch.Tensor], int]:
        torch.manual_seed(0)
        enc = Counting()
        g = Graph.somatize(enc.with_id("enc") >> Head(), keeper=MemoryKeeper()).freeze("enc")
        if cache:
            g.cache("enc", per="example")
        sampler = WeightedRandomSampler(weights, 64, generator=torch.Generator().manual_seed(4))
        loader = DataLoader(TensorDataset(x, y), batch_size=32, sampler=sampler)
        trainer = st.Trainer(
            loss=nn.functional.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            options=st.Options(progress=False),
        )
        return trainer.fit(g, loader).state, enc.rows

    plain, plain_rows = fit(False)
    state, rows = fit(True)
    assert plain.keys() == state.keys()
    assert all(torch.allclose(plain[k], state[k], atol=1e-6) for k in plain)
    assert plain_rows >= 64 and rows < plain_rows / 2  # repeats computed once per batch
