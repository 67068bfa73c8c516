"""What to write instead, when something else is given where a node or a node id goes.

A PyTorch user's first guesses — an ``nn.Module`` composed with ``>>``, a node class for
an instance, a list for a fork, an expression given to ``g.node``, a node object for its
id — are each answered with the spelling that works. Used by ``dsl.lift`` (composing),
``Graph.node`` and ``Graph._require`` (ids); imports no torch (an ``nn.Module`` is known by
its class's name).
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from typing import Any

__all__ = ["id_instead", "instead", "is_torch_module", "not_a_node"]

_NODE = (
    "class {name}Node(Node): def __init__(self): self.net = <the module>; "
    "def forward(self, x, ctx): return Done(Opaque(self.net(x)))"
)


def is_torch_module(cls: type) -> bool:
    """Whether ``cls`` is an ``nn.Module`` class (without importing torch)."""
    return any(
        c.__name__ == "Module" and c.__module__ == "torch.nn.modules.module" for c in cls.__mro__
    )


def instead(x: Any) -> str:
    """What to write instead of ``x`` where a ``Node`` (or ``Graph``) goes; "" when there
    is nothing better to say than that it is not one."""
    from .graph import Graph
    from .node import Node

    if isinstance(x, type):
        if issubclass(x, (Node, Graph)):
            return f"{x.__qualname__} is a class: give an instance, {x.__name__}(...)"
        if is_torch_module(x):
            return f"{x.__qualname__} is an nn.Module class; hold an instance in a node: " + (
                _NODE.format(name=x.__name__)
            )
        return ""
    if is_torch_module(type(x)):
        return (
            f"a {type(x).__qualname__} is an nn.Module, not a Node: a node holds it, "
            + _NODE.format(name=type(x).__name__)
        )
    if isinstance(x, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return (
            "a function is not a Node: write a class, class Step(Node): def forward(self, x, "
            "ctx): return Done(fn(x)) (Done(Opaque(...)) for a tensor that needs grad)"
        )
    if isinstance(x, (list, tuple)):
        return "a fork is written with |, not a list or tuple: a >> (b | c) >> d"
    if callable(getattr(type(x), "forward", None)):  # a node-like class that forgot its base
        name = type(x).__name__
        return (
            f"{type(x).__qualname__} has a forward but does not subclass Node: write "
            f"class {name}(Node) (from somatize import Node), whose forward(self, x, ctx) "
            "returns Done(value)"
        )
    return ""


def id_instead(node_id: Any, impls: dict[str, Any]) -> str:
    """Why ``node_id``, which is not a str, names no node of a graph holding ``impls``,
    and the id to write."""
    found = next((nid for nid, impl in impls.items() if impl is node_id), None)
    if found is not None:
        return f"a node is named by its id, a str: this one is {found!r}"
    if isinstance(node_id, Iterable) and not isinstance(node_id, (str, bytes)):
        return (
            "one node id (a str) at a time: call once per node, the calls chain "
            "(g.freeze('a').freeze('b'))"
        )
    return "a node is named by its id, a str"


def not_a_node(node_id: Any, impl: Any) -> str:
    """Why ``g.node(node_id, impl)`` refuses ``impl``, which is not a ``Node`` or ``Graph``,
    and what to write."""
    from .dsl import Expr, Ref
    from .graph import Graph
    from .node import Node

    kind = type(impl).__qualname__
    if isinstance(node_id, (Node, Graph)) and isinstance(impl, str):
        return f"the id comes first: g.node({impl!r}, {node_id!r})"
    if isinstance(impl, Ref):
        return (
            f"{impl.impl!r}.with_id(...) names a node inside a >> / | expression; g.node takes "
            f"the node itself, under the id it gives: g.node({node_id!r}, node)"
        )
    if isinstance(impl, Expr):
        return (
            f"a {kind} is an expression of nodes (written with >> or |), not one node: add it "
            f"as a subgraph, g.node({node_id!r}, Graph.somatize(expr)), or build the whole "
            "graph with Graph.somatize(expr)"
        )
    return instead(impl) or (
        f"{kind} is not a Node or Graph; subclass somatize.Node and implement "
        "forward(self, x, ctx) -> Done"
    )
