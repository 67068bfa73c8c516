"""The stored form of a per-example row: a compact prefix, and the older form still read."""

from __future__ import annotations

import torch
from torch import nn
from torch.testing import assert_close

import somatize.torch as st
from somatize import Done, Graph, MemoryKeeper, Node, Opaque
from somatize.row_entries import ROWS_VERSION, _parse, _prefix, check_entry, layout_of
from somatize.torch.codecs import default_codecs
from somatize.values import encode


class Teacher(Node):
    """A frozen teacher's logits (10 classes), cached per example; counts the rows run."""

    rows = 0

    def __init__(self) -> None:
        self.net = nn.Linear(8, 10)

    def forward(self, x, ctx):
        Teacher.rows += x.shape[0]
        return Done(Opaque(self.net(x)))


class Keeper(MemoryKeeper):
    """Remembers the keys of the last put_many."""

    def put_many(self, items, *, pinned=False):
        self.keys = [k for k, _ in items]
        super().put_many(items, pinned=pinned)


def graph(keeper):
    torch.manual_seed(0)
    g = Graph.somatize(Teacher().with_id("teacher"), keeper=keeper)
    return g.freeze("teacher").cache("teacher", per="example")


def old_form(entry: bytes) -> bytes:
    """The same row as somatize wrote it before: SMZR, a 4-byte length, canonical data."""
    prefix = layout_of(entry, default_codecs()).prefix
    kind, names, infos = _parse(prefix)
    old = encode((ROWS_VERSION, kind, names, list(infos)))
    return b"SMZR" + len(old).to_bytes(4, "big") + old + entry[len(prefix) :]


def test_a_row_of_ten_logits_carries_a_prefix_of_under_60_bytes():
    keeper = Keeper()
    m = st.module(graph(keeper))
    with torch.no_grad():
        m(torch.randn(4, 8))
    entry = keeper.get(keeper.keys[0])
    assert entry[:4] == b"SMZ2"
    prefix = len(entry) - 10 * 4
    assert prefix < 60  # (the canonical-data form took 156: 4.9× the 40 bytes of logits)
    assert len(old_form(entry)) - 10 * 4 > 150  # what the old form costs, for comparison


def test_rows_of_the_older_form_still_hit_and_are_rewritten_when_met_beside_new_ones():
    keeper = Keeper()
    g = graph(keeper)
    m = st.module(g)
    x = torch.randn(6, 8)
    with torch.no_grad():
        want = m(x)
    keys = keeper.keys
    new = {k: keeper.get(k) for k in keys}
    for k in keys:  # a cache written by an older somatize
        keeper.put(k, old_form(new[k]))
    assert all(check_entry(keeper.get(k), default_codecs()) for k in keys)  # verify reads it
    Teacher.rows = 0
    with torch.no_grad():
        assert_close(m(x), want, rtol=0, atol=0)
    assert Teacher.rows == 0  # every old row hit
    for k in keys[:3]:  # half rewritten since
        keeper.put(k, new[k])
    with torch.no_grad():  # (rows computed in a batch of another size: to float tolerance)
        assert_close(m(x), want)
    assert Teacher.rows == 3  # the old rows beside new ones: computed again...
    assert all(keeper.get(k)[:4] == b"SMZ2" for k in keys)  # ...and written in the new form
    Teacher.rows = 0
    with torch.no_grad():
        assert_close(m(x), want)
    assert Teacher.rows == 0


def test_a_layout_json_cannot_say_exactly_is_written_in_the_older_form():
    infos = (("torch.tensor", ("float32", (3,)), 12),)
    assert _prefix("leaf", (), infos)[:4] == b"SMZ2"
    assert layout_of(
        _prefix("dict", ("a", "b"), infos * 2) + b"\0" * 24, default_codecs()
    ).names == (
        "a",
        "b",
    )
    odd = (("torch.tensor", ("float32", (3,), b"\x01"), 12),)  # bytes: not JSON
    prefix = _prefix("leaf", (), odd)
    assert prefix[:4] == b"SMZR"
    assert layout_of(prefix + b"\0" * 12, default_codecs()).leaves[0][1] == odd[0][1]
