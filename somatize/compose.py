"""The one mixin: ``>>`` and ``|`` for Node, Graph and Expr (``somatize/dsl.py`` builds them).

It supplies operators only, no behaviour, so three classes share four methods instead of
writing them three times.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .dsl import Expr

__all__ = ["Composable"]


class Composable:
    """``a >> b`` (sequence) and ``a | b`` (fork) on anything that can be a graph's part."""

    __slots__ = ()

    def __rshift__(self, other: Any) -> Expr:
        from .dsl import seq

        return seq(self, other)

    def __rrshift__(self, other: Any) -> Expr:
        from .dsl import seq

        return seq(other, self)

    def __or__(self, other: Any) -> Expr:
        from .dsl import par

        return par(self, other)

    def __ror__(self, other: Any) -> Expr:
        from .dsl import par

        return par(other, self)
