"""Memory: what is remembered of each node, and the keys that make remembering safe.

Four independent maps:

* **frozen** — no gradients, eval mode, state fixed (``somatize.torch`` enforces it).
* **cached** — outputs memoised in the keeper under the node's key; a cached node may be
  remembered *per example* instead (``per_example``, a subset of ``cached``): one entry
  per row of its batch, keyed by the node and that row's content (``somatize/rows.py``).
* **named** — the output is also recorded under a human name in the keeper.
* **pinned** — the node's entries are never evicted by ``gc``.

Keys are Merkle-style recipe keys::

    key(root input) = H(content)                      # the only place data is hashed
    key(node)       = H(identity, declaration, state, keys of its predecessors)
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .bindings import Watched, still, watch
from .declaration import declaration
from .errors import GraphError
from .identity import identity
from .keepers.protocol import is_name
from .node_state import Codes, state
from .values import digest

if TYPE_CHECKING:
    from .codecs import Codec

__all__ = ["KEY_VERSION", "Memory", "NodeKeys", "key"]

KEY_VERSION = "somatize.key/1"


def key(identity: str, declaration: str, state: str, predecessors: Sequence[str]) -> str:
    """A node's key: a pure function of its identity, declaration, state and inputs' keys.

    Example:
        >>> key("A", "d", "s", ["k1"]) == key("A", "d", "s", ["k1"])
        True
        >>> key("A", "d", "s", ["k1"]) == key("A", "d", "s", ["k2"])
        False
    """
    return digest((KEY_VERSION, identity, declaration, state, tuple(predecessors)))


@dataclass(frozen=True)
class Memory:
    """The four memory maps of a graph. Immutable: each setter returns a new Memory."""

    frozen: frozenset[str] = frozenset()
    cached: frozenset[str] = frozenset()
    named: Mapping[str, str] = field(default_factory=dict)
    pinned: frozenset[str] = frozenset()
    per_example: frozenset[str] = frozenset()  # cached row by row (a subset of cached)

    def freeze(self, node: str, on: bool = True) -> Memory:
        _flag("freeze", node, on)
        return replace(self, frozen=self.frozen | {node} if on else self.frozen - {node})

    def cache(self, node: str, on: bool = True, *, per_example: bool = False) -> Memory:
        _flag("cache", node, on)
        rows = self.per_example | {node} if on and per_example else self.per_example - {node}
        cached = self.cached | {node} if on else self.cached - {node}
        return replace(self, cached=cached, per_example=rows)

    def name(self, node: str, name: str | None) -> Memory:
        """Record ``node``'s output under ``name`` too (None: no longer).

        Raises:
            GraphError: ``name`` is not a keeper name (letters, digits, ``.``, ``_``,
                ``-``; at most 200, not starting with ``.``), or another node of the graph
                has it already (or one differing only in case: one file on macOS, Windows).
        """
        if name is not None:
            if not is_name(name):
                raise GraphError(
                    f"g.name({node!r}, {name!r}): a name is a str of letters, digits, '.', "
                    "'_' or '-' (1 to 200 of them, the first not '.'), as it becomes a file "
                    "name in the keeper; "
                    "e.g. g.name(node, 'features-v1')"
                )
            fold = name.lower()  # (names are ASCII)
            other = next(
                (k for k, v in self.named.items() if v.lower() == fold and k != node), None
            )
            if other is not None and self.named[other] != name:
                raise GraphError(
                    f"g.name({node!r}, {name!r}): node {other!r} is named "
                    f"{self.named[other]!r}, which differs only in case: on macOS and Windows, "
                    "whose disks ignore case, both would be one file in the keeper; give "
                    "each node a name that differs in more than case"
                )
            if other is not None:
                raise GraphError(
                    f"g.name({node!r}, {name!r}): node {other!r} already has that name, and "
                    "one name records one output; give each node its own name, or remove "
                    f"the other first with g.name({other!r}, None)"
                )
        named = {k: v for k, v in self.named.items() if k != node}
        if name is not None:
            named[node] = name
        return replace(self, named=named)

    def pin(self, node: str, on: bool = True) -> Memory:
        _flag("pin", node, on)
        return replace(self, pinned=self.pinned | {node} if on else self.pinned - {node})

    def remembers(self, node: str) -> bool:
        """Whether the node's output is written to the keeper (cached or named)."""
        return node in self.cached or node in self.named

    def marks(self, node: str) -> list[str]:
        """Human labels for rendering: frozen, cached, named 'x', pinned."""
        out = [m for m in ("frozen", "cached") if node in getattr(self, m)]
        if node in self.per_example:
            out[-1] = "cached per example"
        if node in self.named:
            out.append(f"named {self.named[node]!r}")
        if node in self.pinned:
            out.append("pinned")
        return out


def _flag(setter: str, node: str, on: object) -> None:
    """A memory setting is True or False: ``g.freeze(node, "no")`` would freeze."""
    if type(on) is not bool:
        raise GraphError(
            f"g.{setter}({node!r}, {on!r}): on is True or False, not a {type(on).__name__} "
            f"(a non-empty string is true); write g.{setter}({node!r}, False) to undo it"
        )


class NodeKeys:
    """Computes node keys; identity and declaration once per node, state through the codecs.

    State is asked of the codecs on every key: they make that cheap for unchanged
    holdings (the torch codec remembers each tensor's digest by its version counter),
    so a node whose weights changed can never be served a stale entry.
    """

    def __init__(self, codecs: Sequence[Codec] = ()) -> None:
        self.codecs = tuple(codecs)
        self._fixed: dict[int, tuple[Any, type, str, str, Watched]] = {}
        self._codes = Codes(self.codecs)  # the code held nodes hold, read once (node_state)
        # what codecs say outputs depend on besides state and inputs (torch: autocast)
        self._contexts = [f for c in self.codecs if (f := getattr(c, "context", None))]
        self._held: tuple[list[Any] | None] | None = None  # a context fixed by ``under``

    def context(self) -> list[Any] | None:
        """What the codecs say outputs depend on now besides state and inputs (torch: the
        autocast dtype of each device type), folded into the state part; None when nothing."""
        if self._held is not None:
            return self._held[0]
        return [ctx for f in self._contexts if (ctx := f()) is not None] or None

    def under(self, context: list[Any] | None) -> NodeKeys:
        """These keys as made under another ``context()``: ``g.explain`` asks whether a
        changed state is the weights or only the context (the codecs and memos are shared)."""
        keys = copy.copy(self)
        keys._held = (context,)
        return keys

    def parts(self, impl: Any) -> tuple[str, str, str]:
        """(identity, declaration, state) of a node implementation."""
        own = getattr(impl, "key_parts", None)
        if own is not None:  # a subgraph: its parts are made of its nodes' parts
            parts: tuple[str, str, str] = own(self)
            return parts
        fixed = self._fixed.get(id(impl))
        if (
            fixed is None
            or fixed[0] is not impl
            or fixed[1] is not type(impl)  # (node.__class__ = Other)
            or not still(fixed[4])
        ):
            # (the class's code read once; what it reads, and the code itself, checked at
            # every key: bindings.py)
            cls = type(impl)
            watched = watch(cls, self.codecs)
            ident, decl = identity(impl, self.codecs), declaration(impl, self.codecs)
            fixed = (impl, cls, ident, decl, watched)
            self._fixed[id(impl)] = fixed
        return fixed[2], fixed[3], state(impl, self.codecs, self.context(), self._codes)

    def of(self, impl: Any, predecessors: Sequence[str]) -> str:
        return key(*self.parts(impl), predecessors)
