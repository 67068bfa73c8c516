"""distribute(): slices and crossings; running a placed graph through InProcess."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from somatize import (
    CacheError,
    DeclarationError,
    Done,
    Graph,
    MemoryKeeper,
    Node,
    Opaque,
    Recorder,
    Topology,
    decode,
)
from somatize.errors import CrossingError, GraphError, TransportError, ValueConversionError
from somatize.placement import LOCAL, Placement
from somatize.plan import Crossing, Slice, compile, distribute
from somatize.transports import InProcess
from somatize.watchers import CacheHit, CacheMiss, Metrics, NodeEnd


class Inc(Node):
    def __init__(self, k: int = 1):
        self.k = k

    def forward(self, x, ctx):
        return Done(x + self.k)


class Add(Node):
    def forward(self, xs, ctx):
        return Done(sum(xs))


class Wrap(Node):
    """Returns its input Opaque."""

    def forward(self, x, ctx):
        return Done(Opaque(x))


class Boom(Node):
    def forward(self, x, ctx):
        raise ZeroDivisionError(f"boom on {x}")


class Measure(Node):
    def forward(self, x, ctx):
        return Done(x, metrics={"seen": x, "device": ctx.device or ""})


def chain() -> Topology:
    return Topology(("a", "b", "c"), (("a", "b"), ("b", "c")))


# -- the plan ---------------------------------------------------------------------------


def test_one_host_is_one_slice_without_crossings():
    d = distribute(compile(chain()))
    assert d.parts == (Slice(LOCAL, compile(chain()).steps, (None,), ("c",)),)
    assert d.crossings == ()
    assert d.hosts == (LOCAL,)


def test_a_value_changing_host_is_a_crossing_naming_slot_and_hosts():
    plan = compile(chain(), Placement().place("b", host="box"))
    d = distribute(plan)
    assert [str(p) for p in d.parts] == [
        "Slice(local: a)",
        "a: local -> box",
        "Slice(box: b)",
        "b: box -> local",
        "Slice(local: c)",
    ]
    box = d.slices[1]
    assert (box.inputs, box.outputs) == (("a",), ("b",))
    assert d.crossings[0] == Crossing("a", LOCAL, "box")


def test_the_input_and_the_output_cross_to_and_from_the_caller():
    placement = Placement(hosts={"a": "box", "b": "box", "c": "box"})
    d = distribute(compile(chain(), placement))
    assert [str(p) for p in d.parts] == [
        "input: local -> box",
        "Slice(box: a, b, c)",
        "c: box -> local",
    ]
    assert d.slices[0].inputs == (None,)


def test_a_device_never_changes_the_plan():
    hosts = Placement().place("b", host="box")
    with_devices = hosts.place("b", device="cuda:1").place("a", device="cuda:0")
    assert (
        distribute(compile(chain(), hosts)).parts
        == distribute(compile(chain(), with_devices)).parts
    )
    # and the placement argument overrides the plan's own
    assert distribute(compile(chain()), hosts).parts == distribute(compile(chain(), hosts)).parts


def test_consecutive_steps_on_one_host_form_one_slice_and_outputs_are_what_is_read_later():
    t = Topology(("a", "b", "c", "d"), (("a", "b"), ("b", "c"), ("a", "d"), ("c", "d")))
    d = distribute(compile(t, Placement(hosts={"b": "box", "c": "box"})))
    assert [s.nodes for s in d.slices] == [("a",), ("b", "c"), ("d",)]
    assert d.slices[0].outputs == ("a",)  # read by b (box) and d (local, later)
    assert d.slices[1].outputs == ("c",)  # b is only read inside the slice
    assert d.slices[2].inputs == ("a", "c")
    assert [str(c) for c in d.crossings] == ["a: local -> box", "c: box -> local"]


def test_a_subgraph_with_inner_hosts_is_refused():
    class Id(Node):
        def forward(self, x, ctx):
            return Done(x)

    inner = Graph.somatize(Id()).place("id", host="box")
    g = Graph().node("sub", inner).node("x", Id()).edge("sub", "x").place("x", host="other")
    with pytest.raises(GraphError, match=r"'sub'.*place the subgraph node itself"):
        distribute(g.plan())


# -- rendering --------------------------------------------------------------------------


def graph_local_box_local() -> Graph:
    return Graph.somatize(Inc().with_id("a") >> Inc(10).with_id("b") >> Inc(100).with_id("c"))


def test_to_text_shows_hosts_and_crossings():
    g = graph_local_box_local().place("b", host="box").place("c", host="box")
    text = g.to_text()
    assert "b  Inc  [@box]    <- a (local -> box)" in text
    assert text.splitlines()[-1] == "output <- c (box -> local)"
    assert "(" not in graph_local_box_local().to_text()  # one host: nothing crosses


def test_to_mermaid_draws_hosts_as_clusters_and_crossings_dashed():
    g = graph_local_box_local().place("a", host="box")
    m = g.to_mermaid()
    assert 'subgraph host_0 ["host: box"]' in m and '["host: local"]' in m
    assert m.count("-.->|crosses|") == 2  # input -> a, a -> b
    assert "-->" in m.replace("-.->", "")  # b -> c stays on one host


# -- running through InProcess ------------------------------------------------------------


def run_both(g: Graph, x, **kw):
    """The output with every node local, and with the graph's own placement."""
    placement = g.placement
    g.placement = Placement()
    g._changed()
    local = g.forward(x, **kw)
    g.placement = placement
    g._changed()
    return local, g.forward(x, transports={"box": InProcess(), "box2": InProcess()}, **kw)


