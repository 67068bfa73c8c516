"""The declaration part of a node's key: its constructor arguments (``somatize/declaration.py``)."""

from __future__ import annotations

import dataclasses
import enum
import threading
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
