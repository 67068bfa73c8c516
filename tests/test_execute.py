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


class Seen(Node):
    """Returns its input, its Ctx kept in ``seen`` (Opaque: passed as it is)."""

    def __init__(self, seen: list[Any]) -> None:
        self.seen = seen

    def forward(self, x: Any, ctx: Any) -> Done:
        self.seen.append(ctx)
        return Done(Opaque(x))


def test_steps_bound_to_a_run_serve_the_runs_alike_with_the_same_ctx() -> None:
    """``bound(run)``: None on a first run, the steps with their ``Ctx`` made once from the
    second equal run on (what ``module(g)`` runs at one step and mode), again None when the
    run moves; a run on them computes what one without them does."""
    seen: list[Any] = []
    g = Graph()
    g.node("a", Seen(seen)).node("b", Add(1)).node("c", Seen(seen)).edge("a", "b").edge("b", "c")
    program = g.program()
    run = Run("r", 3, True)
    assert program.bound(run) is None  # (the first: nothing made ahead)
    steps = program.bound(Run("r", 3, True))  # an equal run: bound
    assert steps is not None and program.bound(run) is steps
    for _ in range(2):
        assert program.run_fast(1, run, steps) == (2, {})
    assert [c.node for c in seen] == ["a", "c"] * 2
    assert seen[0] is seen[2] and seen[1] is seen[3]  # the same Ctx: made once
    assert seen[0] == ("a", None, run)
    assert program.bound(Run("r", 4, True)) is None  # another step: made as the run goes
    assert program.run_fast(1, Run("r", 4, True)) == (2, {})
    assert [c.step for c in seen[4:]] == [4, 4]
    assert program.bound(Run("r", 3, True, {"k": 1})) is None  # other values: not the same


def test_a_join_reads_its_inputs_in_order_whether_their_slots_follow_or_not() -> None:
    """A fork's branches joined sit in slots that follow one another (read as one slice);
    the diamond's ``mix`` reads slots out of order: each gets its inputs in edge order."""
    fork = Graph.somatize(Add(0) >> (Add(1) | Add(2) | Add(3)) >> Pair().with_id("join"))
    many = {node: many for node, _, _, many, _ in fork.program().fast}
    assert type(many["join"]) is slice
    assert fork.forward(10) == ("pair", "join", (11, 12, 13))
    assert type({n: m for n, _, _, m, _ in diamond().program().fast}["mix"]) is tuple
    for program in (fork.program(), diamond().program()):
        run = Run()
        program.bound(run)
        steps = program.bound(run)
        assert program.run_fast(10, run, steps) == program.run_fast(10, run)