def test_results_equal_in_process_for_a_fork_join_with_several_sinks():
    g = Graph.somatize(Inc() >> (Inc(2).with_id("l") | Inc(3).with_id("r")) >> Add())
    g.node("tail", Inc(7)).edge("l", "tail")
    g.place("l", host="box").place("add", host="box2").place("tail", host="box2")
    local, placed = run_both(g, 1)
    assert placed == local == (9, 11)


def test_a_subgraph_node_is_shipped_as_one_unit():
    inner = Graph.somatize(Inc(2) >> Inc(3))
    g = Graph().node("pre", Inc()).node("sub", inner).edge("pre", "sub").place("sub", host="box")
    local, placed = run_both(g, 1)
    assert placed == local == 7


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_any_placement_gives_the_same_result(data):
    g = Graph()
    for j in range(data.draw(st.integers(1, 6), label="nodes")):
        preds = sorted(data.draw(st.sets(st.integers(0, j - 1), max_size=2)) if j else ())
        # a root sums the input list, one input is incremented, two are summed
        g.node(f"n{j}", Inc(j) if len(preds) == 1 else Add())
        for i in preds:
            g.edge(f"n{i}", f"n{j}")
        g.place(f"n{j}", host=data.draw(st.sampled_from([LOCAL, "box", "box2"])))
    local, placed = run_both(g, [1, 2])
    assert placed == local


def test_metrics_and_watcher_events_come_back_from_another_host():
    rec = Recorder()
    g = Graph.somatize(Measure() >> Inc(), watchers=[rec]).place(
        "measure", host="box", device="cuda:3"
    )
    out = g.run(5, transports={"box": InProcess()})
    assert (out.value, out.metrics) == (6, {"measure": {"seen": 5, "device": "cuda:3"}})
    assert any(isinstance(e, Metrics) and e.node == "measure" for e in rec.events)
    assert {e.node for e in rec.events if isinstance(e, NodeEnd)} == {"measure", "inc"}


def test_injected_values_reach_nodes_on_another_host():
    class Read(Node):
        def forward(self, x, ctx):
            return Done([x, ctx.get("lr"), ctx.step, ctx.training])

    g = Graph.somatize(Read()).place("read", host="box")
    out = g.forward(1, step=3, training=True, values={"lr": 0.5}, transports={"box": InProcess()})
    assert out == [1, 0.5, 3, True]


def test_a_node_error_comes_back_unchanged_and_names_node_and_host():
    g = Graph.somatize(Inc() >> Boom()).place("boom", host="box")
    with pytest.raises(ZeroDivisionError, match="boom on 1") as info:
        g.forward(0, transports={"box": InProcess()})
    assert "raised by node 'boom' (Boom) on host 'box'" in info.value.__notes__


