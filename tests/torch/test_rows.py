"""Per-example memory (``g.cache(node, per="example")``): keys per row, under shuffling;
training equal to the uncached graph, one keeper call per batch, sweeps and federated rounds
sharing rows, a compiled head after a cached prefix, unpinning, and what gets hashed."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close
from torch.utils.data import DataLoader, TensorDataset

import somatize.torch as st
from somatize import DiskKeeper, Done, Graph, MemoryKeeper, Node, Opaque
from somatize.watchers import CacheRows, Recorder
from tests.torch.rows_graphs import Encoder, data, graph, rows_of, trainer


def test_a_shuffled_dataloader_hits_every_example_from_epoch_two_and_trains_the_same():
    loader = DataLoader(data(), batch_size=16, shuffle=True)
    plain = graph(cached=False)
    ref = trainer().fit(plain, loader)

    rec = Recorder()
    g = graph()
    g.watchers.append(rec)
    Encoder.rows = 0
    out = trainer(epochs=1).fit(g, loader)
    assert rows_of(rec) == (0, 96) and Encoder.rows == 96
    rec.clear()
    g2 = graph(keeper=g.keeper)  # the same weights, a new graph sharing the keeper
    g2.watchers.append(rec)
    got = trainer().fit(g2, loader)
    assert rows_of(rec) == (3 * 96, 0)  # every epoch of the second run: all hits
    assert Encoder.rows == 96  # the backbone never ran again
    assert out.num_examples == 96
    for k, v in ref.state.items():
        assert_close(got.state[k], v, rtol=1e-5, atol=1e-6)
    assert len(got.losses) == len(ref.losses) == 18
    assert_close(torch.tensor(got.losses), torch.tensor(ref.losses), atol=1e-5, rtol=0)


def test_outputs_and_gradients_equal_the_uncached_graph_in_batch_order():
    g, plain = graph(), graph(cached=False)
    m, ref = st.module(g), st.module(plain)
    x = data().tensors[0]
    m(x[:40])  # some rows seen before
    perm = torch.randperm(96, generator=torch.Generator().manual_seed(3))
    y, y_ref = m(x[perm]), ref(x[perm])
    assert_close(y, y_ref)
    y.square().sum().backward()
    y_ref.square().sum().backward()
    assert_close(g["head"].lin.weight.grad, plain["head"].lin.weight.grad)


def test_one_keeper_lookup_and_one_node_call_per_batch():
    class Counting(MemoryKeeper):
        def __init__(self):
            super().__init__()
            self.calls = {"get": 0, "get_many": 0, "put": 0, "put_many": 0}

        def get(self, key):
            self.calls["get"] += 1
            return super().get(key)

        def get_many(self, keys):
            self.calls["get_many"] += 1
            return [MemoryKeeper.get(self, k) for k in keys]

        def put(self, key, data, *, pinned=False):
            self.calls["put"] += 1
            super().put(key, data, pinned=pinned)

        def put_many(self, items, *, pinned=False):
            self.calls["put_many"] += 1
            for k, d in items:
                MemoryKeeper.put(self, k, d, pinned=pinned)

    keeper = Counting()
    g = graph(keeper=keeper)
    m = st.module(g)
    x = data().tensors[0]
    m(x[:10])
    Encoder.rows = 0
    m(x[:30])  # 10 hits, 20 misses: the node runs once, on the 20 stacked misses
    assert Encoder.rows == 20
    assert keeper.calls["get_many"] == 2 and keeper.calls["put_many"] == 2
    # per-example writes go through put_many; the one record explain reads is a put
    assert keeper.calls["put"] <= 1


@pytest.mark.parametrize("kind", ["tuple", "dict"])
def test_tuple_and_dict_batches_are_keyed_by_every_tensor_of_a_row(kind):
    class Pair(Node):
        def forward(self, batch, ctx):
            a, b = (batch[0], batch[1]) if kind == "tuple" else (batch["a"], batch["b"])
            return Done({"sum": a + b, "diff": (a - b).double()})

    g = Graph().node("pair", Pair()).freeze("pair").cache("pair", per="example")
    st.module(g)
    a, b = torch.randn(6, 4), torch.randn(6, 4)
    batch = (a, b) if kind == "tuple" else {"a": a, "b": b}
    rec = Recorder()
    g.watchers.append(rec)
    g.forward(batch)
    b2 = b.clone()
    b2[0] += 1  # only row 0 changed, in one of the tensors
    again = (a, b2) if kind == "tuple" else {"a": a, "b": b2}
    out = g.forward(again)
    assert [(e.hits, e.misses) for e in rec.of(CacheRows)] == [(0, 6), (5, 1)]
    assert_close(out["sum"], a + b2)
    assert out["diff"].dtype == torch.float64  # the dtype of a hit is the stored one
    assert_close(out["diff"], (a - b2).double())


def test_a_disk_keeper_shares_examples_across_graphs_of_a_sweep(tmp_path):
    loader = DataLoader(data(), batch_size=32, shuffle=True)
    keeper = DiskKeeper(tmp_path / "cache")
    Encoder.rows = 0
    for lr in (0.1, 0.05, 0.01):  # three head configurations, one backbone
        g = graph(keeper=DiskKeeper(tmp_path / "cache"))
        st.Trainer(
            loss=nn.functional.cross_entropy,
            optimizer=lambda ps, lr=lr: torch.optim.SGD(ps, lr=lr),
            epochs=2,
            seed=0,
        ).fit(g, loader)
    assert Encoder.rows == 96  # computed once for the whole sweep
    assert keeper.stats().entries >= 96


def test_a_cached_prefix_with_a_compiled_head_compiles_once_without_breaks():
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()

    class CompiledHead(Node):
        def __init__(self):
            self.lin = nn.Linear(16, 3)
            # the trainable part compiled alone: the keyed path (hashing, keeper) stays outside
            self.run = torch.compile(
                lambda h: self.lin(h).log_softmax(-1), backend=counter, fullgraph=True
            )

        def forward(self, h, ctx):
            return Done(Opaque(self.run(h)))

    torch._dynamo.reset()
    torch.manual_seed(0)
    g = Graph.somatize(Encoder().with_id("enc") >> CompiledHead().with_id("head"))
    g.freeze("enc").cache("enc", per="example")
    loader = DataLoader(data(), batch_size=16, shuffle=True, drop_last=True)
    result = trainer(epochs=3).fit(g, loader)  # epoch 1 computes the encoder, 2-3 hit
    assert result.steps == 18
    assert counter.frame_count == 1  # one graph, traced once: no recompile step after step


def test_federated_clients_compute_each_example_once_across_rounds():
    keeper = MemoryKeeper()
    x, y = data().tensors
    shards = [range(0, 32), range(32, 64), range(64, 96)]
    global_state = None
    Encoder.rows = 0
    for _ in range(3):  # rounds: a for loop over clients, fedavg over their results
        results = []
        for shard in shards:
            g = graph(keeper=keeper)
            if global_state is not None:
                st.load_state(g, global_state)
            loader = DataLoader(TensorDataset(x[shard], y[shard]), batch_size=8, shuffle=True)
            results.append(trainer(epochs=1).fit(g, loader))
        global_state = st.fedavg(results)
    assert Encoder.rows == 96  # each client's examples computed in round 1 only


def test_unpinning_a_node_cached_per_example_lets_gc_take_its_rows():
    keeper = MemoryKeeper()
    g = graph(keeper=keeper).pin("enc")
    st.module(g)(data().tensors[0][:6])
    assert keeper.stats().pinned == 6
    g.pin("enc", False)
    assert keeper.stats().pinned == 0
    keeper.gc(0)
    assert keeper.stats().entries == 0


def test_a_root_cached_per_example_does_not_hash_the_whole_batch(monkeypatch):
    # its rows are keyed by their content; a key of the whole input would be unused work
    import somatize.graph_run

    hashed = []
    real = somatize.graph_run.digest
    monkeypatch.setattr(somatize.graph_run, "digest", lambda *a: hashed.append(1) or real(*a))
    x = data(16).tensors[0]
    m = st.module(graph())
    assert not m.graph.program().input_keyed
    m(x)
    assert hashed == []
    batch = st.module(graph(cached=False).cache("enc"))  # per batch: keyed by the whole input
    assert batch.graph.program().input_keyed
    batch(x)
    assert hashed == [1]
    named = graph().name("enc", "features")  # a name stores the batch: its key is needed
    assert named.program().input_keyed
