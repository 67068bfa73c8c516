"""Caching across hosts: a remote cached, mapped, named or subgraph node keys like one
process in its host's keeper, and a slice follows the single-process keyed path."""

import pytest

from somatize import (
    CacheError,
    DeclarationError,
    Done,
    Graph,
    MemoryKeeper,
    Node,
    Opaque,
    Recorder,
    decode,
)
from somatize.transports import InProcess
from somatize.watchers import CacheHit, CacheMiss
from tests.distribute_nodes import Add, Inc, Wrap

# -- caching composes -----------------------------------------------------------------------


def test_a_remote_cached_node_uses_the_keeper_of_its_host_under_the_same_key():
    local = Graph.somatize(Inc() >> Inc(5).with_id("slow")).cache("slow")
    assert local.run(1).value == 7
    (key,) = local.keeper.keys()

    rec = Recorder()
    box_keeper = MemoryKeeper()
    g = Graph.somatize(Inc() >> Inc(5).with_id("slow"), watchers=[rec]).cache("slow")
    g.place("slow", host="box")
    box = {"box": InProcess(box_keeper)}
    assert g.forward(1, transports=box) == 7
    assert list(box_keeper.keys()) == [key]  # the key a single-host run computes
    assert g.keeper is None or len(g.keeper) == 0  # nothing in the caller's keeper
    assert g.forward(1, transports=box) == 7
    hits = [e for e in rec.events if isinstance(e, CacheHit)]
    misses = [e for e in rec.events if isinstance(e, CacheMiss)]
    assert [(e.node, e.key) for e in misses + hits] == [("slow", key), ("slow", key)]
    assert g.run(1, transports=box).key == key


def test_a_remote_cached_mapped_node_keys_items_like_one_process():
    local = Graph.somatize(Inc(3).mapped().with_id("m")).cache("m")
    assert local.forward([1, 2]) == [4, 5]
    keeper = MemoryKeeper()
    g = Graph.somatize(Inc(3).mapped().with_id("m")).cache("m").place("m", host="box")
    assert g.forward([1, 2], transports={"box": InProcess(keeper)}) == [4, 5]
    assert sorted(keeper.keys()) == sorted(local.keeper.keys())


def test_caching_downstream_of_an_opaque_input_is_refused_on_any_host():
    g = Graph.somatize(Inc() >> Inc(2)).cache("inc_2").place("inc_2", host="box")
    with pytest.raises(CacheError, match=r"'inc_2' .*no key: upstream, the graph input is Opaque"):
        g.forward(Opaque(1), transports={"box": InProcess()})


def test_a_cached_subgraph_on_another_host_keys_like_one_process():
    def make():
        g = Graph().node("pre", Inc()).node("sub", Graph.somatize(Inc(2) >> Inc(3)))
        return g.edge("pre", "sub").cache("sub")

    one = make()
    expected = one.run(1)
    keeper, rec = MemoryKeeper(), Recorder()
    g = make().place("sub", host="box")
    g.watchers.append(rec)
    for _ in range(2):
        out = g.run(1, transports={"box": InProcess(keeper)})
        assert (out.value, out.key) == (expected.value, expected.key) == (7, expected.key)
    assert list(keeper.keys()) == list(one.keeper.keys())
    assert [e.node for e in rec.of(CacheHit)] == ["sub"]


def test_a_local_subgraph_beside_a_remote_node():
    g = Graph().node("sub", Graph.somatize(Inc(2) >> Inc(3))).node("far", Inc(10))
    g.edge("sub", "far").place("far", host="box")
    assert g.forward(1, transports={"box": InProcess()}) == 16


def test_a_named_node_on_another_host_is_named_in_that_hosts_keeper():
    keeper = MemoryKeeper()
    g = Graph.somatize(Inc() >> Inc(5).with_id("far")).name("far", "result")
    g.place("far", host="box").forward(1, transports={"box": InProcess(keeper)})
    assert decode(keeper.lookup("result")) == 7


# -- a slice follows the single-process keyed path ------------------------------------------


class AsData(Node):
    """Reads an Opaque value and returns it as data."""

    def forward(self, x, ctx):
        return Done(list(x))


