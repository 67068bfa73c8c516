"""Frozen nodes under ``lightning.Trainer``: a callback that unfreezes a backbone mid-fit
(Lightning's ``BackboneFinetuning``, a ``BaseFinetuning`` of your own) must unfreeze it in
the graph too.

``g.freeze(node)`` is what freezes a node: it runs in eval mode without gradients, and can
be cached. A callback that turns its parameters' ``requires_grad`` on and adds them to the
optimizer leaves all that as it was — the node would still run without gradients (and be
served from its cache), and its new parameter group would never train. So such parameters
are refused, naming the node and the fix: ``g.freeze(node, False)`` (and ``g.cache(node,
False)``) where the callback adds them.

Used by ``somatize.torch.lightning``; needs the ``lightning`` extra there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..errors import SettingError

if TYPE_CHECKING:
    from .lightning import LightningGraph

__all__ = ["check_added", "check_backbone"]


def _frozen_params(lg: LightningGraph, nodes: Any) -> list[tuple[str, str, Any]]:
    """(node, parameter name, parameter) for each parameter of ``nodes`` (frozen ones)."""
    if not nodes:
        return []
    named = lg.net.named_parameters(remove_duplicate=False)
    return [(n.split(".", 1)[0], n, p) for n, p in named if n.split(".", 1)[0] in nodes]


def check_added(lg: LightningGraph) -> None:
    """At a training epoch's start (after the callbacks', where ``BaseFinetuning`` unfreezes):
    refuse a parameter of a node frozen since the last check that is in the optimizer with
    ``requires_grad`` turned on — a callback unfroze it, not the graph. (A node the callback
    froze again just now is not asked: the graph's module freezes it at its next call.)

    Raises:
        SettingError: naming the node, its parameters and the fix.
    """
    frozen = lg.graph.memory.frozen
    kept, lg._frozen_seen = frozen & lg._frozen_seen, frozenset(frozen)
    params = _frozen_params(lg, kept)
    if not params:
        return
    held = {id(p) for opt in lg.trainer.optimizers for g in opt.param_groups for p in g["params"]}
    added = [(node, name) for node, name, p in params if p.requires_grad and id(p) in held]
    if added:
        said = "a callback turned its parameters' requires_grad on, in the optimizer"
        raise SettingError(_message(lg, added, said))


def check_backbone(lg: LightningGraph) -> None:
    """At a fit's start: refuse Lightning's own ``BackboneFinetuning`` over a ``backbone``
    holding a frozen node's parameters — it would add them to the optimizer at
    ``unfreeze_backbone_at_epoch`` and never unfreeze the node (``check_added`` would refuse
    it then, epochs later). A subclass with its own ``finetune_function`` is left to it.

    Raises:
        SettingError: naming the node, the parameters and the fix.
    """
    from lightning.pytorch.callbacks import BackboneFinetuning

    backbone = getattr(lg, "backbone", None)
    if not isinstance(backbone, torch.nn.Module):
        return
    for cb in getattr(lg.trainer, "callbacks", ()):
        if isinstance(cb, BackboneFinetuning) and (
            type(cb).finetune_function is BackboneFinetuning.finetune_function
        ):
            ids = {id(p) for p in backbone.parameters()}
            params = _frozen_params(lg, lg.graph.memory.frozen)
            hit = [(node, name) for node, name, p in params if id(p) in ids]
            if hit:
                at = cb.unfreeze_backbone_at_epoch
                said = f"BackboneFinetuning would add its parameters to the optimizer at epoch {at}"
                raise SettingError(_message(lg, hit, said))


def _message(lg: LightningGraph, params: list[tuple[str, str]], how: str) -> str:
    nodes = sorted({node for node, _ in params})
    node = nodes[0]
    names = ", ".join(f"net.{name}" for _, name in params[:3]) + ", ..." * (len(params) > 3)
    off = f"g.freeze({node!r}, False)"
    if node in lg.graph.memory.cached:
        off += f".cache({node!r}, False)"
    return (
        f"node{'s' if len(nodes) > 1 else ''} {', '.join(map(repr, nodes))} "
        f"{'are' if len(nodes) > 1 else 'is'} frozen in the graph (g.freeze({node!r})), but "
        f"{how} ({names}): frozen, a node runs in eval mode without gradients (and is served "
        "from its cache), so they would never train. Unfreeze it in the graph where its "
        f"parameters are added — {off} in a BaseFinetuning's finetune_function, then "
        "optimizer.add_param_group (docs/lightning.md, 'Unfreezing a frozen backbone "
        "mid-fit') — or fit twice: frozen, then unfrozen with an optimizer of its own. To "
        "train part of a node, make that part a node of its own (b1 >> b2) and unfreeze it"
    )
