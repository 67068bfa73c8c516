"""What the key tests share (tests/test_identity*.py): the Embed node, node_key (a node's
key under NodeKeys) and the type of the user_module fixture."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from somatize import Ctx, Done, Node
from somatize.memory import NodeKeys

Writer = Callable[[str, str], ModuleType]


class Embed(Node):
    def __init__(self, dim: int = 5, *, scale: float = 1.0) -> None:
        self.dim = dim
        self.scale = scale

    def forward(self, x: Any, ctx: Ctx) -> Done:
        return Done([x] * self.dim)


def node_key(impl: Any, preds: tuple[str, ...] = ("in",), codecs: Any = ()) -> str:
    return NodeKeys(codecs).of(impl, list(preds))
