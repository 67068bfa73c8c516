"""State a node carries across steps within a run — truncated BPTT's hidden state.

A node keeps it in a ``Carry`` attribute. The Trainer resets every ``Carry`` of the
model to None at the start of each epoch and of each evaluation (and gives training
its own back after an evaluation in the middle of an epoch); ``evaluate`` and
``predict`` start from None too. A ``Carry`` is not a tensor attribute, so it never
becomes a buffer: it is not in ``state_dict()``, ``state(g)`` or checkpoints.

Example:
    >>> class LM(Node):                                    # doctest: +SKIP
    ...     def __init__(self):
    ...         self.rnn = nn.LSTM(8, 8, batch_first=True)
    ...         self.hidden = Carry()
    ...     def forward(self, x, ctx):
    ...         out, h = self.rnn(x, self.hidden.value)    # None at the start: zeros
    ...         self.hidden.set(h)                         # detached: truncated backprop
    ...         return Done(Opaque(out))
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..graph import Graph
from ..node import Node

__all__ = ["Carry", "carries", "reset"]


class Carry:
    """A value a node keeps from one step to the next, reset by the Trainer.

    Args:
        detach: ``set`` detaches the tensors it is given (nested tuples, lists and
            dicts too), so gradients stop at the step boundary — truncated backprop
            through time. False keeps them attached.

    Attributes:
        value: what the last ``set`` stored; None after a reset.
    """

    __slots__ = ("detach", "value")

    def __init__(self, *, detach: bool = True) -> None:
        self.detach = detach
        self.value: Any = None

    def set(self, value: Any) -> None:
        self.value = _detached(value) if self.detach else value

    def reset(self) -> None:
        self.value = None

    def __repr__(self) -> str:
        return f"Carry({'empty' if self.value is None else type(self.value).__name__})"


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (tuple, list)):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


def carries(net: nn.Module) -> list[Carry]:
    """Every ``Carry`` of a model: in its graph's nodes (subgraphs and held nodes too) and
    in the ``__dict__`` of its modules."""
    found: dict[int, Carry] = {}
    seen: set[int] = set()

    def visit(obj: Any) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, Graph):
            for node_id in obj.nodes():
                visit(obj[node_id])
            return
        inner = getattr(obj, "inner", None)  # a Mapped node's node
        if isinstance(inner, Node):
            visit(inner)
        for value in vars(obj).values() if hasattr(obj, "__dict__") else ():
            if isinstance(value, Carry):
                found[id(value)] = value
            elif isinstance(value, (Node, Graph)):
                visit(value)

    graph = getattr(net, "graph", None)
    if isinstance(graph, Graph):
        visit(graph)
    for m in net.modules():
        for value in vars(m).values():
            if isinstance(value, Carry):
                found[id(value)] = value
    return list(found.values())


def reset(found: list[Carry]) -> None:
    """Reset each of them to None."""
    for c in found:
        c.value = None
