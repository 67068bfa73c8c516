"""Graph: building, running (hot and keyed paths), forks, subgraphs, memory, errors."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

import somatize
from somatize import (
    CacheError,
    Ctx,
    CycleError,
    DiskKeeper,
    Done,
    DuplicateNodeError,
    Graph,
    GraphError,
    MemoryKeeper,
    MissingNodeError,
    Node,
    NodeError,
    Opaque,
    Recorder,
    Topology,
    ValueConversionError,
    decode,
)
from somatize.topology import Builder
from somatize.watchers import CacheHit, CacheMiss

CALLS: collections.Counter[str] = collections.Counter()  # kept outside nodes: not their state
# The nodes count their calls in CALLS, which their keys cannot (and need not) see.
pytestmark = pytest.mark.filterwarnings("ignore:node class .* reads the global CALLS")


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    CALLS.clear()


class Add(Node):
    def __init__(self, n: int, tag: str = "add") -> None:
        self.n, self.tag = n, tag

    def forward(self, x: Any, ctx: Ctx) -> Done:
        CALLS[self.tag] += 1
        return Done(x + self.n)


class Pair(Node):
    """Receives its inputs as a tuple and returns them as a list, to show their order."""

    def forward(self, xs: Any, ctx: Ctx) -> Done:
        return Done(list(xs))


class Wrap(Node):
    """Returns an Opaque holding a list built from its input."""

    def forward(self, x: Any, ctx: Ctx) -> Done:
        CALLS["wrap"] += 1
        return Done(Opaque([x]))


class Unwrap(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x[0])


class Metric(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x, metrics={"seen": x})


# -- building -----------------------------------------------------------------------------


def test_explicit_builder_and_introspection() -> None:
    g = Graph()
    g.node("a", Add(1)).node("b", Add(2)).edge("a", "b")
    assert g.nodes() == ("a", "b") and g.edges() == (("a", "b"),)
    assert len(g) == 2 and "a" in g and "z" not in g
    assert isinstance(g["a"], Add)
    assert repr(g) == "Graph(2 nodes, 1 edges)"
    assert g.forward(0) == 3
    assert g.catalog["b"] is g["b"]


def test_builder_errors_leave_the_graph_unchanged() -> None:
    g = Graph().node("a", Add(1)).node("b", Add(2)).edge("a", "b")
    before = (g.nodes(), g.edges(), g.topology.digest)
    with pytest.raises(DuplicateNodeError, match="'a' is already in the graph"):
        g.node("a", Add(3))
    with pytest.raises(MissingNodeError, match="no node 'z' in the graph; nodes: a, b"):
        g.edge("a", "z")
    with pytest.raises(CycleError, match=r"cycle: (b -> a -> b|a -> b -> a)"):
        g.edge("b", "a")
    with pytest.raises(GraphError, match="given twice"):
        g.edge("a", "b")
    with pytest.raises(CycleError, match="connects a node to itself"):
        g.edge("a", "a")
    with pytest.raises(GraphError, match="non-empty string"):
        g.node("", Add(1))
    with pytest.raises(TypeError, match="int is not a Node or Graph"):
        g.node("c", 3)  # type: ignore[arg-type]
    with pytest.raises(MissingNodeError, match="no node 'q'"):
        g.cache("q")
    assert (g.nodes(), g.edges(), g.topology.digest) == before
    assert g.forward(0) == 3


def test_building_a_long_chain_never_sorts_the_topology_until_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each edge is checked incrementally: 1,000 edges, built forwards, backwards and by the
    DSL, make no Topology and sort nothing; running makes one from the kept order, once,
    without checking again (no ``Topology.__post_init__``)."""
    built: list[int] = []
    checked: list[int] = []
    real, real_check = Builder.topology, Topology.__post_init__
    monkeypatch.setattr(Builder, "topology", lambda b, s=None: (built.append(1), real(b, s))[1])
    monkeypatch.setattr(Topology, "__post_init__", lambda t: (checked.append(1), real_check(t))[1])
    n = 1_000
    forwards = Graph()
    for i in range(n):
        forwards.node(f"n{i}", Add(1))
    for i in range(n - 1):
        forwards.edge(f"n{i}", f"n{i + 1}")
    backwards = Graph()  # each edge goes against insertion order: the kept order must move
    for i in range(n):
        backwards.node(f"n{i}", Add(1))
    for i in reversed(range(n - 1)):
        backwards.edge(f"n{i + 1}", f"n{i}")
    expr: Any = Add(1)
    for _ in range(n - 1):
        expr = expr >> Add(1)
    dsl = Graph.somatize(expr)
    assert built == []
    assert forwards.forward(0) == n and backwards.forward(0) == n and dsl.forward(0) == n
    assert len(built) == 3 and checked == []  # one Topology (one pass) per graph
    with pytest.raises(CycleError, match=r"cycle: n0 -> n999 -> n998 .* -> n1 -> n0"):
        backwards.edge("n0", "n999")
    assert len(dsl.nodes()) == n and dsl.nodes()[-1] == f"add_{n}"


