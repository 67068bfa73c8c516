"""The state part of a node's key: what the node holds (``somatize/node_state.py``)."""

from __future__ import annotations

import argparse
from typing import Any

from somatize import Done, Graph, MemoryKeeper, Node
from somatize.node_state import state


class Settings:
    """A plain class of the user's own, held by a node (a config, a tokenizer)."""

    def __init__(self, lower: bool = True) -> None:
        self.lower = lower


class Slotted:
    __slots__ = ("lower",)

    def __init__(self, lower: bool = True) -> None:
        self.lower = lower


class Case(Node):
    def __init__(self) -> None:
        self.settings: Any = Settings()

    def forward(self, text: str, ctx: Any) -> Done:
        return Done(text.lower() if self.settings.lower else text)


def test_an_instance_of_a_users_class_enters_the_state_by_its_attributes() -> None:
    node = Case()
    g = Graph.somatize(node, keeper=MemoryKeeper()).cache("case")
    assert g.forward("AbC") == "abc"
    node.settings.lower = False  # changed in place: not the entry computed before
    assert g.forward("AbC") == "AbC"
    node.settings = Settings(lower=True)  # replaced: the first entry again
    assert g.forward("AbC") == "abc"
    node.settings = Slotted(lower=False)  # slots are attributes too
    assert g.forward("AbC") == "AbC"


def test_a_users_object_holding_itself_is_walked_once() -> None:
    node = Case()
    node.settings.me = node.settings
    before = state(node)
    assert state(node) == before
    node.settings.lower = False
    assert state(node) != before


class Configured(Node):
    """Holds a library's settings object it built (as a HuggingFace config is held)."""

    def __init__(self, scale: int) -> None:
        self.cfg = argparse.Namespace(scale=scale, name="x")

    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(x * self.cfg.scale)


def test_a_plain_setting_of_a_library_object_the_node_holds_enters_the_state() -> None:
    node = Configured(2)
    g = Graph(keeper=MemoryKeeper()).node("n", node).cache("n")
    assert g.forward(3) == 6
    node.cfg.scale = 5  # (model.config.output_hidden_states = True)
    assert g.forward(3) == 15


class Holder(Node):
    """A node whose state is made of exact parts (remembered, see ``state``) or not."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(x)


def test_a_state_remembered_by_its_parts_is_made_again_when_any_changes() -> None:
    """``state`` keeps the parts it encoded last time when they compare exactly (strings,
    ints, bools, None): each change, of value or of type alone, is a new state."""
    from somatize.node_state import Codes

    codes = Codes()
    node = Holder("a")
    seen = []
    for value in ["a", "b", 1, True, 1.0, -0.0, 0.0, 0, False, None, "a"]:
        node.value = value
        seen.append(state(node, (), None, codes))
        assert seen[-1] == state(node, (), None, codes) == state(node)  # (a fresh Codes)
    assert seen[0] == seen[-1]
    assert len(set(seen)) == len(seen) - 1  # every other pair differs


def test_a_dict_of_the_nodes_own_changed_in_place_is_a_new_state() -> None:
    """A part that is the node's own container is never remembered by reference."""
    from somatize.node_state import Codes

    codes = Codes()
    node = Holder({"fp": "x"})  # (shaped as a codec's part)
    first = state(node, (), None, codes)
    node.value["fp"] = "y"
    assert state(node, (), None, codes) != first == state(Holder({"fp": "x"}))


def test_an_immutable_value_that_is_no_plain_data_enters_by_value() -> None:
    """A Fraction, Decimal, complex, Path, date or compiled regex entered as None (no
    ``__dict__``, nothing held): two values shared the node's entries."""
    import datetime
    import decimal
    import fractions
    import pathlib
    import re

    pairs = [
        (fractions.Fraction(1, 2), fractions.Fraction(1, 3)),
        (decimal.Decimal("0.5"), decimal.Decimal("0.25")),
        (1 + 0j, 2 + 0j),
        (pathlib.Path("a.txt"), pathlib.Path("b.txt")),
        (datetime.date(2024, 1, 1), datetime.date(2024, 1, 2)),
        (re.compile("a+"), re.compile("a+", re.IGNORECASE)),
        (range(3), range(4)),
    ]
    for one, other in pairs:
        assert state(Holder(one)) == state(Holder(one))  # (by value, not identity)
        assert state(Holder(one)) != state(Holder(other)), one
    # a type kept apart: the same number as another type is not the same setting
    assert state(Holder(fractions.Fraction(1, 2))) != state(Holder(0.5))
    assert state(Holder(decimal.Decimal("0.5"))) != state(Holder(decimal.Decimal("0.50")))


def test_an_object_nothing_of_which_can_be_read_warns_and_enters_by_type() -> None:
    """A deque (no ``__dict__``, nothing held) entered as None, silently."""
    import collections

    import pytest

    class Queued(Holder):  # (a class of its own: the warning is said once per class)
        pass

    with pytest.warns(UserWarning, match=r"Queued' holds a collections.deque, which enters"):
        first = state(Queued(collections.deque([1])))
    assert state(Queued(collections.deque([2]))) == first  # (its content is not read)
    assert first != state(Queued(None))


def test_a_numpy_array_enters_by_content_without_a_numpy_codec() -> None:
    """A graph without ``somatize.torch``'s codecs: an array a node holds entered as
    None, so a write to it was not seen."""
    import pytest

    np = pytest.importorskip("numpy")
    node = Holder(np.zeros(3))
    first = state(node)
    node.value[0] = 1.0
    assert state(node) != first
    assert state(Holder(np.zeros(3, np.float32))) != state(Holder(np.zeros(3)))
    assert state(Holder(np.float64(0.5))) != state(Holder(np.float32(0.5)))


class Ratioed(Node):
    """A node class holding an immutable value that is no plain data (as read at import)."""

    RATIO: Any = None

    def forward(self, x: Any, ctx: Any) -> Done:
        return Done(x * float(self.RATIO))


def test_an_immutable_value_a_node_class_holds_enters_by_value() -> None:
    """A class's Fraction or numpy scalar was read by no codec and left out of the state:
    ``Ratioed.RATIO = Fraction(1, 3)`` shared the entries of ``Fraction(1, 2)``."""
    import fractions

    import numpy as np

    seen = []
    try:
        for value in (fractions.Fraction(1, 2), fractions.Fraction(1, 3), np.float64(0.5)):
            Ratioed.RATIO = value
            seen.append(state(Ratioed()))
            assert state(Ratioed()) == seen[-1]
    finally:
        Ratioed.RATIO = None
    assert len(set(seen)) == 3
