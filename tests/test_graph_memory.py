"""Graph memory: cache, name, pin and freeze; hits, keepers shared across graphs, damaged
entries recomputed, mapped nodes and cached subgraphs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from somatize import Ctx, DiskKeeper, Done, Graph, MemoryKeeper, Node, Recorder, decode
from somatize.watchers import CacheHit, CacheMiss
from tests.graph_nodes import (
    CALLS,
    Add,
    _reset_calls,  # noqa: F401 (an autouse fixture)
)

# The nodes count their calls in CALLS, which their keys cannot (and need not) see.
pytestmark = pytest.mark.filterwarnings("ignore:node class .* reads the global CALLS")


# -- memory: cache, name, pin, freeze -----------------------------------------------------


def test_a_second_forward_hits_and_does_not_call_the_node() -> None:
    rec = Recorder()
    g = Graph.somatize(Add(1, "a") >> Add(2, "b"), watchers=[rec]).cache("add_2")
    assert g.forward(1) == 4
    assert g.forward(1) == 4
    assert CALLS == {"a": 2, "b": 1}  # a is not cached; b ran once
    misses, hits = rec.of(CacheMiss), rec.of(CacheHit)
    assert [e.node for e in misses] == ["add_2"] and [e.node for e in hits] == ["add_2"]
    assert hits[0].key == misses[0].key
    assert g.forward(2) == 5 and CALLS["b"] == 2  # another input: another key


def test_a_hit_is_a_fresh_copy() -> None:
    class Listy(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done([x])

    g = Graph().node("l", Listy()).cache("l")
    first = g.forward(1)
    first.append("mutated by the caller")
    assert g.forward(1) == [1]
    assert g.forward(1) is not g.forward(1)


def test_caching_turned_on_after_a_run_takes_effect_and_off_again() -> None:
    g = Graph().node("a", Add(1, "a"))
    g.forward(1)
    g.cache("a")
    g.forward(1)
    g.forward(1)
    assert CALLS["a"] == 2
    g.cache("a", False)
    g.forward(1)
    assert CALLS["a"] == 3


def test_cached_nodes_share_entries_across_graphs_through_one_keeper(tmp_path: Path) -> None:
    keeper = DiskKeeper(tmp_path / "cache")
    assert Graph(keeper=keeper).node("x", Add(5, "x")).cache("x").forward(1) == 6
    # a new graph with an equal node (another id, another instance) reads the entry
    assert Graph(keeper=keeper).node("other", Add(5, "x")).cache("other").forward(1) == 6
    assert CALLS["x"] == 1


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_a_corrupt_disk_entry_is_recomputed_never_returned(tmp_path: Path, damage: str) -> None:
    keeper = DiskKeeper(tmp_path / "cache")
    rec = Recorder()
    g = Graph(keeper=keeper, watchers=[rec]).node("x", Add(5, "x")).cache("x")
    assert g.forward(1) == 6
    (entry,) = list(keeper.keys())
    file = keeper.path / "objects" / entry[:2] / entry
    raw = bytearray(file.read_bytes())
    if damage == "flip":
        raw[-1] ^= 0x01  # the payload's last byte: 6 becomes 7
    elif damage == "truncate":
        raw = raw[:-1]
    else:
        raw = bytearray()
    file.write_bytes(bytes(raw))
    assert g.forward(1) == 6
    assert CALLS["x"] == 2
    assert [type(e).__name__ for e in rec.events if isinstance(e, (CacheHit, CacheMiss))] == [
        "CacheMiss",
        "CacheMiss",
    ]
    assert keeper.verify() == []  # rewritten whole
    assert g.forward(1) == 6 and CALLS["x"] == 2


def test_mapped_computes_only_unseen_items() -> None:
    class Square(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            CALLS[f"sq{x}"] += 1
            return Done(x * x)

    rec = Recorder()
    g = Graph(watchers=[rec]).node("sq", Square().mapped()).cache("sq")
    assert g.forward([1, 2, 3]) == [1, 4, 9]
    rec.clear()
    assert g.forward([2, 3, 4, 2]) == [4, 9, 16, 4]
    assert CALLS == {"sq1": 1, "sq2": 1, "sq3": 1, "sq4": 1}
    assert [e.node for e in rec.of(CacheHit)] == ["sq[0]", "sq[1]", "sq[3]"]
    assert [e.node for e in rec.of(CacheMiss)] == ["sq[2]"]  # no whole-list miss


def test_a_mapped_batch_reads_the_inner_nodes_state_once_not_per_item() -> None:
    from tests.fakes import FakeCodec, FakeTensor

    class Weighted(Node):
        def __init__(self) -> None:
            self.weight = FakeTensor(b"\x02" * 8)

        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done(x * self.weight.data[0])

    def state_reads(items: list[int]) -> int:
        codec = FakeCodec()
        g = Graph(codecs=[codec]).node("w", Weighted().mapped()).cache("w")
        assert g.forward(items) == [2 * i for i in items]
        return codec.hashed + codec.remembered

    assert state_reads(list(range(3))) == state_reads(list(range(300)))


def test_a_mapped_item_shares_its_entry_with_the_inner_node() -> None:
    class Square(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            CALLS["sq"] += 1
            return Done(x * x)

    keeper = MemoryKeeper()
    Graph(keeper=keeper).node("m", Square().mapped()).cache("m").forward([3])
    assert Graph(keeper=keeper).node("s", Square()).cache("s").forward(3) == 9
    assert CALLS["sq"] == 1
    # an item equal to an earlier whole input is not confused with it
    g = Graph(keeper=keeper).node("m", Square().mapped()).cache("m").name("m", "squares")
    assert g.forward([2, 3]) == [4, 9]
    assert decode(keeper.lookup("squares")) == [4, 9]


def test_named_output_is_recorded_under_the_name() -> None:
    g = Graph.somatize(Add(1) >> Add(2)).name("add", "embeddings")
    g.forward(1)
    assert g.keeper is not None and decode(g.keeper.lookup("embeddings")) == 2
    g.forward(5)
    assert decode(g.keeper.lookup("embeddings")) == 6  # the name follows the latest output
    g.name("add", None)
    assert g.memory.named == {}


def test_a_cached_named_node_points_its_name_at_the_latest_run_also_on_a_hit() -> None:
    g = Graph().node("a", Add(1, "a")).cache("a").name("a", "latest")
    g.forward(1)
    g.forward(5)
    g.forward(1)  # a hit
    assert CALLS["a"] == 2
    assert g.keeper is not None and decode(g.keeper.lookup("latest")) == 2


def test_pinned_entries_survive_eviction() -> None:
    keeper = MemoryKeeper(max_bytes=60)
    g = Graph(keeper=keeper).node("p", Add(0, "p")).cache("p").pin("p")
    g.forward(1)
    other = Graph(keeper=keeper).node("q", Add(1000, "q")).cache("q")
    for x in range(20):
        other.forward(x)
    g.forward(1)
    assert CALLS["p"] == 1


def test_memory_maps_are_independent() -> None:
    g = Graph.somatize(Add(1) >> Add(2))
    g.freeze("add").name("add_2", "out")
    assert g.memory.frozen == {"add"} and g.memory.cached == frozenset()
    assert g.memory.named == {"add_2": "out"} and not g.memory.pinned
    assert g.memory.marks("add") == ["frozen"]
    assert g.memory.marks("add_2") == ["named 'out'"]
    g.freeze("add", False).pin("add")
    assert g.memory.marks("add") == ["pinned"]
    assert g.forward(0) == 3


def test_a_cached_subgraph_hits_as_a_unit() -> None:
    inner = Graph.somatize(Add(1, "i1") >> Add(2, "i2"))
    rec = Recorder()
    g = Graph(watchers=[rec]).node("blk", inner).cache("blk")
    assert g.forward(1) == 4 and g.forward(1) == 4
    assert CALLS == {"i1": 1, "i2": 1}
    assert [e.node for e in rec.of(CacheHit)] == ["blk"]


def test_a_cached_node_inside_a_subgraph_is_keyed_by_the_outer_input() -> None:
    inner = Graph.somatize(Add(1, "i1") >> Add(2, "i2")).cache("add_2")
    g = Graph().node("pre", Add(0, "pre")).node("blk", inner).edge("pre", "blk")
    assert [g.forward(x) for x in (1, 1, 2, 2)] == [4, 4, 5, 5]
    assert CALLS["i2"] == 2 and CALLS["i1"] == 4


def test_an_entry_that_does_not_decode_is_a_miss_and_is_written_afresh() -> None:
    keeper = MemoryKeeper()
    g = Graph(keeper=keeper).node("x", Add(5, "x")).cache("x")
    out = g.run(1)
    CALLS["x"] = 0
    keeper.put(out.key, b"\xff not an encoded value")  # its checksum would hold on disk
    assert g.forward(1) == 6 and CALLS["x"] == 1  # recomputed, never a wrong value
    assert g.forward(1) == 6 and CALLS["x"] == 1  # and stored whole again