def test_a_graph_cannot_contain_itself() -> None:
    g = Graph().node("a", Add(1))
    with pytest.raises(GraphError, match="cannot contain itself"):
        g.node("self", g)
    outer = Graph().node("g", g)
    with pytest.raises(GraphError, match="cannot contain itself"):
        g.node("outer", outer)
    assert g.nodes() == ("a",)


# -- running ------------------------------------------------------------------------------


def test_fork_hands_both_outputs_in_written_order_dsl_and_builder() -> None:
    g = Graph.somatize(Add(1) >> (Add(10) | Add(100)) >> Pair())
    assert g.forward(0) == [11, 101]
    g = Graph.somatize(Add(1) >> (Add(100) | Add(10)) >> Pair())
    assert g.forward(0) == [101, 11]
    b = Graph()
    b.node("a", Add(1)).node("x", Add(100)).node("y", Add(10)).node("d", Pair())
    b.edge("a", "x").edge("a", "y").edge("y", "d").edge("x", "d")  # y first into d
    assert b.forward(0) == [11, 101]


def test_several_roots_sinks_and_inputs() -> None:
    g = Graph.somatize(Add(1) | Add(2))
    assert g.forward(10) == (11, 12)  # every root receives the input; sinks in node order
    g = Graph.somatize(Pair())
    assert g.forward(1, 2) == [1, 2]  # several inputs arrive as a tuple


