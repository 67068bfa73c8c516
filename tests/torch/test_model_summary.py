"""``st.model_summary``: the rows and totals agree with counting parameters by hand."""

from __future__ import annotations

import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, MemoryKeeper, Node, Opaque


class Lin(Node):
    def __init__(self, i: int, o: int) -> None:
        self.lin = nn.Linear(i, o)
        self.norm = nn.BatchNorm1d(o)

    def forward(self, x, ctx):
        return Done(Opaque(self.norm(self.lin(x))))


class Act(Node):
    def forward(self, x, ctx):
        return Done(Opaque(torch.relu(x)))


class Tied(Node):
    """Holds the module another node holds: weight tying."""

    def __init__(self, lin: Lin) -> None:
        self.lin = lin.lin

    def forward(self, x, ctx):
        return Done(Opaque(x @ self.lin.weight))


def count(m: nn.Module, trainable: bool | None = None) -> int:
    return sum(
        p.numel() for p in m.parameters() if trainable is None or p.requires_grad == trainable
    )


def test_rows_and_totals_match_counting_by_hand_with_frozen_cached_and_shared_nodes():
    enc = Lin(4, 8)
    g = Graph.somatize(
        enc.with_id("enc") >> Act() >> Lin(8, 8).with_id("mid") >> Tied(enc).with_id("tied"),
        keeper=MemoryKeeper(),
    )
    g.freeze("enc").cache("enc", per="example").freeze("tied")  # (tied: frozen with enc)
    s = st.model_summary(g)
    assert [r.node for r in s.rows] == ["enc", "act", "mid", "tied"]
    assert [r.type for r in s.rows] == ["Lin", "Act", "Lin", "Tied"]
    by = {r.node: r for r in s.rows}
    assert by["enc"].params == count(enc.lin) + count(enc.norm) and by["enc"].trainable == 0
    assert by["enc"].marks == ("frozen", "cached per example")
    assert by["act"].params == 0 and by["act"].marks == ()
    assert by["mid"].trainable == by["mid"].params == 8 * 8 + 8 + 2 * 8
    assert by["tied"].params == count(enc.lin) and by["tied"].trainable == 0
    m = st.module(g)
    assert s.total == count(m) and s.trainable == count(m, True) == sum(
        p.numel() for p in st.parameters(g)
    )
    assert s.frozen == count(m, False)  # the tied weight once, though two rows show it
    assert s.bytes == sum(t.numel() * t.element_size() for t in [*m.parameters(), *m.buffers()])
    text = str(s)
    assert "enc" in text and "frozen, cached per example" in text
    assert f"{s.trainable:,} trainable params, {s.frozen:,} frozen" in text


def test_a_plain_module_and_a_subgraph_get_one_row_per_child():
    seq = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 1))
    s = st.model_summary(seq)
    assert [(r.node, r.type, r.params) for r in s.rows] == [
        ("0", "Linear", 20), ("1", "ReLU", 0), ("2", "Linear", 6),
    ]  # fmt: skip
    inner = Graph.somatize(Lin(2, 3).with_id("a") >> Lin(3, 3).with_id("b"))
    outer = Graph().node("pre", Lin(2, 2)).node("sub", inner).edge("pre", "sub")
    rows = {r.node: r for r in st.model_summary(outer).rows}
    assert rows["sub"].type == "Graph" and rows["sub"].params == count(st.module(inner))
