"""Graph running on the hot and keyed paths: forks, roots and sinks, Opaque, node errors,
metrics, subgraphs, changes after a run, the runtime wrap and placement."""

from __future__ import annotations

from typing import Any

import pytest

from somatize import Ctx, Done, Graph, Node, NodeError, Opaque, Recorder, ValueConversionError
from somatize.watchers import CacheHit
from tests.graph_nodes import Add, Metric, Pair, Wrap

# The nodes count their calls in CALLS, which their keys cannot (and need not) see.
pytestmark = pytest.mark.filterwarnings("ignore:node class .* reads the global CALLS")


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
    cached = r"node 'tags' is cached or named, so its output is stored as data, but it retur"
    with pytest.raises(ValueConversionError, match=rf"{cached}ned a set.*sorted.*stop caching it"):
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
