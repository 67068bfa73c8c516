"""The note on a loss or metric that fails in evaluation: how evaluation called it — a
function as ``fn(output, target)``, a metric object as ``update(output, target)`` — with
the output's and target's dtypes and shapes, and, for a model whose output is a dict or
a tuple (``{"logits": ..., "h": ...}``), that the metric is given that output whole."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["call_note"]


def call_note(name: str, out: Any, y: Any, *, update: bool = False) -> str:
    """Where an evaluation's call of the loss, or of metric ``name`` (``update``: a metric
    object's ``update``), failed, and how it is called (a metric of the output alone fails
    only with Python's "takes 1 positional")."""
    from .first_step import _typed

    what = "the loss function" if name == "loss" else f"metric {name!r}"
    if name == "loss" and y is None:  # (loss_of calls loss(output) for a batch with no target)
        called = f"loss(output) with output {_typed(out)}, the batch having no target"
    else:
        fn = f"{name}.update" if update else "fn"
        called = f"{fn}(output, target) with output {_typed(out)}, target {_typed(y)}"
    return (
        f"raised in {what}, called as {called}: evaluation calls the loss and each function "
        "of Trainer(metrics=...) with the model's output and the batch's target, as "
        "st.accuracy(output, target) (an object with reset/update/compute, a torchmetrics "
        "Metric, is given update(output, target))" + _whole(out, name)
    )


def _whole(out: Any, name: str) -> str:
    """For an output that is a dict or a tuple: how to give a metric the tensor it wants."""
    if isinstance(out, Mapping) and out:
        key = next(iter(out))
        pick, part = f"out[{key!r}]", f"a {type(out).__qualname__} ({', '.join(map(repr, out))})"
    elif isinstance(out, tuple) and out:
        pick, part = "out[0]", f"a tuple of {len(out)}"
    else:
        return ""
    if name == "loss":
        return f"; the model's output is {part}, given whole: pick it, loss=lambda out, y: F.cross_entropy({pick}, y)"
    return (
        f"; the model's output is {part}, and a metric is given it whole: pick the tensor "
        f"in a function, metrics={{{name!r}: lambda out, y: st.accuracy({pick}, y)}}, or "
        f"for a metric object in a subclass's update (def update(self, out, y): "
        f"super().update({pick}, y))"
    )
