"""Keys: state (holdings), and the key function of identity, declaration, state and
predecessor keys; a subgraph's key covers its nodes."""

from __future__ import annotations

import collections
from typing import Any

import pytest

from somatize import Ctx, Done, Graph, Node, Recorder, key
from somatize.memory import NodeKeys
from somatize.node_state import state
from somatize.watchers import CacheHit, CacheMiss
from tests.fakes import FakeCodec, FakeTensor
from tests.identity_nodes import Embed, node_key

CALLS: collections.Counter[int] = collections.Counter()  # outside the nodes: not their state
# The nodes count their calls in CALLS, which their keys cannot (and need not) see.
pytestmark = pytest.mark.filterwarnings("ignore:node class .* reads the global CALLS")


class Holds(Node):
    """Holds a tensor-like weight: state the codec fingerprints."""

    def __init__(self) -> None:
        self.weight = FakeTensor(b"\x01" * 64)
        CALLS[id(self)] = 0  # a collected node's id may be reused: its count is not ours

    def forward(self, x: Any, ctx: Ctx) -> Done:
        CALLS[id(self)] += 1
        return Done(x + self.weight.data[0])


# -- state --------------------------------------------------------------------------------


def test_data_state_enters_the_key() -> None:
    e = Embed(3)
    before = node_key(e)
    e.dim = 4
    assert node_key(e) != before
    assert state(Embed(3)) == state(Embed(3))


def test_a_frozen_nodes_state_is_hashed_once_and_changes_are_still_seen() -> None:
    codec = FakeCodec()
    node = Holds()
    rec = Recorder()
    g = Graph(codecs=[codec], watchers=[rec]).node("h", node).freeze("h").cache("h")
    for x in range(5):
        assert g.forward(x) == x + 1
    assert g.forward(0) == 1  # a hit
    assert CALLS[id(node)] == 5
    assert codec.hashed == 1  # the weight's digest was computed once...
    assert codec.remembered >= 5  # ...and served from the codec's memo afterwards
    node.weight.add_(1)  # state changed in place: the key must follow
    assert g.forward(0) == 2
    assert CALLS[id(node)] == 6
    assert codec.hashed == 2
    assert [type(e) for e in rec.events if isinstance(e, (CacheHit, CacheMiss))][-2:] == [
        CacheHit,
        CacheMiss,
    ]


def test_a_cached_node_is_rekeyed_when_its_state_changes() -> None:
    codec = FakeCodec()
    node = Holds()
    g = Graph(codecs=[codec]).node("h", node).cache("h")
    assert g.forward(1) == 2 and g.forward(1) == 2
    assert CALLS[id(node)] == 1
    node.weight = FakeTensor(b"\x07" * 64)  # replaced, not modified in place
    assert g.forward(1) == 8
    assert CALLS[id(node)] == 2


# -- the key function ---------------------------------------------------------------------


def test_key_is_a_pure_function_of_its_four_parts() -> None:
    base = key("id", "decl", "state", ["k1", "k2"])
    assert base == key("id", "decl", "state", ["k1", "k2"])
    assert (
        len(
            {
                base,
                key("id2", "decl", "state", ["k1", "k2"]),
                key("id", "decl2", "state", ["k1", "k2"]),
                key("id", "decl", "state2", ["k1", "k2"]),
                key("id", "decl", "state", ["k2", "k1"]),  # edge order matters
                key("id", "decl", "state", ["k1"]),
            }
        )
        == 6
    )


def test_a_subgraphs_key_covers_its_nodes() -> None:
    def outer(dim: int) -> Graph:
        return Graph().node("sub", Graph.somatize(Embed(dim) >> Embed(1)))

    keys = NodeKeys()
    assert keys.of(outer(2)["sub"], ["x"]) == keys.of(outer(2)["sub"], ["x"])
    assert keys.of(outer(2)["sub"], ["x"]) != keys.of(outer(3)["sub"], ["x"])
