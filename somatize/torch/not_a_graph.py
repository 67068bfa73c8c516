"""What ``st.module``, ``st.parameters``, ``st.state`` and ``st.load_state`` say when given
something other than a ``Graph``: a node or a ``>>`` expression not built into one yet,
the graph's module itself, or a plain ``nn.Module`` — each with the call that works."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..dsl import Expr
from ..graph import Graph
from ..node import Node

__all__ = ["require_graph"]


def require_graph(g: Any, call: str) -> None:
    """Raise unless ``g`` is a ``Graph``; ``call`` is how the caller is spelt, ``st.module``.

    Raises:
        TypeError: naming what ``g`` is and the call to write instead.
    """
    if isinstance(g, Graph):
        return
    kind = type(g).__qualname__
    said = f"{call}() takes a somatize Graph, got {kind}"
    if isinstance(g, (Node, Expr)):
        what = "a node" if isinstance(g, Node) else "an expression of nodes (written with >> or |)"
        fix = f"{what} becomes one with Graph.somatize: g = Graph.somatize(...); {call}(g)"
    elif isinstance(getattr(g, "graph", None), Graph) and isinstance(g, nn.Module):
        fix = f"this is a graph's module (st.module(g)): pass its graph, {call}(model.graph)"
        if call == "st.module":
            fix = "this is a graph's module already: use it as it is (st.module(model.graph) is it)"
        elif call == "st.parameters":
            fix += " (model.parameters() lists frozen nodes' too)"
    elif isinstance(g, nn.Module) and call == "st.load_state":  # (fit trains one as it is)
        fix = (
            "a plain nn.Module loads its weights itself, model.load_state_dict(result.state); "
            "from a Trainer checkpoint, model.load_state_dict(st.load_checkpoint(path)['model']) "
            "(under Options(ema=), ['ema']['state']: the average its evaluation judged)"
        )
    elif isinstance(g, nn.Module):
        fix = (
            "a plain nn.Module is used as it is (model.parameters(), model.state_dict()); to "
            "put it in a graph, hold it in a node: class Model(Node): def __init__(self, net): "
            "self.net = net; def forward(self, x, ctx): return Done(Opaque(self.net(x)))"
        )
    else:
        fix = "build one from nodes, Graph.somatize(Encode() >> Classify())"
    raise TypeError(f"{said}: {fix}")
