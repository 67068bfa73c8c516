"""What ``module(g)`` registers of each node, and what registering costs per node in
counts that do not depend on the machine: Python calls, not time."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from torch import nn

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import StateError
from somatize.torch import freezers


class Lin(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(2, 2)
        self.width = 2  # (plain settings are passed over)

    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(Opaque(self.lin(x)))


def chain(n: int) -> Graph:
    e: Any = Lin()
    for _ in range(n - 1):
        e = e >> Lin()
    return Graph.somatize(e)


def python_calls(fn: Any) -> int:
    """The Python functions ``fn()`` calls, at any depth (C functions not counted)."""
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        calls += event == "call"

    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def test_module_of_a_chain_makes_two_python_calls_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    # one to walk the node's attributes, one to make its holdings (a dict display); was 5:
    # the check for cached nodes holding a Carry also looked up every node (g[id] and
    # memory.remembers) in a graph that caches none. (As in a process that never froze a
    # parameter: once one did, every registration also walks every parameter.)
    monkeypatch.setattr(freezers, "_marked", [False])
    small, large = chain(100), chain(300)
    per_node = (
        python_calls(lambda: st.module(large)) - python_calls(lambda: st.module(small))
    ) / 200
    assert per_node < 2.5  # (a stray call or two: a collector's callback)
    m = st.module(large)
    assert len(dict(m.named_children())) == 300 and len(list(m.parameters())) == 600


def test_a_node_s_holdings_hold_its_modules_in_attribute_order() -> None:
    class Two(Node):
        def __init__(self) -> None:
            self.b = nn.Linear(2, 2)
            self.scale = nn.Parameter(torch.ones(2))
            self.a = nn.Linear(2, 2)
            self.blocks = [nn.Linear(2, 2)]
            self._somatize_note = nn.Linear(2, 2)  # somatize's own: never registered

        def forward(self, x: Any, ctx: Any) -> Done:
            return Done(Opaque(self.a(self.b(x)) * self.scale + self.blocks[0](x)))

    node = Two()
    held = dict(st.module(Graph.somatize(node.with_id("two"))).named_children())["two"]
    assert list(held._modules) == ["b", "a", "blocks"]
    assert held.b is node.b and held.a is node.a and getattr(held.blocks, "0") is node.blocks[0]
    assert list(held._parameters) == ["scale"] and held.scale is node.scale


@pytest.mark.parametrize("name", ["training", "_modules", "forward"])
def test_a_module_held_under_a_name_every_module_has_is_refused(name: str) -> None:
    class Odd(Node):
        def forward(self, x: Any, ctx: Any) -> Done:
            return Done(x)

    node = Odd()
    vars(node)[name] = nn.Linear(2, 2)
    with pytest.raises(StateError, match=rf"attribute '{name}'.*rename the attribute"):
        st.module(Graph.somatize(node.with_id("odd")))
