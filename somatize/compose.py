"""The one mixin: ``>>`` and ``|`` for Node, Graph and Expr (``somatize/dsl.py`` builds them).

It supplies operators only, no behaviour, so three classes share four methods instead of
writing them three times.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .dsl import Expr

__all__ = ["Composable"]


_dsl: Any = None  # somatize.dsl, once loaded: it imports this module, so not at the top


def _language() -> Any:
    """``somatize.dsl``; a function-level import on every operator would cost more than
    the operator's own work (about 1 µs a ``>>``)."""
    global _dsl
    if _dsl is None:
        from . import dsl

        _dsl = dsl
    return _dsl


class Composable:
    """``a >> b`` (sequence) and ``a | b`` (fork) on anything that can be a graph's part."""

    __slots__ = ()

    def __rshift__(self, other: Any) -> Expr:
        return (_dsl or _language()).seq(self, other)  # type: ignore[no-any-return]

    def __rrshift__(self, other: Any) -> Expr:
        return (_dsl or _language()).seq(other, self)  # type: ignore[no-any-return]

    def __or__(self, other: Any) -> Expr:
        return (_dsl or _language()).par(self, other)  # type: ignore[no-any-return]

    def __ror__(self, other: Any) -> Expr:
        return (_dsl or _language()).par(other, self)  # type: ignore[no-any-return]
