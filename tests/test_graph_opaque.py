"""Opaque values and the cache: what a cached or named node refuses, and what still caches
(recipe keys through Opaque, Opaque around data)."""

from __future__ import annotations

from typing import Any

import pytest

from somatize import CacheError, Ctx, Done, Graph, Node, Opaque, Recorder, decode
from tests.graph_nodes import (
    CALLS,
    Add,
    Unwrap,
    Wrap,
    _reset_calls,  # noqa: F401 (an autouse fixture)
)

# The nodes count their calls in CALLS, which their keys cannot (and need not) see.
pytestmark = pytest.mark.filterwarnings("ignore:node class .* reads the global CALLS")


# -- Opaque and the cache -----------------------------------------------------------------


def test_a_cached_node_with_an_opaque_input_names_both_nodes() -> None:
    g = Graph.somatize(Wrap() >> Unwrap()).cache("unwrap")
    with pytest.raises(CacheError) as info:
        g.forward(1)
    msg = str(info.value)
    assert "node 'unwrap' is cached" in msg and "from node 'wrap' is Opaque" in msg
    assert "stop caching 'unwrap'" in msg
    with pytest.raises(
        CacheError, match=r"its input, the graph input, is Opaque.*pass data as the"
    ):
        Graph().node("a", Unwrap()).cache("a").forward(Opaque([1]))


def test_a_cached_node_below_an_opaque_graph_input_raises_instead_of_a_blind_key() -> None:
    class Len(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done(len(x))

    g = Graph.somatize(Len() >> Add(0)).cache("add")
    with pytest.raises(CacheError) as info:
        g.forward(Opaque([1, 2, 3]))
    msg = str(info.value)
    assert "node 'add' is cached or named but has no key" in msg
    assert "the graph input is Opaque" in msg
    assert "stop caching 'add'" in msg
    g = Graph().node("len", Len()).node("blk", Graph().node("a", Add(0)).cache("a"))
    g.edge("len", "blk")
    with pytest.raises(
        CacheError,
        match=r"node 'blk/a' is cached or named but has no key: upstream, the graph input",
    ):
        g.forward(Opaque([1]))
    # uncached, the same graphs run; and a cached mapped node keys its items by content
    assert Graph.somatize(Len() >> Add(0)).forward(Opaque([1, 2])) == 2

    class AsData(Node):
        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done(list(x))

    g = Graph.somatize(AsData() >> Len().mapped()).cache("len")
    assert g.forward(Opaque([[1], [2, 3]])) == [1, 2]


def test_recipe_keys_run_through_opaque_values_between_data() -> None:
    # Wrap returns Opaque, Unwrap turns it back into data: the key of what follows is the
    # recipe (code, arguments, state, input content), so it caches and is never stale.
    g = Graph.somatize(Wrap() >> Unwrap() >> Add(0) >> Add(1, "tail")).cache("add_2")
    seen = Recorder()
    g.watchers.append(seen)
    before = CALLS["tail"]
    assert g.forward(1) == 2 and g.forward(1) == 2
    assert CALLS["tail"] == before + 1  # the second run was a hit
    assert g.forward(5) == 6  # another input, another key: no stale value
    assert [type(e).__name__ for e in seen.events if "Cache" in type(e).__name__] == [
        "CacheMiss",
        "CacheHit",
        "CacheMiss",
    ]


class Hold(Node):
    """Returns Opaque around something that is not data."""

    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(Opaque(object()))


def test_a_cached_or_named_node_returning_opaque_that_is_not_data_raises() -> None:
    for setting in ("cache", "name"):
        g = Graph().node("h", Hold())
        if setting == "cache":
            g.cache("h")
        else:
            g.name("h", "held")
        with pytest.raises(
            CacheError,
            match="node 'h' is cached or named, so its output is stored as data, but it "
            "returned an object of type object; convert it to plain data",
        ):
            g.forward(1)
    with pytest.raises(CacheError, match="returned Opaque holding a object for item 0"):
        Graph().node("h", Hold().mapped()).cache("h").forward([1])


def test_a_cached_node_returning_opaque_around_data_stores_the_data() -> None:
    # caching was asked for: a frozen encoder written to return Opaque still caches
    g = Graph().node("w", Wrap()).cache("w").name("w", "wrapped")
    assert g.forward(1) == [1] and g.forward(1) == [1]
    assert CALLS["wrap"] == 1
    assert g.keeper is not None and decode(g.keeper.lookup("wrapped")) == [1]
    m = Graph().node("w", Wrap().mapped()).cache("w")
    assert m.forward([1, 2]) == [[1], [2]] and m.forward([2, 3]) == [[2], [3]]
    assert CALLS["wrap"] == 1 + 3


def test_uncached_nodes_after_opaque_run_fine_with_a_cache_elsewhere() -> None:
    g = Graph.somatize(Add(1) >> Wrap() >> Unwrap()).cache("add")
    assert g.forward(1) == 2 and g.forward(1) == 2
    assert CALLS["wrap"] == 2
