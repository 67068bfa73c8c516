"""A ``Graph``, a ``Node`` or a ``>>`` expression used as the ``nn.Module`` it is not —
``g(x)``, ``node(x)``, ``(a >> b)(x)``, ``g.parameters()``, ``node.to("cuda")`` — is told
what to write instead: ``g.forward(x)``, or ``st.module(g)`` (``somatize.torch``), which is
one. Each class takes a ``called`` as its ``__call__``, and ``install`` gives it one
attribute per ``nn.Module`` method it lacks, whose every read raises that
``AttributeError`` (so ``hasattr`` stays False). Not a ``__getattr__``: a class with one
gets CPython's slow attribute lookup for *every* attribute (its reads are not
specialised), which made building a 1,000-node graph 15-30% slower."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Refused", "called", "expr_called", "install", "node_called"]

#: nn.Module's methods a PyTorch user reaches for on the graph instead of st.module(g).
_MODULE_METHODS = frozenset(
    [
        "parameters",
        "named_parameters",
        "buffers",
        "named_buffers",
        "modules",
        "children",
        "state_dict",
        "load_state_dict",
        "to",
        "cuda",
        "cpu",
        "half",
        "float",
        "double",
        "train",
        "eval",
        "zero_grad",
        "requires_grad_",
        "apply",
        "register_forward_hook",
        "register_buffer",
    ]
)


def called(self: Any, *args: Any, **kwargs: Any) -> Any:
    raise TypeError(
        "a Graph is not called: g.forward(x) runs it; for tensors and training, "
        "model = st.module(g) (somatize.torch) is the nn.Module to call, model(x)"
    )


def node_called(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``node(x)``: a node is not a module; the graph calls its ``forward(x, ctx)``."""
    from .dsl import default_id

    raise TypeError(
        f"node {self!r} is called like a module, but a Node is not one: a graph calls its "
        "forward(x, ctx). Put it in a graph and run that: st.module(Graph.somatize(node))(x) "
        "(somatize.torch), or Graph.somatize(node).forward(x); to call it by hand (in a "
        f"test), node.forward(x, Ctx({default_id(self)!r}))"
    )


def expr_called(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``(a >> b)(x)``: an expression is not a graph until ``Graph.somatize`` builds it."""
    raise TypeError(
        "this is an expression of nodes (written with >> or |), not a graph: build it once, "
        "g = Graph.somatize(expr), then run g.forward(x), or model = st.module(g) "
        "(somatize.torch) for tensors and training, model(x)"
    )


class Refused:
    """A name a class answers with an ``AttributeError`` saying what to write instead, on
    the class too (``hasattr`` stays False, and no one lists it as a member). A descriptor
    per name, where a ``__getattr__`` would slow every other attribute read of the class."""

    def __init__(self, message: str) -> None:
        self.message = message

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        raise AttributeError(self.message)


class _Named(Refused):
    """A ``Refused`` whose message begins with the class it was read on (``'Enc' object
    has no parameters()``): ``Node``'s are read on the user's node classes."""

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        cls = owner if owner is not None else type(obj)
        raise AttributeError(f"{cls.__qualname__!r} object has no {self.message}")


def _graph_says(name: str) -> str:
    said = ", or st.parameters(g) for an optimizer" if name == "parameters" else ""
    return (
        f"'Graph' object has no {name}() — a Graph is not an nn.Module; "
        f"st.module(g) (somatize.torch) is: st.module(g).{name}(...){said}"
    )


def _node_says(name: str) -> str:
    said = ", or st.parameters(g) for an optimizer" if name == "parameters" else ""
    return (
        f"{name}() — a Node is not an nn.Module, it holds them (self.lin = nn.Linear(...)): "
        f"call it on a module the node holds (node.lin.{name}(...)), or on "
        f"st.module(g) (somatize.torch), which registers every node's: "
        f"st.module(g).{name}(...){said}"
    )


def _expr_says(name: str) -> str:
    return (
        f"{name}() — an expression of nodes (written with >> or |) is not a graph, nor an "
        f"nn.Module: build the graph once, g = Graph.somatize(expr), then "
        f"st.module(g).{name}(...) (somatize.torch)"
    )


_SAYS: dict[str, tuple[Callable[[str], str], type[Refused]]] = {
    "graph": (_graph_says, Refused),
    "node": (_node_says, _Named),
    "expr": (_expr_says, _Named),
}


def install(cls: type, kind: str = "graph") -> None:
    """Give ``cls`` (``Graph``, ``Node`` or ``Expr``: ``kind``) a ``Refused`` for each
    ``nn.Module`` method it lacks."""
    says, refused = _SAYS[kind]
    for name in _MODULE_METHODS:
        if not any(name in vars(c) for c in cls.__mro__):
            setattr(cls, name, refused(says(name)))
