"""Keys: declaration (arguments): bound with defaults, nodes and functions by what they are,
lambdas, factory classes, and arguments that cannot be declared."""

from __future__ import annotations

from typing import Any

import pytest

from somatize import Ctx, DeclarationError, Done, Graph, Node
from somatize.declaration import declaration
from somatize.identity import identity
from tests.identity_nodes import Embed, node_key


class Apply(Node):
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done(self.fn(x))


# -- declaration --------------------------------------------------------------------------


def test_different_arguments_give_different_keys() -> None:
    assert declaration(Embed(512)) != declaration(Embed(64))
    assert node_key(Embed(512)) != node_key(Embed(64))
    assert node_key(Embed(5, scale=2.0)) != node_key(Embed(5))


def test_arguments_are_bound_with_defaults_applied() -> None:
    assert declaration(Embed(5)) == declaration(Embed(dim=5)) == declaration(Embed())
    assert node_key(Embed(5)) == node_key(Embed(dim=5))


def test_node_and_function_arguments_enter_by_what_they_are() -> None:
    class Wrap(Node):
        def __init__(self, inner: Node) -> None:
            self.inner = inner

    assert declaration(Wrap(Embed(1))) != declaration(Wrap(Embed(2)))
    assert declaration(Wrap(Embed(1))) == declaration(Wrap(Embed(1)))

    def double(x: int) -> int:
        return 2 * x

    def triple(x: int) -> int:
        return 3 * x

    assert declaration(Apply(double)) != declaration(Apply(triple))
    assert declaration(Apply(len)) != declaration(Apply(abs))


def test_lambdas_written_on_one_line_are_told_apart() -> None:
    a, b = Apply(lambda x: x + 1), Apply(lambda x: x * 10)
    assert declaration(a) != declaration(b)
    g = Graph.somatize(Apply(lambda x: x + 1) | Apply(lambda x: x * 10))
    g.cache("apply").cache("apply_2")
    assert g.forward(2) == (3, 20)
    k = 3
    assert declaration(Apply(lambda x: x + k)) == declaration(Apply(lambda x: x + k))


def test_classes_made_by_a_factory_differ_by_their_closure() -> None:
    def make(k: int) -> type[Node]:
        class Mul(Node):
            def forward(self, x: Any, ctx: Ctx) -> Done:
                return Done(x * k)

        return Mul

    assert identity(make(2)()) != identity(make(3)())
    assert identity(make(2)()) == identity(make(2)())
    g = Graph.somatize(make(2)() | make(3)())
    g.cache("mul").cache("mul_2")
    assert g.forward(5) == (10, 15)


def test_an_undeclarable_argument_fails_only_when_a_key_is_needed() -> None:
    class Bag(Node):
        def __init__(self, items: Any) -> None:
            self.items = items

        def forward(self, x: Any, ctx: Ctx) -> Done:
            return Done(x)

    assert Graph().node("bag", Bag(iter([1, 2]))).forward(1) == 1  # uncached: no key, runs fine
    g = Graph().node("bag", Bag(iter([1, 2]))).cache("bag")
    with pytest.raises(DeclarationError) as info:
        g.forward(1)
    msg = str(info.value)
    assert "node 'bag'" in msg and "'items' of" in msg and "list_iterator" in msg
    assert "do not cache" in msg
    with pytest.raises(DeclarationError, match=r"dict key \(1, 2\).*str or int"):
        Graph().node("bag", Bag({(1, 2): 3})).cache("bag").forward(1)
    # an uncached node feeding a cached one needs a key too
    g = Graph.somatize(Bag(object()) >> Embed(1)).cache("embed")
    with pytest.raises(DeclarationError, match=r"node 'bag' needs a key .*feeds"):
        g.forward(1)
    assert isinstance(info.value, TypeError)
