"""The hot path (no cache, no watchers): no hashing, timing or notifying, checked by a
fixture that forbids them."""

from __future__ import annotations

from typing import Any

import pytest

import somatize
from somatize import Ctx, Done, Graph, Node, Opaque
from tests.graph_nodes import Add

# The nodes count their calls in CALLS, which their keys cannot (and need not) see.
pytestmark = pytest.mark.filterwarnings("ignore:node class .* reads the global CALLS")


# -- the hot path -------------------------------------------------------------------------


class _Forbidden:
    """Stands in for a hashing or timing function: any call fails the test."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the hot path called {self.what}")

    def __getattr__(self, name: str) -> Any:
        return _Forbidden(f"{self.what}.{name}")


@pytest.fixture
def no_hashing_or_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("values", "identity", "keepers.loose", "keepers.packs"):
        monkeypatch.setattr(f"somatize.{module}.blake3", _Forbidden(f"{module}.blake3"))
    for module in ("execute", "keyed", "graph", "graph_run", "topology", "memory", "identity"):
        monkeypatch.setattr(f"somatize.{module}.digest", _Forbidden(f"{module}.digest"))
    monkeypatch.setattr("somatize.memory.key", _Forbidden("memory.key"))
    monkeypatch.setattr("somatize.memory.NodeKeys.of", _Forbidden("NodeKeys.of"))
    monkeypatch.setattr("somatize.keyed.time", _Forbidden("keyed.time"))
    monkeypatch.setattr("somatize.graph_run.time", _Forbidden("graph_run.time"))
    monkeypatch.setattr("somatize.keyed.notify", _Forbidden("keyed.notify"))


@pytest.mark.usefixtures("no_hashing_or_timing")
def test_the_hot_path_does_no_hashing_timing_or_notifying() -> None:
    class Grow(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done(Opaque([*x, len(x)]))

    g = Graph.somatize(Grow() >> (Grow() | Grow()) >> Graph.somatize(Grow() >> Grow()))
    for _ in range(3):
        assert g.forward(Opaque([])) == [[0, 1], [0, 1], 2, 3]
    assert Graph.somatize(Add(1) >> Add(2)).forward(1) == 4  # data values: validated, not hashed


def test_the_forbidding_fixture_really_bites(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("somatize.execute.digest", _Forbidden("execute.digest"))
    monkeypatch.setattr("somatize.graph_run.digest", _Forbidden("graph_run.digest"))
    with pytest.raises(AssertionError, match=r"the hot path called graph_run\.digest"):
        Graph().node("a", Add(1)).cache("a").forward(1)
    assert somatize.values.digest(1)  # the real function was left alone
