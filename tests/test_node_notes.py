"""The note a node's error carries (``somatize/node_notes.py``), on both paths."""

from __future__ import annotations

from typing import Any

import pytest

from somatize import Ctx, Done, Graph, Node, Pick, Recorder


class Inc(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x + 1)


class Same(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(x)


class Join(Node):
    """Meant to follow a fork: unpacks its two inputs."""

    def forward(self, xs: Any, ctx: Ctx) -> Done:
        a, b = xs
        return Done(a + b)


def _watched(path: str) -> list[Recorder]:
    return [Recorder()] * (path == "keyed")  # a watcher: the keyed path


@pytest.mark.parametrize("path", ["hot", "keyed"])
def test_a_join_fed_one_branch_by_precedence_is_told_how_python_groups_the_operators(
    path: str,
) -> None:
    # meant as Same() >> (Same() | Same()) >> Join(): Join follows 'c' alone, and unpacking
    # its [0, 1, 2] fails (a batch of two rows would unpack, and say nothing)
    g = Graph.somatize(Same() >> Same() | Same().with_id("c") >> Join(), watchers=_watched(path))
    assert g.topology.roots == ("same", "c") and g.topology.sinks == ("same_2", "join")
    with pytest.raises(ValueError, match="too many values to unpack") as info:
        g.forward([0, 1, 2])  # (a list: c's output is one too)
    assert info.value.__notes__ == [
        "raised by node 'join' (Join); its input x was the output of 'c' alone (a node "
        "receives one tuple only where several edges enter it), in a graph of 2 roots "
        "('same', 'c') and 2 outputs ('same_2', 'join'): if 'join' should join branches, "
        "mind Python's precedence — a >> b | c >> d is (a >> b) | (c >> d), where d "
        "follows c alone; write a >> (b | c) >> d"
    ]


@pytest.mark.parametrize("path", ["hot", "keyed"])
def test_a_tower_of_a_joined_graph_failing_is_not_told_about_precedence(path: str) -> None:
    # two roots, one output: the towers' inputs are their own, and no join is misfed
    g = Graph.somatize(
        ((Pick(0) >> Inc()) | (Pick(1) >> Inc().with_id("other"))) >> Join(),
        watchers=_watched(path),
    )
    with pytest.raises(TypeError) as info:
        g.forward(1, "a")
    assert info.value.__notes__ == ["raised by node 'other' (Inc)"]


@pytest.mark.parametrize("path", ["hot", "keyed"])
def test_a_chain_of_one_root_failing_is_not_told_about_precedence(path: str) -> None:
    g = Graph.somatize(Inc() >> Join(), watchers=_watched(path))
    with pytest.raises(TypeError) as info:
        g.forward(1)
    assert info.value.__notes__ == ["raised by node 'join' (Join)"]
