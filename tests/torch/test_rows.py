"""Per-example memory (``g.cache(node, per="example")``): keys per row, under shuffling."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close
from torch.utils.data import DataLoader, TensorDataset

import somatize.torch as st
from somatize import CacheError, DiskKeeper, Done, Graph, MemoryKeeper, Node, Opaque
from somatize.rows import get_many
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


def test_a_change_of_weights_or_declaration_misses_and_explain_says_which():
    keeper = MemoryKeeper()
    g = graph(keeper=keeper)
    m = st.module(g)
    x = data().tensors[0][:8]
    m(x)
    assert str(g.explain(x)) == "enc: hit (8 of 8 examples hit)"
    with torch.no_grad():
        g["enc"].net[0].weight.mul_(2)
    why = g.explain(x)["enc"]
    assert not why.hit and why.rows == (0, 8)
    assert why.changed == ("state (weights or held data)",)

    torch.manual_seed(0)  # the same weights, another declaration
    g2 = Graph.somatize(Encoder(scale=2.0).with_id("enc") >> Head().with_id("head"), keeper=keeper)
    g2.freeze("enc").cache("enc", per="example")
    st.module(g2)
    # scale is an argument and a plain attribute: declaration and state both change
    assert g2.explain(x)["enc"].changed == (
        "declaration (constructor arguments)",
        "state (weights or held data)",
    )
    m(x[:4])  # explain wrote nothing: the changed encoder still misses
    assert g.explain(x[:4])["enc"].hit


def test_a_change_of_code_or_of_a_helper_misses_and_explain_names_it(user_module):
    source = """
        import torch
        from torch import nn
        from somatize import Done, Node, Opaque

        def act(h):
            return torch.relu(h)  # HELPER

        class Enc(Node):
            def __init__(self):
                self.lin = nn.Linear(4, 4)

            def forward(self, x, ctx):
                return Done(Opaque(act(self.lin(x)) + 0))  # CODE
    """
    mod = user_module("rowcode", source)
    keeper = MemoryKeeper()

    def make():
        torch.manual_seed(0)
        g = Graph(keeper=keeper).node("enc", mod.Enc()).freeze("enc")
        g.cache("enc", per="example")
        st.module(g)
        return g

    x = torch.randn(5, 4)
    make().forward(x)
    assert make().explain(x)["enc"].hit
    mod = user_module("rowcode", source.replace("# HELPER", "# a comment changes nothing"))
    assert make().explain(x)["enc"].hit
    mod = user_module("rowcode", source.replace("torch.relu(h)", "torch.tanh(h)"))
    why = make().explain(x)["enc"]
    assert not why.hit and why.changed == ("code of rowcode.act",)
    mod = user_module("rowcode", source.replace("+ 0", "+ 1"))
    why = make().explain(x)["enc"]
    assert not why.hit and why.changed == ("code of rowcode.Enc",)


def test_a_new_input_row_is_named_as_the_input():
    g = graph()
    st.module(g)(data().tensors[0][:4])
    why = g.explain(data().tensors[0][2:6])["enc"]
    assert why.rows == (2, 2) and why.changed == ("input: 2 examples not seen before",)


def test_a_trainable_node_needs_to_be_frozen_or_rowwise():
    torch.manual_seed(0)
    g = Graph.somatize(Encoder().with_id("enc") >> Head().with_id("head"))
    g.cache("enc", per="example")
    with pytest.raises(CacheError, match=r"'enc' is cached per example but is neither frozen"):
        st.module(g)(torch.randn(2, 8))

    class Scale(Node):
        rowwise = True  # each row alone: allowed without freezing

        def forward(self, x, ctx):
            return Done(x * 2)

    g = Graph().node("s", Scale()).cache("s", per="example")
    st.module(g)
    assert_close(g.forward(torch.ones(3, 2)), torch.full((3, 2), 2.0))


def test_bad_inputs_name_the_node_and_the_fix():
    class Texts(Node):
        rowwise = True

        def forward(self, x, ctx):
            return Done(x)

    class Mean(Node):
        rowwise = True

        def forward(self, x, ctx):
            return Done(x.mean(0, keepdim=True))  # one row for the whole batch

    g = Graph().node("t", Texts()).cache("t", per="example")
    st.module(g)
    with pytest.raises(CacheError, match=r"'t' is cached per example but its input is a list"):
        g.forward(["a", "b"])
    with pytest.raises(CacheError, match=r"no rows"):
        g.forward(torch.tensor(1.0))
    g = Graph().node("m", Mean()).cache("m", per="example")
    st.module(g)
    with pytest.raises(CacheError, match=r"'m' .* returned 1 rows for 4 input rows.*per batch"):
        g.forward(torch.randn(4, 2))
    with pytest.raises(Exception, match=r"per is 'batch'.*or 'example'"):
        g.cache("m", per="row")

    class Grad(Node):
        def __init__(self):
            self.lin = nn.Linear(2, 2)

        def forward(self, x, ctx):
            return Done(Opaque(self.lin(x)))

    g = Graph.somatize(Grad().with_id("grad") >> Texts().with_id("t")).cache("t", per="example")
    m = st.module(g)
    with pytest.raises(CacheError, match=r"'t' is cached but its input from node 'grad' is Opaque"):
        m(torch.randn(3, 2))


def test_a_corrupt_entry_is_a_miss_and_is_recomputed():
    class Recording(MemoryKeeper):
        def put_many(self, items, *, pinned=False):
            self.keys = [k for k, _ in items]
            super().put_many(items, pinned=pinned)

    keeper = Recording()
    g = graph(keeper=keeper)
    m = st.module(g)
    x = data().tensors[0][:4]
    good = m(x).detach()
    keys = keeper.keys
    assert len(keys) == 4 and all(keeper.get(k).startswith(b"SMZ2") for k in keys)
    keeper.put(keys[0], b"SMZ2\x00\x05junk!")  # torn layout
    keeper.put(keys[1], keeper.get(keys[1])[:-3])  # truncated row
    Encoder.rows = 0
    assert_close(m(x), good)
    assert Encoder.rows == 2
    assert all(e is not None for e in get_many(keeper, keys))  # rewritten


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


def test_hits_arrive_on_the_placed_device():
    g = graph()
    g.place("enc", device="cpu")
    st.module(g)
    x = data().tensors[0][:3]
    g.forward(x)
    out = g.forward(x)
    assert out.device.type == "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_hits_arrive_on_cuda_where_the_node_runs():  # pragma: no cover - GPU machines only
    g = graph()
    m = st.module(g).to("cuda")
    x = data().tensors[0][:8].cuda()
    first = m(x)
    again = m(x)
    assert again.device.type == "cuda"
    assert_close(again, first)


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


def test_a_node_cached_per_example_on_another_host_keys_rows_there():
    from somatize.transports import InProcess

    box_keeper = MemoryKeeper()
    g = graph().place("enc", host="box")
    st.module(g)
    x = data().tensors[0][:5]
    ref = st.module(graph(cached=False))(x)
    Encoder.rows = 0
    first = g.forward(x, transports={"box": InProcess(box_keeper)})
    again = g.forward(x[[4, 0, 2]], transports={"box": InProcess(box_keeper)})
    assert Encoder.rows == 5 and len(box_keeper) == 5  # one entry a row, in the box's keeper
    assert_close(first, ref.detach())
    assert_close(again, ref.detach()[[4, 0, 2]])


def test_a_root_cached_per_example_does_not_hash_the_whole_batch(monkeypatch):
    # its rows are keyed by their content; a key of the whole input would be unused work
    import somatize.graph

    hashed = []
    real = somatize.graph.digest
    monkeypatch.setattr(somatize.graph, "digest", lambda *a: hashed.append(1) or real(*a))
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
