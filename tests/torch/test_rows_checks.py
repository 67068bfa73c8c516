"""Per-example memory's checks: a trainable node must be frozen or rowwise, bad inputs name
the node and the fix, and a corrupt entry is a miss that is recomputed."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import somatize.torch as st
from somatize import CacheError, Done, Graph, MemoryKeeper, Node, Opaque
from somatize.rows import get_many
from tests.torch.rows_graphs import Encoder, Head, data, graph


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


class BatchStats(Node):
    """A backbone whose batch norm keeps no running statistics (MAML-style): eval mode
    still normalises each batch with its own statistics."""

    def __init__(self, track: bool) -> None:
        self.net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4, track_running_stats=track))

    def forward(self, x, ctx):
        return Done(Opaque(self.net(x)))


def test_a_batch_norm_without_running_statistics_is_refused_per_example_only():
    g = Graph().node("enc", BatchStats(track=False)).freeze("enc").cache("enc", per="example")
    x = torch.randn(8, 4)
    with pytest.raises(CacheError, match=r"'enc' .* holds BatchNorm1d 'net.1' with track_running"):
        st.module(g)(x)
    g.cache("enc")  # per batch: the batch is the key
    assert torch.equal(st.module(g)(x), g.forward(x))
    g = Graph().node("enc", BatchStats(track=True)).freeze("enc").cache("enc", per="example")
    st.module(g)(x)  # running statistics: each row alone in eval mode


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
    with pytest.raises(CacheError, match=r"'m' .* returned 1 row for 4 input rows.*per batch"):
        g.forward(torch.randn(4, 2))
    with pytest.raises(Exception, match=r"per is 'batch'.*or 'example'"):
        g.cache("m", per="row")

    class Floats(Node):
        rowwise = True

        def forward(self, x, ctx):
            return Done([float(v) for v in x.sum(1)])  # numbers, not a tensor of them

    g = Graph().node("f", Floats()).cache("f", per="example")
    st.module(g)
    with pytest.raises(CacheError, match=r"'f' .* its output is a list") as e:
        g.forward(torch.randn(4, 2))
    assert "return a tensor (torch.as_tensor)" in str(e.value)  # before: "use .mapped()"
    assert ".mapped()" not in str(e.value)

    class Grad(Node):
        def __init__(self):
            self.lin = nn.Linear(2, 2)

        def forward(self, x, ctx):
            return Done(Opaque(self.lin(x)))

    g = Graph.somatize(Grad().with_id("grad") >> Texts().with_id("t")).cache("t", per="example")
    m = st.module(g)
    with pytest.raises(CacheError, match=r"'t' is cached but its input from node 'grad' is Opaque"):
        m(torch.randn(3, 2))


class Recording(MemoryKeeper):
    """A keeper that remembers the keys of the last batch written."""

    def put_many(self, items, *, pinned=False):
        self.keys = [k for k, _ in items]
        super().put_many(items, pinned=pinned)


def test_a_corrupt_entry_is_a_miss_and_is_recomputed():
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


def test_an_entry_of_the_right_size_with_another_prefix_is_a_miss_among_hits():
    """A batch of hits is checked at C speed by each entry's size and prefix: one entry of
    the same size whose prefix differs by a byte is not served, but computed again."""

    keeper = Recording()
    m = st.module(graph(keeper=keeper))
    x = data().tensors[0][:4]
    good = m(x).detach()
    keys = keeper.keys
    entry = bytearray(keeper.get(keys[2]))
    entry[8] ^= 1  # inside the layout: the same size, another prefix
    keeper.put(keys[2], bytes(entry))
    Encoder.rows = 0
    assert_close(m(x), good)
    assert Encoder.rows == 1
    assert keeper.get(keys[2]) != bytes(entry)  # rewritten


def test_an_entry_whose_layout_claims_rows_without_their_bytes_is_a_miss():
    """Found by an outside audit: entries (a shared cache, given by someone else) whose
    layout claims 16 floats a row but 0 bytes were served as ``torch.empty`` rows — memory
    never written, of a size the entry names (gigabytes from a few bytes) — not recomputed."""
    import json
    import struct

    keeper = Recording()
    m = st.module(graph(keeper=keeper))
    x = data().tensors[0][:4]
    good = m(x).detach()
    entry = keeper.get(keeper.keys[0])
    (n,) = struct.unpack(">H", entry[4:6])
    kind, names, infos = json.loads(entry[6 : 6 + n])
    assert infos[0][1][1] == [16]  # (the row shape)
    text = json.dumps([kind, names, [[tag, layout, 0] for tag, layout, _ in infos]]).encode()
    for k in keeper.keys:
        keeper.put(k, b"SMZ2" + struct.pack(">H", len(text)) + text)
    Encoder.rows = 0
    assert_close(m(x), good)
    assert Encoder.rows == 4  # every row computed again
