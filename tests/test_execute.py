"""The program a graph runs: built from its topology without a ``Plan`` (made when asked),
equal to one built from the plan; the hot path's value slots, against a hand-written walk."""

from __future__ import annotations

from typing import Any

import pytest

import somatize.plan as plan_module
from somatize import Done, EmptyGraphError, Graph, Node, Opaque, Recorder, Run, ValueConversionError
from somatize.catalog import Catalog
from somatize.execute import Program


class Add(Node):
    def __init__(self, k: int) -> None:
        self.k = k

    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(x + self.k)


class Pair(Node):
    """Records what it received, in order (several inputs arrive as a tuple)."""

    def forward(self, xs: Any, ctx: Any) -> Done:
        return Done(Opaque(("pair", ctx.node, xs)))


def diamond() -> Graph:
    """Two roots, a node with three inputs (one of them the same root twice removed), a
    node fed by a later-added node, and two sinks."""
    g = Graph()
    for node, impl in [
        ("r1", Add(1)),
        ("r2", Add(10)),
        ("late", Add(100)),
        ("mix", Pair()),
        ("tail", Add(1000)),
    ]:
        g.node(node, impl)
    g.edge("r2", "late").edge("r1", "mix").edge("late", "mix").edge("r2", "mix")
    g.edge("late", "tail")
    return g


def walk_by_hand(x: int) -> Any:
    r1, r2 = x + 1, x + 10
    late = r2 + 100
    return ("pair", "mix", (r1, late, r2)), late + 1000


def test_a_run_reads_each_input_from_its_slot_in_edge_order() -> None:
    g = diamond()
    assert g.forward(5) == walk_by_hand(5)
    assert g.forward(5, training=True) == walk_by_hand(5)
    g.watchers.append(Recorder())  # the keyed path (a watcher listens) agrees
    assert g.forward(7) == walk_by_hand(7)


def test_the_graphs_program_makes_its_plan_only_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Graph.program()`` builds the hot path from the topology: no ``compile``, no ``Step``
    objects, until ``program.plan`` is read; then once, equal to ``g.plan()``."""
    compiled: list[int] = []
    real = plan_module.compile

    def counting(*args: Any, **kwargs: Any) -> Any:
        compiled.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr("somatize.execute.compile", counting)
    g = diamond()
    program = g.program()
    assert g.forward(1) == walk_by_hand(1)
    assert compiled == []
    assert program.plan == g.plan() and program.plan is program.plan
    assert compiled == [1]


def test_a_program_from_a_plan_equals_the_one_from_its_topology() -> None:
    g = diamond()
    ours = g.program()
    theirs = Program(g.plan(), Catalog(g._impls), g.memory, g.codecs, {})
    strip = [(n, one, many, device) for n, _, one, many, device in ours.fast]
    assert strip == [(n, one, many, device) for n, _, one, many, device in theirs.fast]
    assert ours.steps == theirs.steps == [(s.node, s.inputs) for s in g.plan().steps]
    assert ours.output == theirs.output == ("mix", "tail")
    assert theirs.run_fast(2, Run())[0] == walk_by_hand(2) == ours.run_fast(2, Run())[0]


def test_an_empty_graph_still_fails_when_its_program_is_built() -> None:
    with pytest.raises(EmptyGraphError, match="no nodes"):
        Graph().program()


class Leak(Node):
    """Returns an object as data instead of wrapping it in Opaque."""

    def forward(self, x: Any, ctx: Any) -> Done:
        return Done({"kept": object()})


def test_a_node_output_that_is_not_data_is_named_by_the_node_on_the_hot_path() -> None:
    g = Graph.somatize(Add(1) >> Leak().with_id("leak"))
    with pytest.raises(ValueConversionError) as caught:
        g.forward(1)
    message = str(caught.value)
    assert message.startswith("the output of node 'leak' at ['kept']"), message
    assert not isinstance(caught.value.__context__, ValueConversionError)  # raised once
