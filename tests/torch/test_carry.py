"""``carry.named_carries``: every ``Carry`` a model holds, wherever it is held — on a node
or on a module, itself, as an instance of a subclass, or in a list, tuple or dict — named by
where, each once."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.torch.carry import named_carries


class Kept(st.Carry):
    """A Carry of the user's own class."""

    __slots__ = ()


class Cell(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.state = Kept()
        self.layers = (st.Carry(), 3)
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


class Holder(Node):
    def __init__(self) -> None:
        self.cell = Cell()
        self.hidden = st.Carry()
        self.by_name = {"a": st.Carry(), "b": None}
        self.shared = [self.hidden]  # the same Carry twice: named once, where first found
        self.note = "not a carry"

    def forward(self, x, ctx):
        return Done(Opaque(self.cell(x)))


def test_every_carry_is_found_where_it_is_held_and_only_once():
    net = st.module(Graph.somatize(Holder().with_id("h")))
    found = named_carries(net)
    assert sorted(found) == [
        "module 'h.cell' (.layers[0])",
        "module 'h.cell' (.state)",
        "node 'h' (.by_name['a'])",
        "node 'h' (.hidden)",
    ]
    node = net.graph["h"]
    assert found["node 'h' (.hidden)"] is node.hidden
    assert found["module 'h.cell' (.state)"] is node.cell.state
    assert len({id(c) for c in found.values()}) == 4


def test_a_plain_module_s_carries_are_named_by_their_module():
    model = nn.Sequential(Cell(), nn.ReLU())
    assert sorted(named_carries(model)) == ["module '0' (.layers[0])", "module '0' (.state)"]
    cell = Cell()
    assert sorted(named_carries(cell)) == ["the model (.layers[0])", "the model (.state)"]


def test_no_walk_before_any_carry_may_exist_and_every_way_of_making_one_ends_that(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # named_carries skips its walk while no Carry can exist in the process; making one
    # (of a subclass too), copying one, unpickling one and defining a subclass are each
    # seen, so no model can hold a Carry the walk is skipped for
    kept = Cell()

    def subclass() -> nn.Module:
        class Mine(st.Carry):
            __slots__ = ()

        return kept

    for make in (
        Cell,
        lambda: copy.deepcopy(kept),
        lambda: pickle.loads(pickle.dumps(kept)),
        subclass,
    ):
        monkeypatch.setattr(st.Carry, "made", False)
        model = make()
        assert st.Carry.made
        assert sorted(named_carries(model)) == ["the model (.layers[0])", "the model (.state)"]
    one = st.Carry(detach=False)
    for copied in (copy.copy, copy.deepcopy, lambda c: pickle.loads(pickle.dumps(c))):
        monkeypatch.setattr(st.Carry, "made", False)
        twin = copied(one)
        assert st.Carry.made
        assert twin.detach is False and twin.value is None  # (its slots, as they were)
    monkeypatch.setattr(st.Carry, "made", False)
    assert named_carries(kept) == {}  # (the flag alone decides: what the walk is spared)
