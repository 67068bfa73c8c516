"""k-fold cross-validation over a frozen backbone cached per example (docs/campaigns.md,
"Cross-validation: folds are runs too"): one keeper shared by the folds, and the backbone
computes every example once for the whole cross-validation — fold 1 its training rows in
training and its validation rows in evaluation, the later folds none — although each fold
meets the rows in other batches, in another order. Each fold's result is the one it gets
with caching off."""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset

import somatize.torch as st
from somatize import Done, Graph, MemoryKeeper, Node, Opaque
from somatize.watchers import CacheRows, Recorder

N, EPOCHS = 60, 2


class Counting(Node):
    """A frozen MLP backbone; records the examples it computes (column 0 is their index)."""

    seen: ClassVar[list[int]] = []

    def __init__(self) -> None:
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16))

    def forward(self, x, ctx):
        Counting.seen.extend(x[:, 0].long().tolist())
        return Done(Opaque(self.net(x)))


class Head(Node):
    def __init__(self) -> None:
        self.out = nn.Linear(16, 3)

    def forward(self, h, ctx):
        return Done(Opaque(self.out(h)))


def dataset() -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, 8, generator=gen)
    x[:, 0] = torch.arange(N, dtype=torch.float32)  # the example's index, for Counting
    return TensorDataset(x, torch.randint(0, 3, (N,), generator=gen))


def folds(k: int) -> list[tuple[list[int], list[int]]]:
    """(training, validation) indices of k folds, as sklearn's KFold(shuffle=True) gives."""
    order = torch.randperm(N, generator=torch.Generator().manual_seed(1)).tolist()
    parts = [order[i::k] for i in range(k)]
    return [([i for p in parts if p is not v for i in p], v) for v in parts]


def fit_fold(g: Graph, data: TensorDataset, tr: list[int], va: list[int], fold: int):
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2),
        epochs=EPOCHS,
        metrics={"acc": st.accuracy},
        seed=fold,  # the fold's shuffle
        options=st.Options(progress=False),
    )
    train = DataLoader(Subset(data, tr), batch_size=8, shuffle=True)
    return trainer.fit(g, train, val=DataLoader(Subset(data, va), batch_size=16))


def cross_validate(k: int, *, cache: bool, one_graph: bool, keeper=None):
    """k folds, each with a fresh head: a fresh graph per fold around one backbone node
    (sharing ``keeper``), or one graph whose head is put back to its first weights."""
    data = dataset()
    torch.manual_seed(0)
    backbone = Counting().with_id("enc")
    results, rec = [], Recorder()
    g = Graph.somatize(backbone >> Head().with_id("head"), keeper=keeper, watchers=[rec])
    first = st.state(g)
    for fold, (tr, va) in enumerate(folds(k)):
        if one_graph:
            st.load_state(g, first)
        else:
            torch.manual_seed(100 + fold)  # the same fresh head with caching on and off
            g = Graph.somatize(backbone >> Head().with_id("head"), keeper=keeper, watchers=[rec])
        g.freeze("enc")
        if cache:
            g.cache("enc", per="example")
        results.append(fit_fold(g, data, tr, va, fold))
    return results, rec


@pytest.fixture(autouse=True)
def _fresh_count():
    Counting.seen = []
    yield
    Counting.seen = []


@pytest.mark.parametrize("one_graph", [False, True], ids=["graph_per_fold", "one_graph"])
@pytest.mark.parametrize("k", [3, 5])
def test_the_backbone_computes_each_example_once_for_the_whole_cross_validation(k, one_graph):
    keeper = None if one_graph else MemoryKeeper()  # one graph: its own keeper is shared
    cached, rec = cross_validate(k, cache=True, one_graph=one_graph, keeper=keeper)
    assert Counter(Counting.seen) == Counter(range(N))  # every example, exactly once
    # the cache's own count agrees: fold 1 computed every row, training and evaluation
    assert sum(e.misses for e in rec.of(CacheRows)) == N
    assert [r.cache["enc"]["misses"] for r in cached[1:]] == [0] * (k - 1)
    # a fold trains on k-1 parts and evaluates one, each epoch: without the cache the backbone
    # computes k × epochs × N rows, and its fold's sanity check (the first two val batches,
    # here all of them; a graph that remembers a node skips it) each example once more
    Counting.seen = []
    plain, _ = cross_validate(k, cache=False, one_graph=one_graph)
    assert Counter(Counting.seen) == Counter({i: k * EPOCHS + 1 for i in range(N)})

    for (tr, _), c, p in zip(folds(k), cached, plain):
        assert c.cache["enc"]["hits"] + c.cache["enc"]["misses"] == EPOCHS * len(tr)  # training
        # allclose, not equal: a row read from the cache was computed in another batch (another
        # fold's, or an evaluation's), and a matmul's last bits may depend on the batch's size
        for name in ("head.out.weight", "head.out.bias"):
            torch.testing.assert_close(c.state[name], p.state[name], rtol=1e-5, atol=1e-6)
        assert [m["epoch"] for m in c.metrics] == [m["epoch"] for m in p.metrics]
        for mc, mp in zip(c.metrics, p.metrics):
            assert mc["val_loss"] == pytest.approx(mp["val_loss"], rel=1e-5)
            assert mc["val_acc"] == pytest.approx(mp["val_acc"], abs=1e-6)
    summary = st.summarize(cached, "val_acc")
    assert summary.n == k
    assert summary.mean == pytest.approx(st.summarize(plain, "val_acc").mean, abs=1e-6)


def test_fresh_graphs_without_a_shared_keeper_compute_every_fold_again():
    """What the docs warn of: a graph made without keeper= has a MemoryKeeper of its own, so
    a fresh graph per fold finds nothing the earlier folds computed."""
    k = 3
    cross_validate(k, cache=True, one_graph=False, keeper=None)
    assert Counter(Counting.seen) == Counter({i: k for i in range(N)})
