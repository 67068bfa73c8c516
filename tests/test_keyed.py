"""The keyed walk (``somatize/keyed.py``): what it says about nodes whose keys it makes."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from somatize import Ctx, Done, Graph, MemoryKeeper, Node
from somatize.cache_warnings import ctx_reads


class AtLeast(Node):
    """Reads an injected value: a threshold that no key holds."""

    def forward(self, xs: Any, ctx: Ctx) -> Done:
        return Done([x for x in xs if x >= ctx.get("min", 0)])


class Sum(Node):
    def forward(self, xs: Any, ctx: Ctx) -> Done:
        return Done(sum(xs))


class Named(Node):
    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(f"{ctx.node} on {ctx.device}: {x}")  # (neither changes the output's key)


class Late(Node):
    def forward(self, xs: Any, ctx: Ctx) -> Done:
        return Done([x + ctx.step for x in xs] if ctx.training else list(xs))


class Drop(Node):
    def forward(self, xs: Any, ctx: Ctx) -> Done:
        return Done([0 for _ in xs] if ctx.training else list(xs))


def test_a_cached_node_or_one_feeding_it_that_reads_ctx_warns_naming_what() -> None:
    g = Graph.somatize(AtLeast() >> Sum(), keeper=MemoryKeeper()).cache("sum")
    with pytest.warns(
        UserWarning, match=r"node 'at_least' \(AtLeast\) is cached or feeds .*ctx\.get"
    ):
        g.forward([1, 2, 3], values={"min": 2})


def test_what_ctx_reads_are_found_and_which_are_harmless() -> None:
    assert ctx_reads(AtLeast) == {"get"}
    assert ctx_reads(Late) == {"step", "training"}  # (inside a comprehension too)
    assert ctx_reads(Named) == frozenset()
    g = Graph.somatize(Late(), keeper=MemoryKeeper()).cache("late")
    with pytest.warns(UserWarning, match=r"reads ctx\.step, ctx\.training"):
        g.forward([1], training=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Graph.somatize(Named(), keeper=MemoryKeeper()).cache("named").forward(1)
        Graph.somatize(AtLeast() >> Sum()).forward([1, 2])  # nothing cached: no key, fine
        frozen = Graph.somatize(Drop(), keeper=MemoryKeeper()).cache("drop").freeze("drop")
        frozen.forward([1], training=True)  # a frozen node's ctx.training is always False
        Graph.somatize(Drop(), keeper=MemoryKeeper()).cache("drop").forward([1])  # (eval)


def test_a_warning_raised_inside_model_x_points_at_the_users_line_not_torchs():
    """model(x) goes through nn.Module.__call__ before somatize: outside() skips torch's
    frames too (and Lightning's, whose hooks call LightningGraph)."""
    torch = pytest.importorskip("torch")
    import somatize.torch as st

    class Stepper(Node):
        def forward(self, x, ctx):
            return Done(x * (1 + 0 * ctx.step))

    g = Graph.somatize(Stepper().with_id("s"))
    g.cache("s")
    model = st.module(g)
    with pytest.warns(UserWarning, match=r"node 's' \(.*Stepper\) is cached") as said:
        model(torch.ones(2, 3))
    assert said[0].filename == __file__
