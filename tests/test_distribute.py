"""distribute(): slices and crossings, and how to_text / to_mermaid render them."""

import pytest

from somatize import Done, Graph, Node, Topology
from somatize.errors import GraphError
from somatize.placement import LOCAL, Placement
from somatize.plan import Crossing, Slice, compile, distribute
from tests.distribute_nodes import Inc


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
    with pytest.raises(GraphError, match=r"'sub'.*place the subgraph node itself.*'id', host='l"):
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
