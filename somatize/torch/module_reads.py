"""What the rest of ``somatize.torch`` reads of a graph's module: its trainable parameters
(``st.parameters``), and what its nodes reported in its last call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from ..graph import Graph
from .freezers import _settle_frozen, frozen_any
from .module import GraphModule, module
from .not_a_graph import require_graph

__all__ = ["fit_metrics", "node_metrics", "parameters"]


def node_metrics(net: Any) -> Mapping[str, Any] | None:
    """What the graph's nodes reported in ``net``'s last call (``GraphModule.metrics``; a
    compiled or DDP-wrapped one too), or None for any other module, whose own ``metrics``
    attribute (a torchmetrics collection) is its own business."""
    inner = getattr(net, "_orig_mod", net)  # torch.compile's
    if not isinstance(inner, GraphModule):
        inner = getattr(inner, "module", None)  # DistributedDataParallel's
    return inner.metrics if isinstance(inner, GraphModule) else None


def fit_metrics(net: Any) -> Mapping[str, Any] | None:
    """``node_metrics`` of the module a fit trains (``ActiveRun.net``, never compiled nor
    wrapped), read from a ``GraphModule``'s instance dict: a tenth of a µs a step, where
    ``node_metrics``' look-up of ``_orig_mod`` costs µs (a name a module lacks raises
    inside ``nn.Module.__getattr__``)."""
    if type(net) is GraphModule:
        return net.__dict__.get("metrics")
    return node_metrics(net)


def parameters(g: Graph) -> list[nn.Parameter]:
    """The trainable parameters of ``g``: deduplicated, frozen nodes excluded.

    Example:
        >>> opt = torch.optim.Adam(parameters(g), lr=1e-3)  # doctest: +SKIP
    """
    require_graph(g, "st.parameters")
    seen: set[int] = set()
    out = []
    m = module(g)
    if frozen_any():
        _settle_frozen(m)
    for p in m.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out