def test_no_transport_for_a_host_names_it_and_the_fix():
    g = Graph.somatize(Inc() >> Inc(2)).place("inc_2", host="gpu-box")
    with pytest.raises(TransportError, match=r"'inc_2'.*host 'gpu-box'.*transports=\{'gpu-box'"):
        g.forward(1)
    with pytest.raises(TransportError, match="gpu-box"):
        g.forward(1, transports={"other": InProcess()})


class _Replies:
    """A transport of one's own that replies ``reply`` (or what ``edit`` makes of a true one)."""

    def __init__(self, reply=None, edit=None):
        self.reply, self.edit = reply, edit

    def run(self, job, code):
        return self.edit(InProcess().run(job, code)) if self.edit else self.reply


@pytest.mark.parametrize(
    ("transport", "match"),
    [
        (_Replies(None), r"returned None, not a Reply"),
        (_Replies({}), r"replied without 'outputs', 'opaque'"),
        (_Replies(edit=lambda r: {**r, "outputs": {}}), r"no output of node 'inc_2'"),
        (_Replies(edit=lambda r: {**r, "outputs": {"inc_2": 3}}), r"'inc_2'.*int, not bytes"),
        (_Replies(edit=lambda r: {**r, "metrics": b"x"}), r"'metrics' that do not decode"),
    ],
)
def test_a_transport_of_ones_own_that_replies_garbage_is_named_with_the_slice(transport, match):
    # before: a bare TypeError / KeyError from inside the caller, naming neither
    g = Graph.somatize(Inc() >> Inc(2)).place("inc_2", host="gpu-box")
    with pytest.raises(TransportError, match=match) as info:
        g.forward(1, transports={"gpu-box": transport})
    assert "host 'gpu-box'" in str(info.value) and "_Replies" in str(info.value)


def test_a_transport_that_is_not_one_is_named_with_its_host_and_the_fix():
    g = Graph.somatize(Inc() >> Inc(2)).place("inc_2", host="gpu-box")
    with pytest.raises(
        TypeError, match=r"transports\['gpu-box'\] is the class InProcess.*InProcess\(\)"
    ):
        g.forward(1, transports={"gpu-box": InProcess})
    with pytest.raises(TypeError, match=r"transports\['gpu-box'\] is a str.*run\(job, code\)"):
        g.forward(1, transports={"gpu-box": "tcp://10.0.0.2:8786"})


# -- Opaque never crosses -----------------------------------------------------------------


def test_opaque_leaving_the_caller_names_the_edge_and_hosts():
    g = Graph.somatize(Wrap() >> Inc()).place("inc", host="box")
    with pytest.raises(
        CrossingError, match=r"'wrap'.*from host 'local' to host 'box'.*'wrap' -> 'inc'"
    ):
        g.forward(1, transports={"box": InProcess()})


def test_opaque_coming_back_names_the_edge_and_hosts():
    g = Graph.somatize(Wrap() >> Inc()).place("wrap", host="box")
    with pytest.raises(
        CrossingError, match=r"from host 'box' to host 'local'.*'wrap' -> 'inc'"
    ) as e:
        g.forward(1, transports={"box": InProcess()})
    assert isinstance(e.value, ValueConversionError)


def test_opaque_as_output_or_as_input_cannot_cross():
    g = Graph.somatize(Wrap()).place("wrap", host="box")
    with pytest.raises(CrossingError, match="graph's output"):
        g.forward(1, transports={"box": InProcess()})
    g = Graph.somatize(Inc()).place("inc", host="box")
    with pytest.raises(CrossingError, match=r"graph input.*edge input -> 'inc'"):
        g.forward(Opaque(1), transports={"box": InProcess()})


def test_opaque_inside_one_slice_is_fine():
    g = Graph.somatize(Wrap() >> Inc()).place("wrap", host="box").place("inc", host="box")
    assert g.forward(1, transports={"box": InProcess()}) == 2


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

    g = Graph.somatize(Inc() >> Bag({1, 2})).cache("bag").place("bag", host="box")
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
