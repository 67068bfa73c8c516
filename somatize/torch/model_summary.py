"""``st.model_summary(g)``: a table of a model's nodes and their parameters (Lightning's
``ModelSummary``, which its Trainer prints at the start of ``fit``).

One row per node of the graph (per child, for a plain ``nn.Module``): its id, its class,
its parameters — how many, how many train — and its memory marks (frozen, cached per
example...). The totals count a module held by two nodes once, as the optimizer does.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from somatize import Graph, Node, Done, Opaque
    >>> class Linear(Node):
    ...     def __init__(self, i, o): self.lin = nn.Linear(i, o)
    ...     def forward(self, x, ctx): return Done(Opaque(self.lin(x)))
    >>> g = Graph.somatize(Linear(4, 8).with_id("enc") >> Linear(8, 2)).freeze("enc")
    >>> print(model_summary(g))
      | node   | type   | params | trainable | marks
    --+--------+--------+--------+-----------+-------
    0 | enc    | Linear | 40     | 0         | frozen
    1 | linear | Linear | 18     | 18        |
    18 trainable params, 40 frozen, 58 in all: 232 B of parameters and buffers
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..graph import Graph
from ..render import _kind
from .module import GraphModule, module

__all__ = ["ModelSummary", "model_summary"]


@dataclass(frozen=True)
class Row:
    """One node (or child module): its parameters, and how it is remembered or frozen."""

    node: str
    type: str
    params: int
    trainable: int
    marks: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelSummary:
    """The rows, and totals over distinct parameters (a shared module counted once).

    Attributes:
        rows: one per node, in the graph's order.
        trainable: parameters that train (``requires_grad``).
        frozen: parameters that do not.
        bytes: the size of every distinct parameter and buffer.
    """

    rows: list[Row] = field(default_factory=list)
    trainable: int = 0
    frozen: int = 0
    bytes: int = 0

    @property
    def total(self) -> int:
        return self.trainable + self.frozen

    def __str__(self) -> str:
        head = ("", "node", "type", "params", "trainable", "marks")
        body = [
            (str(i), r.node, r.type, f"{r.params:,}", f"{r.trainable:,}", ", ".join(r.marks))
            for i, r in enumerate(self.rows)
        ]
        widths = [max(len(line[c]) for line in [head, *body]) for c in range(len(head))]

        def line(cells: tuple[str, ...]) -> str:
            return " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

        rule = "-+-".join("-" * w for w in widths)
        totals = (
            f"{self.trainable:,} trainable params, {self.frozen:,} frozen, {self.total:,} in "
            f"all: {_size(self.bytes)} of parameters and buffers"
        )
        return "\n".join([line(head), rule, *map(line, body), totals])


def model_summary(model: Graph | nn.Module) -> ModelSummary:
    """The table of ``model``'s nodes (a graph, or ``module(g)``) or of its children (any
    other ``nn.Module``); ``print`` it."""
    if not isinstance(model, (Graph, nn.Module)):
        raise TypeError(
            f"st.model_summary takes a Graph or an nn.Module, not {model!r}; e.g. "
            "print(st.model_summary(g))"
        )
    net = module(model) if isinstance(model, Graph) else model
    g = net.graph if isinstance(net, GraphModule) else None
    children = dict(net.named_children())
    names = list(g.nodes()) if g is not None else list(children)
    rows = []
    for name in names:
        held = children.get(name)
        params = list(held.parameters()) if held is not None else []
        rows.append(
            Row(
                node=name,
                type=_kind(g._impls[name]) if g is not None else type(held).__qualname__,
                params=sum(p.numel() for p in params),
                trainable=sum(p.numel() for p in params if p.requires_grad),
                marks=tuple(g.memory.marks(name)) if g is not None else (),
            )
        )
    distinct = {id(p): p for p in net.parameters()}.values()
    tensors = [*distinct, *{id(b): b for b in net.buffers()}.values()]
    return ModelSummary(
        rows=rows,
        trainable=sum(p.numel() for p in distinct if p.requires_grad),
        frozen=sum(p.numel() for p in distinct if not p.requires_grad),
        bytes=sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor)),
    )


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
