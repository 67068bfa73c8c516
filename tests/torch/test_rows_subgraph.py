"""A frozen subgraph cached per example (``g.freeze("enc").cache("enc", per="example")``)
remembers each row as a frozen node does: its inner nodes compute every example once under
a shuffled ``DataLoader``; and ``g.explain`` reports the cached nodes inside a subgraph."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close
from torch.utils.data import DataLoader, TensorDataset

import somatize.torch as st
from somatize import CacheError, Done, Graph, Node, Opaque, Recorder
from somatize.watchers import CacheRows, Metrics


class Layer(Node):
    """A linear layer; counts the rows it computes and reports them."""

    rows = 0

    def __init__(self, i: int, o: int) -> None:
        self.lin = nn.Linear(i, o)

    def forward(self, x, ctx):
        Layer.rows += x.shape[0]
        return Done(Opaque(torch.relu(self.lin(x))), {"rows": x.shape[0]})


class Head(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(16, 3)

    def forward(self, h, ctx):
        return Done(Opaque(self.lin(h)))


def graph(*, cached: bool = True, frozen: bool = True) -> Graph:
    torch.manual_seed(0)
    enc = Graph.somatize(Layer(8, 16).with_id("a") >> Layer(16, 16).with_id("b"))
    g = Graph.somatize(enc.with_id("enc") >> Head().with_id("head"))
    if frozen:
        g.freeze("enc")
    return g.cache("enc", per="example") if cached else g


def loader() -> DataLoader:
    gen = torch.Generator().manual_seed(1)
    data = TensorDataset(
        torch.randn(48, 8, generator=gen), torch.randint(0, 3, (48,), generator=gen)
    )
    return DataLoader(data, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(2))


def fit(g: Graph, epochs: int = 3) -> st.TrainResult:
    return st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=epochs,
        seed=0,
        options=st.Options(progress=False),
    ).fit(g, loader())


def test_each_example_is_computed_once_and_training_equals_the_uncached_graph():
    ref = fit(graph(cached=False))
    g, rec = graph(), Recorder()
    g.watchers.append(rec)
    Layer.rows = 0
    got = fit(g)
    assert Layer.rows == 2 * 48  # each inner layer, each example once, over three epochs
    rows = rec.of(CacheRows)
    assert [e.node for e in rows] == ["enc"] * 9
    assert sum(e.misses for e in rows) == 48 and sum(e.hits for e in rows) == 2 * 48
    assert got.cache["enc"]["hits"] > 0
    assert_close(torch.tensor(got.losses), torch.tensor(ref.losses), atol=1e-5, rtol=0)
    for k, v in ref.state.items():
        assert_close(got.state[k], v, rtol=1e-5, atol=1e-6)


def test_outputs_gradients_metrics_and_explain_with_some_rows_seen():
    g, plain = graph(), graph(cached=False)
    m, ref = st.module(g), st.module(plain)
    x = torch.randn(12, 8, generator=torch.Generator().manual_seed(3))
    rec = Recorder()
    g.watchers.append(rec)
    m(x[:5])
    assert m.metrics == {"enc/a": {"rows": 5}, "enc/b": {"rows": 5}}  # named as unremembered
    assert {e.node for e in rec.of(Metrics)} == {"enc/a", "enc/b"}
    Layer.rows = 0
    y = m(x.flip(0))
    assert Layer.rows == 2 * 7  # only the rows not seen before
    want = ref(x.flip(0))
    assert_close(y, want)
    y.square().sum().backward()
    want.square().sum().backward()
    assert_close(g["head"].lin.weight.grad, plain["head"].lin.weight.grad)
    assert str(g.explain(x)) == "enc: hit (12 of 12 examples hit)"


def test_a_subgraph_cached_per_example_must_be_frozen():
    g = graph(frozen=False)
    with pytest.raises(CacheError, match=r"'enc' is cached per example but is neither frozen"):
        st.module(g)(torch.randn(2, 8))


def test_explain_reports_a_cached_node_inside_a_subgraph():
    class Double(Node):
        def forward(self, x, ctx):
            return Done(x * 2)

    inner = Graph.somatize(Double().with_id("d") >> Layer(8, 16).with_id("l")).cache("d")
    g = Graph.somatize(inner.with_id("sub") >> Head().with_id("head"))
    x, m = torch.randn(4, 8), st.module(g)
    assert str(g.explain(x)).startswith("sub/d: miss")
    m(x)
    assert str(g.explain(x)) == "sub/d: hit"


def test_a_subgraph_cached_per_example_on_another_host_keys_rows_there():
    from somatize import MemoryKeeper
    from somatize.transports import InProcess

    box = MemoryKeeper()
    g = graph().place("enc", host="box")
    st.module(g)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(4))
    want = st.module(graph(cached=False))(x).detach()
    Layer.rows = 0
    first = g.forward(x, transports={"box": InProcess(box)})
    again = g.forward(x[[4, 0, 2]], transports={"box": InProcess(box)})
    assert Layer.rows == 2 * 5 and len(box) == 5  # one entry a row, in the box's keeper
    assert_close(first, want)
    assert_close(again, want[[4, 0, 2]])
