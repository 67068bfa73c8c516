"""Catalog: who executes each node — node id → implementation.

Not data: implementations are live objects (a ``Node``, or a ``Graph`` for a
subgraph) and are never serialised with the topology. The node id is the only
thing joining the two. When a slice runs elsewhere, implementations travel
separately (cloudpickle, once per worker).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .errors import MissingNodeError

__all__ = ["Catalog"]


class Catalog(Mapping[str, Any]):
    """A read-only mapping from node id to implementation, built by ``Graph``.

    Example:
        >>> c = Catalog({"a": 1}); c["a"]
        1
    """

    def __init__(self, impls: Mapping[str, Any] | None = None) -> None:
        self._impls: dict[str, Any] = dict(impls or {})

    def __getitem__(self, node: str) -> Any:
        try:
            return self._impls[node]
        except KeyError:
            raise MissingNodeError(
                f"no implementation for node {node!r}; known nodes: {', '.join(self._impls) or 'none'}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._impls)

    def __len__(self) -> int:
        return len(self._impls)

    def with_node(self, node: str, impl: Any) -> Catalog:
        """A new catalog with ``node`` added or replaced."""
        return Catalog({**self._impls, node: impl})

    def subset(self, nodes: list[str] | tuple[str, ...]) -> Catalog:
        """A catalog of just ``nodes`` (what a slice needs)."""
        return Catalog({n: self[n] for n in nodes})

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={type(v).__qualname__}" for k, v in self._impls.items())
        return f"Catalog({inner})"
