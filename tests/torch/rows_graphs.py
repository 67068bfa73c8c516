"""The graph, data and Trainer the per-example memory tests share (tests/torch/test_rows*.py):
a frozen Encoder (counting the rows it computes in ``Encoder.rows``) cached per example,
before a trainable Head."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.watchers import CacheRows, Recorder


class Encoder(Node):
    """A frozen MLP backbone; counts the rows it computes."""

    rows = 0

    def __init__(self, i: int = 8, o: int = 16, *, scale: float = 1.0):
        self.net = nn.Sequential(nn.Linear(i, o), nn.ReLU(), nn.Dropout(0.5), nn.Linear(o, o))
        self.scale = scale

    def forward(self, x, ctx):
        Encoder.rows += x.shape[0]
        return Done(Opaque(self.net(x) * self.scale))


class Head(Node):
    def __init__(self, i: int = 16, o: int = 3):
        self.lin = nn.Linear(i, o)

    def forward(self, h, ctx):
        return Done(Opaque(self.lin(h)))


def graph(*, cached: bool = True, keeper=None, seed: int = 0) -> Graph:
    torch.manual_seed(seed)
    g = Graph.somatize(Encoder().with_id("enc") >> Head().with_id("head"), keeper=keeper)
    g.freeze("enc")
    return g.cache("enc", per="example") if cached else g


def data(n: int = 96) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g))


def trainer(epochs: int = 3, **kw) -> st.Trainer:
    return st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=epochs,
        seed=0,
        **kw,
    )


def rows_of(rec: Recorder) -> tuple[int, int]:
    events = rec.of(CacheRows)
    return sum(e.hits for e in events), sum(e.misses for e in events)
