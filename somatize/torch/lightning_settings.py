"""``LightningGraph``'s arguments: checked when it is made, as ``st.Trainer`` checks its own;
the hyper-parameters Lightning saves with them; the optimizer configuration they give.

Used by ``somatize.torch.lightning``; needs the ``lightning`` extra there.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from ..graph import Graph
from ..stack import outside
from .factories import check_optimizer
from .module_reads import parameters
from .settings import check_loss, check_measured, check_metrics

__all__ = ["check", "configured", "hyperparameters"]


def check(g: Any, loss: Any, optimizer: Any, scheduler: Any, metrics: Any) -> None:
    """Refuse a bad argument when a ``LightningGraph`` is made, naming it and the fix."""
    if not isinstance(g, Graph):
        raise TypeError(_not_a_graph(g))
    if optimizer is not None and not callable(optimizer):
        raise TypeError(
            "optimizer must be a factory over parameters (or None, to predict and evaluate "
            f"only), not {type(optimizer).__qualname__}; e.g. "
            "optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3)"
        )
    if scheduler is not None and not callable(scheduler):
        raise TypeError(
            f"scheduler must be a factory over the optimizer, not {type(scheduler).__qualname__}; "
            "e.g. scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 10)"
        )
    check_loss(loss)
    check_metrics(metrics)
    check_measured(metrics, loss, "LightningGraph")


def _not_a_graph(g: Any) -> str:
    """What to do with a model that is not a graph: a GraphModule's graph, a module's node."""
    kind = type(g).__qualname__
    if isinstance(getattr(g, "graph", None), Graph) and isinstance(g, torch.nn.Module):
        return (
            f"LightningGraph takes a somatize Graph, got a {kind} (st.module(g)): pass the "
            "graph itself, LightningGraph(g, ...)"
        )
    if isinstance(g, torch.nn.Module):
        return (
            f"LightningGraph takes a somatize Graph, got {kind}, an nn.Module. st.Trainer "
            "trains a module as it is (st.Trainer(loss=..., optimizer=...).fit(model, "
            "train)); to train it under lightning.Trainer, make it the one node of a graph:\n"
            "    class Model(Node):\n"
            "        def __init__(self, net): self.net = net\n"
            "        def forward(self, x, ctx): return Done(Opaque(self.net(x)))\n"
            "    LightningGraph(Graph.somatize(Model(model)), loss=..., optimizer=...)\n"
            "(from somatize import Done, Graph, Node, Opaque)"
        )
    return (
        f"LightningGraph takes a somatize Graph, got {kind}; build one from nodes, "
        "Graph.somatize(Encode() >> Classify())"
    )


def _name(obj: Any) -> str | None:
    """A readable name of a loss function (for the hyper-parameters)."""
    if obj is None:
        return None
    if isinstance(obj, functools.partial):
        return _name(obj.func)
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return str(name)


def hyperparameters(
    g: Graph, loss: Any, optimizer: Any, scheduler: Any, metrics: Mapping[str, Any]
) -> dict[str, Any]:
    """What ``save_hyperparameters`` records: the topology (checked when a checkpoint is
    loaded), the memory settings, and the names of the loss, optimizer and scheduler.

    The factories are probed for class names and the learning rate. A scheduler factory
    may read the Trainer (``trainer.estimated_stepping_batches``), which knows the run
    only once it has the model: when its probe fails, its name is None here, and
    ``configure_optimizers`` names both from the objects the run uses (``configured``)."""
    params = parameters(g)
    opt = (
        optimizer(params) if params and optimizer is not None else None
    )  # probes, for class names and lr only
    if opt is not None:
        check_optimizer(opt, params)  # (as st.Trainer: a list of two, a dict, refused)
    names = _named(opt)
    sched = None
    if scheduler is not None and opt is not None:
        try:
            sched = scheduler(opt)
        except Exception:  # (called again, and its error raised, when Lightning configures)
            sched = None
    if isinstance(sched, Mapping):
        sched = sched.get("scheduler")
    return {
        "topology": g.topology.to_json(),
        "frozen": sorted(g.memory.frozen),
        "cached": sorted(g.memory.cached),
        "loss_name": _name(loss),
        **names,
        "scheduler_name": type(sched).__qualname__ if sched is not None else None,
        "metric_names": sorted(metrics),
    }


def _named(opt: Any) -> dict[str, Any]:
    """The optimizer's class name and learning rate (as the factory set it)."""
    return {
        "optimizer_name": type(opt).__qualname__ if opt is not None else None,
        "lr": float(opt.param_groups[0]["lr"]) if opt is not None else None,
    }