def test_a_remote_named_cached_node_takes_its_name_back_on_a_hit():
    keeper = MemoryKeeper()
    g = Graph.somatize(Inc() >> Inc(5).with_id("far")).cache("far").name("far", "result")
    g.place("far", host="box")
    for x in (1, 2, 1):  # the last run is a hit, and the name follows it
        g.forward(x, transports={"box": InProcess(keeper)})
    assert decode(keeper.lookup("result")) == 7


def test_a_remote_named_cached_mapped_node_stores_its_whole_list():
    keeper = MemoryKeeper()
    g = Graph.somatize(Inc(3).mapped().with_id("m")).cache("m").name("m", "items")
    g.place("m", host="box").forward([1, 2], transports={"box": InProcess(keeper)})
    assert decode(keeper.lookup("items")) == [4, 5]


def test_a_remote_cached_mapped_node_below_an_opaque_input_keys_items_by_content():
    keeper = MemoryKeeper()
    g = Graph.somatize(AsData() >> Inc(3).mapped().with_id("m")).cache("m")
    g.place("m", host="box")
    assert g.forward(Opaque([1, 2]), transports={"box": InProcess(keeper)}) == [4, 5]
    local = Graph.somatize(AsData() >> Inc(3).mapped().with_id("m")).cache("m")
    assert local.forward(Opaque([1, 2])) == [4, 5]
    assert sorted(keeper.keys()) == sorted(local.keeper.keys())


def test_a_local_cached_mapped_node_beside_a_remote_one_keys_items_like_one_process():
    def make():
        return Graph.somatize(Inc(3).mapped().with_id("m") >> Add().with_id("far")).cache("m")

    one = make()
    assert one.forward([1, 2]) == 9
    g = make().place("far", host="box")
    assert g.forward([1, 2], transports={"box": InProcess()}) == 9
    assert sorted(g.keeper.keys()) == sorted(one.keeper.keys())


def test_a_declaration_error_on_a_remote_node_names_it():
    class Bag(Node):
        def __init__(self, items):
            self.items = items

        def forward(self, x, ctx):
            return Done(x)

    g = Graph.somatize(Inc() >> Bag(iter([1, 2]))).cache("bag").place("bag", host="box")
    with pytest.raises(DeclarationError, match=r"node 'bag' needs a key .*'items' of"):
        g.forward(1, transports={"box": InProcess()})


def test_a_remote_subgraph_keys_its_nodes_through_an_opaque_input():
    def make():
        inner = Graph.somatize(AsData() >> Add().with_id("far")).cache("far")
        return Graph.somatize(Wrap()).node("sub", inner).edge("wrap", "sub")

    one = make()
    assert one.forward([1, 2]) == 3
    keeper = MemoryKeeper()
    g = make().place("wrap", host="box").place("sub", host="box")
    assert g.forward([1, 2], transports={"box": InProcess(keeper)}) == 3
    assert sorted(keeper.keys()) == sorted(one.keeper.keys())


def test_a_remote_subgraph_below_an_opaque_input_refuses_to_cache_inside():
    inner = Graph.somatize(Add().with_id("far")).cache("far")
    g = Graph.somatize(AsData()).node("sub", inner).edge("as_data", "sub")
    g.place("sub", host="box")
    box = {"box": InProcess()}
    with pytest.raises(CacheError, match=r"'sub/far' .*no key: upstream, the graph input"):
        g.forward(Opaque([1, 2]), transports=box)


class _Library:  # an object a library made: its key would read it by type alone
    pass


_Library.__module__ = "numpy"


class Holding(Node):
    def __init__(self) -> None:
        self.tool = _Library()

    def forward(self, x, ctx):
        return Done(x + 1)


def test_a_remote_node_that_is_not_cached_is_not_warned_of_as_if_it_were():
    # (filterwarnings=error: a warning fails the test)
    g = Graph.somatize(Inc() >> Holding()).place("holding", host="box")
    assert g.forward(1, transports={"box": InProcess()}) == 3
    assert g.forward(2, transports={"box": InProcess()}) == 4


def test_a_remote_cached_node_is_still_warned_of_once():
    class Held(Holding):
        pass

    g = Graph.somatize(Inc() >> Held()).cache("held").place("held", host="box")
    box = {"box": InProcess()}
    with pytest.warns(UserWarning, match="enters its key by type alone"):
        assert g.forward(1, transports=box) == 3
    assert g.forward(5, transports=box) == 7  # once