def test_opaque_passes_by_identity_and_arrives_unwrapped() -> None:
    payload = {"not": {"data"}}  # a set inside: never validated, never copied
    seen = []

    class Look(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            seen.append(x)
            return Done(Opaque(x))

    out = Graph.somatize(Look() >> Look()).forward(Opaque(payload))
    assert out is payload and all(s is payload for s in seen)


def test_a_node_that_returns_no_done_is_named_on_both_paths() -> None:
    class Bad(Node):
        def forward(self, x: Any, ctx: Ctx) -> Any:
            return x

    for watchers in ([], [Recorder()]):
        g = Graph(watchers=watchers).node("pre", Add(1)).node("bad", Bad()).edge("pre", "bad")
        with pytest.raises(NodeError, match=r"node 'bad' \(.*Bad\) returned int instead of Done"):
            g.forward(1)


def test_a_node_returning_a_set_names_the_node_and_the_fix() -> None:
    class Tags(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done({x})

    for watchers in ([], [Recorder()]):
        g = Graph(watchers=watchers).node("tags", Tags())
        with pytest.raises(ValueConversionError, match=r"output of node 'tags'.*a set.*sorted"):
            g.forward(1)
    with pytest.raises(ValueConversionError, match=r"output of node 'tags'.*set"):
        Graph().node("tags", Tags()).cache("tags").forward(1)
    with pytest.raises(ValueConversionError, match=r"the graph input.*Opaque"):
        Graph().node("a", Add(1)).forward(object())


def test_errors_inside_a_node_say_which_node_on_the_keyed_path() -> None:
    class Boom(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            raise RuntimeError("boom")

    g = Graph(watchers=[Recorder()]).node("boom", Boom())
    with pytest.raises(RuntimeError, match="boom") as info:
        g.forward(1)
    assert any("node 'boom'" in note for note in getattr(info.value, "__notes__", []))


def test_errors_inside_a_node_say_which_node_on_the_hot_path() -> None:
    class Boom(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            raise RuntimeError("boom")

    g = Graph().node("a", Add(1)).node("boom", Boom()).edge("a", "boom")
    assert not g.program().keyed and not g.watchers  # the hot path
    with pytest.raises(RuntimeError, match="boom") as info:
        g.forward(1)
    boom = f"raised by node 'boom' ({Boom.__qualname__})"
    assert getattr(info.value, "__notes__", []) == [boom]
    outer = Graph().node("sub", g)  # inside a subgraph: the inner node, then the subgraph
    with pytest.raises(RuntimeError, match="boom") as info:
        outer.forward(1)
    assert info.value.__notes__ == [boom, "raised by node 'sub' (Graph)"]


def test_metrics_travel_up_on_both_paths_also_from_subgraphs() -> None:
    for watchers in ([], [Recorder()]):
        g = Graph(watchers=watchers)
        g.node("m", Metric()).node("sub", Graph().node("inner", Metric())).edge("m", "sub")
        outcome = g.run(3)
        assert outcome.value == 3
        assert outcome.metrics == {"m": {"seen": 3}, "sub/inner": {"seen": 3}}


def test_outcome_has_a_key_for_data_and_none_for_opaque() -> None:
    g = Graph().node("a", Add(1)).cache("a")
    o = g.run(1)
    assert o.value == 2 and not o.opaque and o.key is not None and len(o.key) == 64
    o2 = Graph().node("w", Wrap()).node("a", Add(1)).cache("a").run(1)
    assert o2.opaque and o2.key is None


def test_a_subgraph_runs_as_one_step_on_both_paths() -> None:
    inner = Graph.somatize(Add(1) >> (Add(10) | Add(100)) >> Pair())
    for watchers in ([], [Recorder()]):
        g = Graph(watchers=watchers).node("pre", Add(1)).node("blk", inner).edge("pre", "blk")
        assert g.forward(0) == [12, 102]


def test_changes_deep_inside_subgraphs_are_seen() -> None:
    deepest = Graph().node("a", Add(1))
    outer = Graph().node("mid", Graph().node("deep", deepest))
    assert outer.forward(0) == 1
    deepest.node("b", Add(10)).edge("a", "b")
    assert outer.forward(0) == 11
    assert "b" in outer.to_text()
    deepest.cache("b")
    rec = Recorder()
    outer.watchers.append(rec)
    outer.forward(0)
    outer.forward(0)
    assert [e.node for e in rec.of(CacheHit)] == ["mid/deep/b"]


def test_attributes_assigned_after_a_run_take_effect() -> None:
    inner = Graph().node("a", Add(1))
    g = Graph().node("blk", inner)
    assert g.forward(1) == 2

    def tenfold(node_id: str, impl: Any, forward: Any) -> Any:
        if isinstance(impl, Graph):  # a subgraph node is wrapped too: its own nodes are
            return forward
        return lambda x, ctx: Done(10 * forward(x, ctx).value)

    inner.wrap = tenfold  # a runtime's hook, set on a subgraph after the outer graph ran
    assert g.forward(1) == 20
    g.wrap = tenfold
    g.node("b", Add(0)).edge("blk", "b")
    assert g.forward(1) == 200
    inner.wrap = None
    assert g.forward(1) == 20


def test_the_runtime_wrap_reaches_a_subgraph_node_on_both_paths() -> None:
    """What a frozen subgraph needs: the wrap of the graph holding it changes its ctx."""

    class Mode(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done((ctx.node, ctx.training))

    def evaluating(node_id: str, impl: Any, forward: Any) -> Any:
        if node_id != "blk":
            return forward
        return lambda x, ctx: forward(x, ctx._replace(run=ctx.run._replace(training=False)))

    g = Graph().node("blk", Graph().node("m", Mode())).node("m", Mode()).use(wrap=evaluating)
    assert g.forward(0, training=True) == (("m", False), ("m", True))
    g.watchers.append(Recorder())  # the keyed path
    assert g.forward(0, training=True) == (("m", False), ("m", True))


def test_placement_device_reaches_ctx_and_rebuilds() -> None:
    class Where(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done(ctx.device)

    g = Graph().node("w", Where())
    assert g.forward(0) is None
    g.place("w", device="cuda:0")
    assert g.forward(0) == "cuda:0"


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


# -- Opaque and the cache -----------------------------------------------------------------


def test_a_cached_node_with_an_opaque_input_names_both_nodes() -> None:
    g = Graph.somatize(Wrap() >> Unwrap()).cache("unwrap")
    with pytest.raises(CacheError) as info:
        g.forward(1)
    msg = str(info.value)
    assert "node 'unwrap' is cached" in msg and "from node 'wrap' is Opaque" in msg
    assert "stop caching 'unwrap'" in msg
    with pytest.raises(
        CacheError, match=r"its input, the graph input, is Opaque.*pass data as the"
    ):
        Graph().node("a", Unwrap()).cache("a").forward(Opaque([1]))


def test_a_cached_node_below_an_opaque_graph_input_raises_instead_of_a_blind_key() -> None:
    class Len(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done(len(x))

    g = Graph.somatize(Len() >> Add(0)).cache("add")
    with pytest.raises(CacheError) as info:
        g.forward(Opaque([1, 2, 3]))
    msg = str(info.value)
    assert "node 'add' is cached or named but has no key" in msg
    assert "the graph input is Opaque" in msg
    assert "stop caching 'add'" in msg
    g = Graph().node("len", Len()).node("blk", Graph().node("a", Add(0)).cache("a"))
    g.edge("len", "blk")
    with pytest.raises(
        CacheError,
        match=r"node 'blk/a' is cached or named but has no key: upstream, the graph input",
    ):
        g.forward(Opaque([1]))
    # uncached, the same graphs run; and a cached mapped node keys its items by content
    assert Graph.somatize(Len() >> Add(0)).forward(Opaque([1, 2])) == 2

    class AsData(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done(list(x))

    g = Graph.somatize(AsData() >> Len().mapped()).cache("len")
    assert g.forward(Opaque([[1], [2, 3]])) == [1, 2]


def test_recipe_keys_run_through_opaque_values_between_data() -> None:
    # Wrap returns Opaque, Unwrap turns it back into data: the key of what follows is the
    # recipe (code, arguments, state, input content), so it caches and is never stale.
    g = Graph.somatize(Wrap() >> Unwrap() >> Add(0) >> Add(1, "tail")).cache("add_2")
    seen = Recorder()
    g.watchers.append(seen)
    before = CALLS["tail"]
    assert g.forward(1) == 2 and g.forward(1) == 2
    assert CALLS["tail"] == before + 1  # the second run was a hit
    assert g.forward(5) == 6  # another input, another key: no stale value
    assert [type(e).__name__ for e in seen.events if "Cache" in type(e).__name__] == [
        "CacheMiss",
        "CacheHit",
        "CacheMiss",
    ]


class Hold(Node):
    """Returns Opaque around something that is not data."""

    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(Opaque(object()))


def test_a_cached_or_named_node_returning_opaque_that_is_not_data_raises() -> None:
    for setting in ("cache", "name"):
        g = Graph().node("h", Hold())
        if setting == "cache":
            g.cache("h")
        else:
            g.name("h", "held")
        with pytest.raises(
            CacheError,
            match="node 'h' is cached or named, so its output is stored as data, but it "
            "returned an object of type object; convert it to plain data",
        ):
            g.forward(1)
    with pytest.raises(CacheError, match="returned Opaque holding a object for item 0"):
        Graph().node("h", Hold().mapped()).cache("h").forward([1])


def test_a_cached_node_returning_opaque_around_data_stores_the_data() -> None:
    # caching was asked for: a frozen encoder written to return Opaque still caches
    g = Graph().node("w", Wrap()).cache("w").name("w", "wrapped")
    assert g.forward(1) == [1] and g.forward(1) == [1]
    assert CALLS["wrap"] == 1
    assert g.keeper is not None and decode(g.keeper.lookup("wrapped")) == [1]
    m = Graph().node("w", Wrap().mapped()).cache("w")
    assert m.forward([1, 2]) == [[1], [2]] and m.forward([2, 3]) == [[2], [3]]
    assert CALLS["wrap"] == 1 + 3


def test_uncached_nodes_after_opaque_run_fine_with_a_cache_elsewhere() -> None:
    g = Graph.somatize(Add(1) >> Wrap() >> Unwrap()).cache("add")
    assert g.forward(1) == 2 and g.forward(1) == 2
    assert CALLS["wrap"] == 2


# -- the hot path -------------------------------------------------------------------------


class _Forbidden:
    """Stands in for a hashing or timing function: any call fails the test."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the hot path called {self.what}")

    def __getattr__(self, name: str) -> Any:
        return _Forbidden(f"{self.what}.{name}")


@pytest.fixture
def no_hashing_or_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("values", "identity", "keepers.loose", "keepers.packs"):
        monkeypatch.setattr(f"somatize.{module}.blake3", _Forbidden(f"{module}.blake3"))
    for module in ("execute", "keyed", "graph", "topology", "memory", "identity"):
        monkeypatch.setattr(f"somatize.{module}.digest", _Forbidden(f"{module}.digest"))
    monkeypatch.setattr("somatize.memory.key", _Forbidden("memory.key"))
    monkeypatch.setattr("somatize.memory.NodeKeys.of", _Forbidden("NodeKeys.of"))
    monkeypatch.setattr("somatize.keyed.time", _Forbidden("keyed.time"))
    monkeypatch.setattr("somatize.graph.time", _Forbidden("graph.time"))
    monkeypatch.setattr("somatize.keyed.notify", _Forbidden("keyed.notify"))


@pytest.mark.usefixtures("no_hashing_or_timing")
def test_the_hot_path_does_no_hashing_timing_or_notifying() -> None:
    class Grow(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done(Opaque([*x, len(x)]))

    g = Graph.somatize(Grow() >> (Grow() | Grow()) >> Graph.somatize(Grow() >> Grow()))
    for _ in range(3):
        assert g.forward(Opaque([])) == [[0, 1], [0, 1], 2, 3]
    assert Graph.somatize(Add(1) >> Add(2)).forward(1) == 4  # data values: validated, not hashed


def test_the_forbidding_fixture_really_bites(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("somatize.execute.digest", _Forbidden("execute.digest"))
    monkeypatch.setattr("somatize.graph.digest", _Forbidden("graph.digest"))
    with pytest.raises(AssertionError, match=r"the hot path called graph\.digest"):
        Graph().node("a", Add(1)).cache("a").forward(1)
    assert somatize.values.digest(1)  # the real function was left alone


def test_an_entry_that_does_not_decode_is_a_miss_and_is_written_afresh() -> None:
    keeper = MemoryKeeper()
    g = Graph(keeper=keeper).node("x", Add(5, "x")).cache("x")
    out = g.run(1)
    CALLS["x"] = 0
    keeper.put(out.key, b"\xff not an encoded value")  # its checksum would hold on disk
    assert g.forward(1) == 6 and CALLS["x"] == 1  # recomputed, never a wrong value
    assert g.forward(1) == 6 and CALLS["x"] == 1  # and stored whole again


# -- a graph used as if it were an nn.Module ------------------------------------------


def test_calling_a_graph_like_a_module_names_forward_and_module() -> None:
    g = Graph.somatize(Add(1))
    with pytest.raises(TypeError, match=r"g\.forward\(x\).*st\.module\(g\)"):
        g(1)


@pytest.mark.parametrize("name", ["parameters", "state_dict", "to", "train", "eval", "cuda"])
def test_a_module_method_on_a_graph_names_module(name: str) -> None:
    g = Graph.somatize(Add(1))
    with pytest.raises(AttributeError, match=rf"no {name}\(\).*st\.module\(g\)\.{name}"):
        getattr(g, name)
    assert not hasattr(g, name)  # still an AttributeError: hasattr and getattr(..., None) work
    with pytest.raises(AttributeError, match="'Graph' object has no attribute 'nope'$"):
        g.nope  # noqa: B018 — other names keep Python's own message


def test_graph_answers_those_names_without_a_getattr() -> None:
    # a class with __getattr__ gets no specialised attribute reads in CPython: every
    # attribute of every Graph read slower, and building a 1,000-node graph took 15-30% more
    assert not any("__getattr__" in vars(c) for c in Graph.__mro__ if c is not object)


def test_iterating_a_graph_like_a_module_names_parameters() -> None:
    # torch.optim.Adam(g) does list(g), which indexes 0, 1, ... through __getitem__
    g = Graph.somatize(Add(1))
    with pytest.raises(TypeError, match=r"by node id.*st\.parameters\(g\)"):
        list(g)
    with pytest.raises(MissingNodeError, match="no node 'nope'"):
        g["nope"]
