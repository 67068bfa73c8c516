"""Plan: steps in a topological order, stages of independent steps, subgraphs as sub-plans."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings

from somatize import Ctx, Done, EmptyGraphError, Graph, Node, Placement, Topology
from somatize.plan import compile
from tests.test_topology import dags


@settings(max_examples=300)
@given(dags())
def test_plan_order_respects_every_edge_and_stages_are_independent(t: Topology) -> None:
    plan = compile(t)
    position = {s.node: i for i, s in enumerate(plan.steps)}
    assert sorted(position) == sorted(t.nodes)  # every node exactly once
    for a, b in t.edges:
        assert position[a] < position[b]
    stage_of = {}
    flat = [i for stage in plan.stages for i in stage]
    assert flat == list(range(len(plan.steps)))  # stages partition the steps, in order
    for n, stage in enumerate(plan.stages):
        for i in stage:
            stage_of[plan.steps[i].node] = n
    for a, b in t.edges:
        assert stage_of[a] < stage_of[b]  # never two dependent steps in one stage
    for s in plan.steps:
        assert s.inputs == t.predecessors(s.node)
        assert all(stage_of[i] < stage_of[s.node] for i in s.inputs)
    assert set(plan.output) == {n for n in t.nodes if not t.successors(n)}


def test_compile_example_and_lookup() -> None:
    t = Topology(("a", "b", "c", "d"), (("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")))
    plan = compile(t)
    assert [s.node for s in plan.steps] == ["a", "b", "c", "d"]
    assert plan.stages == ((0,), (1, 2), (3,))
    assert plan.step("d").inputs == ("b", "c")
    assert plan.output == ("d",)
    assert len(plan) == 4
    with pytest.raises(KeyError):
        plan.step("zz")


def test_an_empty_topology_does_not_compile() -> None:
    with pytest.raises(EmptyGraphError):
        compile(Topology(()))
    with pytest.raises(EmptyGraphError, match="no nodes"):
        Graph().forward(1)


def test_hosts_shape_steps_devices_do_not() -> None:
    t = Topology(("a", "b"), (("a", "b"),))
    plain = compile(t)
    on_gpu = compile(t, Placement().place("a", device="cuda"))
    assert [(s.node, s.inputs, s.host) for s in plain.steps] == [
        (s.node, s.inputs, s.host) for s in on_gpu.steps
    ]
    remote = compile(t, Placement().place("b", host="box"))
    assert [s.host for s in remote.steps] == ["local", "box"]


class Add(Node):
    def __init__(self, n: int) -> None:
        self.n = n

    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x + self.n)


class Sum(Node):
    def forward(self, xs: Any, ctx: Ctx) -> Done:
        return Done(sum(xs))


def test_a_subgraph_is_one_step_with_its_own_plan() -> None:
    inner = Graph.somatize(Add(1) >> (Add(10) | Add(100)) >> Sum())
    g = Graph()  # the graph is used as a node
    g.node("pre", Add(2)).node("block", inner).node("post", Add(3))
    g.edge("pre", "block").edge("block", "post")
    plan = g.plan()
    assert [s.node for s in plan.steps] == ["pre", "block", "post"]  # not flattened
    block = plan.step("block")
    assert block.plan is not None
    assert [s.node for s in block.plan.steps] == ["add", "add_2", "add_3", "sum"]
    assert block.plan.stages == ((0,), (1, 2), (3,))
    assert plan.step("pre").plan is None
    assert g.topology.subgraphs["block"] == inner.topology

    def by_hand(x: int) -> int:
        h = x + 2
        h = h + 1
        return (h + 10) + (h + 100) + 3

    for x in (0, 5, -7):
        assert g.forward(x) == by_hand(x)


def test_nested_subgraphs_decompose_at_every_level() -> None:
    deepest = Graph.somatize(Add(1) >> Add(1))
    middle = Graph().node("deepest", deepest)
    g = Graph().node("middle", middle)
    step = g.plan().step("middle")
    assert step.plan is not None
    inner = step.plan.step("deepest")
    assert inner.plan is not None and [s.node for s in inner.plan.steps] == ["add", "add_2"]
    assert g.forward(1) == 3