def configured(
    g: Graph, optimizer: Any, scheduler: Any, lr: float | None = None, epochs: int | None = None
) -> tuple[Any, dict[str, Any]]:
    """What ``configure_optimizers`` returns — the optimizer, and the scheduler's config: a
    plain scheduler once per epoch, as Lightning steps one (a ``ReduceLROnPlateau`` on
    ``val_loss``); a dict the factory returned, as it is — and the hyper-parameters that
    name them (``optimizer_name``, ``lr`` before any scheduler, ``scheduler_name``).
    A plain ``CosineAnnealingLR`` built for more steps than the run's ``epochs`` warns: sized
    in optimizer steps, as under ``st.Trainer``, once an epoch it would stop early in its
    schedule (a plain ``OneCycleLR`` Lightning warns of itself).

    Raises:
        ValueError: nothing to train.
    """
    params = parameters(g)
    if not params:
        raise ValueError(
            "nothing to train: every node is frozen or holds no parameters "
            "(unfreeze a node with g.freeze(id, False), or give a node an nn.Module)"
        )
    opt = optimizer(params)
    check_optimizer(opt, params)
    if lr is not None:  # hparams["lr"] set since (Lightning's lr_find): every group scaled
        ratio = lr / opt.param_groups[0]["lr"]
        for group in opt.param_groups:
            group["lr"] = group["lr"] * ratio
    names = _named(opt)  # (the rate the factory set, before a scheduler changes it)
    names["frozen"], names["cached"] = sorted(g.memory.frozen), sorted(g.memory.cached)
    if scheduler is None:
        return opt, {**names, "scheduler_name": None}
    sched = scheduler(opt)
    if isinstance(sched, Mapping):
        config = dict(sched)
    else:  # Lightning's default for a plain scheduler: once per epoch
        config = {"scheduler": sched, "interval": "epoch"}
        if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
            config["monitor"] = "val_loss"
        _warn_if_sized_in_steps(sched, epochs)
    scheduled = config.get("scheduler")
    names["scheduler_name"] = type(scheduled).__qualname__ if scheduled is not None else None
    return {"optimizer": opt, "lr_scheduler": config}, names


def _warn_if_sized_in_steps(sched: Any, epochs: int | None) -> None:
    """A plain scheduler is stepped once an epoch; a cosine whose ``T_max`` is longer than
    the run's epochs (``trainer.estimated_stepping_batches``, as ``st.Trainer``, which
    steps a plain scheduler every optimizer step, takes it) would end the run early in its
    decay, without a word. (Lightning warns of a ``OneCycleLR`` stepped once an epoch.)"""
    from .horizon import parts

    if not epochs or epochs < 1:  # (max_epochs=-1 or None: a run of max_steps)
        return
    lr = torch.optim.lr_scheduler
    for part in parts(sched):
        ends = part.start + part.built
        if isinstance(part.sched, lr.CosineAnnealingLR) and ends > epochs:
            warnings.warn(
                f"{part.where}'s {part.key}={part.built} is longer than the run: returned "
                "as it is, LightningGraph steps it once an epoch (Lightning's default for a "
                f"plain scheduler), {epochs} times in max_epochs={epochs}, so its rate stops "
                "early in its schedule. To step it every optimizer step (as st.Trainer "
                'does), return {"scheduler": sched, "interval": "step"}; or size it in '
                f"epochs ({part.key}={epochs})",
                UserWarning,
                stacklevel=outside(),  # the user's trainer.fit(...) line
            )
            return
