"""The counting nodes the Graph tests share (tests/test_graph_*.py): Add and Wrap count
their calls in CALLS, which the autouse fixture ``_reset_calls`` clears before each test of
a module that imports it."""

from __future__ import annotations

import collections
from typing import Any

import pytest

from somatize import Ctx, Done, Node, Opaque

CALLS: collections.Counter[str] = collections.Counter()  # kept outside nodes: not their state


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
