"""The declaration part of a node's key: its constructor arguments (``somatize/declaration.py``)."""

from __future__ import annotations

import dataclasses
import enum
import os
import pathlib
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from typing import Any

import pytest

from somatize import DeclarationError, Done, Graph, MemoryKeeper, Node
from somatize.memory import NodeKeys


@dataclasses.dataclass(frozen=True)
class CleanConfig:
    lower: bool = True
    strip: str = " "


class Mode(enum.Enum):
    FAST = 1
    EXACT = 2


class Options:
    def __init__(self, mode: Mode, lock: Any = None) -> None:
        self.mode = mode
        self.lock = lock


class Clean(Node):
    def __init__(self, config: Any) -> None:
        self.config = config

    def forward(self, text: str, ctx: Any) -> Done:
        return Done(text.strip(self.config.strip).lower() if self.config.lower else text)


def key_of(node: Node) -> str:
    return NodeKeys().of(node, ["input"])


def test_a_dataclass_or_instance_of_a_users_class_is_declared_by_its_fields() -> None:
    assert key_of(Clean(CleanConfig())) == key_of(Clean(CleanConfig()))
    assert key_of(Clean(CleanConfig())) != key_of(Clean(CleanConfig(lower=False)))
    assert key_of(Clean(Options(Mode.FAST))) == key_of(Clean(Options(Mode.FAST)))
    assert key_of(Clean(Options(Mode.FAST))) != key_of(Clean(Options(Mode.EXACT)))
    g = Graph.somatize(Clean(CleanConfig(strip=" ")), keeper=MemoryKeeper()).cache("clean")
    assert g.forward(" AbC ") == g.forward(" AbC ") == "abc"


def test_an_argument_holding_what_cannot_be_written_down_names_the_attribute() -> None:
    with pytest.raises(DeclarationError, match=r"'config' of Clean .*\.lock .*lock"):
        key_of(Clean(Options(Mode.FAST, lock=threading.Lock())))


class Hold(Node):
    def __init__(self, value: Any) -> None:
        self.value = value

    def forward(self, x: Any, ctx: Any) -> Done:
        return Done([x, len(self.value)])


def test_library_values_whose_content_says_all_are_declared_with_their_type() -> None:
    """Found by a review: a cached node given an OrderedDict, a set of stop words, a range
    or a library's tuple type (torch.Size, time.struct_time) raised DeclarationError."""
    stamp = time.gmtime(0)  # a tuple type of the standard library
    assert key_of(Hold(stamp)) == key_of(Hold(time.gmtime(0)))
    assert key_of(Hold(stamp)) != key_of(Hold(time.gmtime(1)))
    assert key_of(Hold(stamp)) != key_of(Hold(tuple(stamp)))  # its type is part of it
    ordered = OrderedDict(a=1, b=[2, 3])
    assert key_of(Hold(ordered)) == key_of(Hold(OrderedDict(a=1, b=[2, 3])))
    assert key_of(Hold(ordered)) != key_of(Hold(OrderedDict(b=[2, 3], a=1)))  # order kept
    assert key_of(Hold(ordered)) != key_of(Hold(dict(ordered)))
    with pytest.raises(DeclarationError, match=r"dict key \(1, 2\)"):
        key_of(Hold(OrderedDict([((1, 2), 3)])))
    words = {"the", "a", "of"}
    assert key_of(Hold(words)) == key_of(Hold({"of", "a", "the"}))
    assert key_of(Hold(words)) != key_of(Hold({"the", "a"}))
    assert key_of(Hold(words)) != key_of(Hold(frozenset(words)))
    assert key_of(Hold(range(3))) == key_of(Hold(range(0, 3, 1))) != key_of(Hold(range(4)))
    assert key_of(Hold(1 + 2j)) != key_of(Hold(1 + 2.5j))
    keeper = MemoryKeeper()
    g = Graph.somatize(Hold(words), keeper=keeper).cache("hold")
    assert g.forward("x") == g.forward("x") == ["x", 3]
    assert keeper.stats().entries == 1


def test_a_set_is_keyed_the_same_in_every_process() -> None:
    """A set's order follows str hashing, which differs from process to process
    (PYTHONHASHSEED): its items enter in the order of their keys."""
    code = (
        "from somatize.memory import NodeKeys; import sys; sys.path.insert(0, 'tests');"
        "from test_declaration import Hold; words = {'the', 'a', 'of', 'and', 'to'};"
        "print(NodeKeys().of(Hold(words), ['input']), list(words))"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split(" ", 1)
        for seed in (1, 2, 3, 4)
    ]
    assert len({order for _, order in runs}) > 1  # the set's own order did differ
    assert len({key for key, _ in runs}) == 1


def test_a_path_is_refused_saying_its_key_would_not_follow_the_file() -> None:
    with pytest.raises(DeclarationError, match=r"'value' of Hold is a path .*file's content"):
        key_of(Hold(pathlib.Path("vocab.txt")))


def test_builtin_methods_bound_to_different_strings_are_different_nodes() -> None:
    """Found by an outside audit: ``"a-{}".format`` and ``"b-{}".format`` were keyed by
    their name alone, so two different nodes shared one entry."""

    class Apply(Node):
        def __init__(self, fn: Any) -> None:
            self.fn = fn

        def forward(self, x: Any, ctx: Any) -> Done:
            return Done(self.fn(x))

    keeper = MemoryKeeper()
    outs = [
        Graph(keeper=keeper).node("n", Apply(f.format)).cache("n").forward("x")
        for f in ("a-{}", "b-{}")
    ]
    assert outs == ["a-x", "b-x"]
    table = {"x": 1}
    node = Apply(table.get)  # as an attribute: its object read at every key
    g = Graph(keeper=keeper).node("n", node).cache("n")
    assert g.forward("x") == 1
    table["x"] = 7
    assert g.forward("x") == 7
