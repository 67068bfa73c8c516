"""Running a placed graph through InProcess: results equal to one process, metrics, values
and errors coming back, transports that misbehave, and Opaque never crossing a host."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from somatize import Done, Graph, Node, Opaque, Recorder
from somatize.errors import CrossingError, TransportError, ValueConversionError
from somatize.placement import LOCAL, Placement
from somatize.transports import InProcess
from somatize.watchers import Metrics, NodeEnd
from tests.distribute_nodes import Add, Bag, Inc, Wrap


class Boom(Node):
    def forward(self, x, ctx):
        raise ZeroDivisionError(f"boom on {x}")


class Measure(Node):
    def forward(self, x, ctx):
        return Done(x, metrics={"seen": x, "device": ctx.device or ""})


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


@pytest.mark.parametrize(("far", "host"), [("bag", "box"), ("inc", LOCAL)])
def test_a_value_that_cannot_leave_its_host_is_said_to_need_data_not_opaque(far, host):
    g = Graph.somatize(Bag() >> Inc()).place(far, host="box")
    with pytest.raises(ValueConversionError, match="the output of node 'bag'") as e:
        g.forward(1, transports={"box": InProcess()})
    (note,) = e.value.__notes__[-1:]
    assert f"node 'bag' runs on host {host!r}" in note and "Opaque value cannot leave" in note
