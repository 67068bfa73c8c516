"""What a graph's nodes register as ``module(g)``'s children: ``_Nodes``, the table of
every node's holdings by node id (subgraphs nested); ``_signature``, what they hold, to
see a change; and the frozen nodes' holdings, checked for a module shared with a
trainable node. (Which modules freeze which parameters: ``freezers.py``.)"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from torch import nn

from ..errors import StateError
from ..graph import Graph
from ..node import Mapped, Node
from .holdings import (
    MODULE_NAMES,
    held_by,
    holdings_signature,
    holds_any,
    node_holdings,
    node_signature,
)

__all__: list[str] = []

_NOT_PLAIN = (Graph, Mapped)  # the impls whose holdings are not a node's own attributes
_NONE_SEEN: frozenset[int] = frozenset()


class _Nodes(nn.Module):
    """The holdings of every node of a (sub)graph, by node id; and ``signature``, what
    ``_signature(g)`` says of them (found while registering them: one walk)."""

    signature: list[Any]

    def __init__(self, g: Graph, reserved: frozenset[str], prefix: str = "") -> None:
        super().__init__()
        modules = self._modules
        signature: list[Any] = []  # (_signature's, found in the same walk)
        put = signature.append
        for node_id, impl in g._impls.items():
            label = prefix + node_id
            put(node_id)
            if not isinstance(impl, _NOT_PLAIN):  # (most nodes: an impl is a Node or a Graph)
                # (holdings are made only for something registered: never empty)
                held: nn.Module | None = node_holdings(impl, label, _NONE_SEEN, signature)
                if held is None:
                    continue
            else:
                put(_signature(impl) if isinstance(impl, Graph) else holdings_signature(impl))
                held = (
                    _Nodes(impl, MODULE_NAMES, label + ".")
                    if isinstance(impl, Graph)
                    else held_by(impl, label)
                )
                if held is None or not holds_any(held):
                    continue
            if "." in node_id or node_id in reserved:
                why = (
                    "a module name cannot contain '.'"
                    if "." in node_id
                    else f"{node_id!r} is already an attribute of the module registering it"
                )
                raise StateError(
                    f"node {label!r} holds modules, which are registered under its id, but {why}; "
                    "give the node another id (g.node('other_id', ...) or node.with_id('other_id'))"
                )
            modules[node_id] = held  # (add_module refuses the ids of _OWN at the top)
        object.__setattr__(self, "signature", signature)

    def _get_name(self) -> str:
        return "Graph"


def _frozen_holdings(m: nn.Module, g: Graph, prefix: str = "") -> Iterator[tuple[str, nn.Module]]:
    """(module path, holdings) of every frozen node, subgraphs included."""
    children = m._modules
    for node_id in g.nodes() if g.memory.frozen else ():
        held = children.get(node_id)
        if node_id in g.memory.frozen and held is not None:
            yield prefix + node_id, held
    for node_id, sub in g._subgraphs().items():
        held = children.get(node_id)
        if node_id not in g.memory.frozen and held is not None:
            yield from _frozen_holdings(held, sub, f"{prefix}{node_id}.")


def _check_shared(m: nn.Module, frozen: Mapping[str, nn.Module]) -> None:
    """A module held by a frozen node and by a trainable one cannot be both frozen and
    trained: freezing would silently win, and the trainable node never train."""
    owner = {id(p): path for path, held in frozen.items() for p in held.parameters()}
    for name, p in m.named_parameters(remove_duplicate=False):
        path = owner.get(id(p))
        if path is not None and not any(name.startswith(f"{f}.") for f in frozen):
            node = name.split(".", 1)[0]
            raise StateError(
                f"node {path!r} is frozen and node {node!r} is not, but they hold the same "
                f"module (its parameter {name!r}): it cannot be both frozen and trained. Give "
                f"the frozen node its own copy (copy.deepcopy(module)), freeze {node!r} too, "
                f"or unfreeze {path!r} (g.freeze({path.split('.')[0]!r}, False))"
            )


def _signature(g: Graph) -> list[Any]:
    """What every node of ``g`` (subgraphs' too) holds, as ids, flat: each node's id, then
    what ``node_signature`` appends for it (a node's) or its ``holdings_signature`` (a
    subgraph's, a mapped node's). Nothing a node appends is a string but its attributes'
    names, each followed by a part that is not, so no two holdings read the same."""
    out: list[Any] = []
    put = out.append
    for n, impl in g._impls.items():
        put(n)
        if isinstance(impl, Node) and not isinstance(impl, Mapped):
            node_signature(impl, out)
        else:
            put(_signature(impl) if isinstance(impl, Graph) else holdings_signature(impl))
    return out
