"""A sum-reduced loss under ``micro_batches``: refused, as its step would be k times too small.

``micro_batches=k`` weighs each chunk's loss by its share of the batch (``step.py``): the
weighted chunk losses of a *mean* are the batch's mean, but those of a *sum* are the
batch's sum divided by about k — a step k times too small, silently. Two checks:

* **When ``fit`` starts**, a loss that says so: a loss module with ``reduction="sum"``
  (``nn.CrossEntropyLoss(reduction="sum")``), or a ``functools.partial`` with
  ``reduction="sum"``.
* **On the first micro-batch of a fresh run**, any loss function: the loss of the chunk
  is compared with the losses of its two halves (no new forward: the chunk's output,
  detached, is split). A mean is their weighted mean; a sum is their sum, whatever the
  function is called. Two calls of the loss function once a run; a loss of another kind
  (one over pairs of rows, a regulariser added to a mean) is neither and passes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ..errors import SettingError
from .batches import loss_of

__all__ = ["check_loss_reduction", "check_summed_value", "summed"]


def summed(loss: Any) -> str | None:
    """How ``loss`` says it sums over examples (``"nn.L1Loss(reduction='sum')"``), or None."""
    if isinstance(loss, torch.nn.Module) and getattr(loss, "reduction", None) == "sum":
        return f"nn.{type(loss).__name__}(reduction='sum')"
    if isinstance(loss, functools.partial) and loss.keywords.get("reduction") == "sum":
        name = getattr(loss.func, "__name__", type(loss.func).__name__)
        return f"functools.partial({name}, reduction='sum')"
    return None


def check_loss_reduction(loss: Any, micro_batches: int) -> None:
    """When ``fit`` starts: refuse a loss that says it sums under ``micro_batches`` > 1.

    Raises:
        SettingError: naming the loss and the fixes.
    """
    said = summed(loss) if micro_batches > 1 else None
    if said is not None:
        raise SettingError(_message(said, micro_batches))


def check_summed_value(
    loss: Callable[..., Any] | None, output: Any, target: Any, value: torch.Tensor, k: int
) -> None:
    """On a run's first micro-batch: refuse ``loss`` when ``value`` — its loss of
    ``output`` against ``target`` — is the sum of its halves' losses, not their mean.
    Outputs that are not one tensor of a row per target row are not checked.

    Raises:
        SettingError: naming the loss function and the fixes.
    """
    m = output.shape[0] if isinstance(output, torch.Tensor) and output.dim() else 0
    if loss is None or m < 2 or not _rows(target, m):
        return
    h = m // 2
    with torch.no_grad():
        out = output.detach()
        try:
            a = float(loss_of(loss, out[:h], _half(target, slice(None, h))))
            b = float(loss_of(loss, out[h:], _half(target, slice(h, None))))
        except Exception:  # a loss that needs the whole chunk (pairs of rows...): not checked
            return
        whole = float(value.detach())
    scale = max(abs(whole), 1e-12)
    as_sum, as_mean = abs(whole - (a + b)), abs(whole - (h * a + (m - h) * b) / m)
    if as_sum <= 0.01 * scale and as_mean >= 0.1 * scale:  # (the two differ by 1/3 or more)
        name = getattr(loss, "__qualname__", None) or type(loss).__name__
        lam = getattr(loss, "__name__", None) == "<lambda>"
        said = "the loss function" + (" (a lambda)" if lam else f" {name}")
        raise SettingError(_message(said, k, measured=True))


def _rows(target: Any, m: int) -> bool:
    """``target`` is None, or a tensor with a row for each of the output's ``m``."""
    return target is None or (
        isinstance(target, torch.Tensor) and target.dim() > 0 and target.shape[0] == m
    )


def _half(target: Any, rows: slice) -> Any:
    return None if target is None else target[rows]


def _message(said: str, k: int, measured: bool = False) -> str:
    how = (
        " (its value on a chunk is the sum of its values on the chunk's halves, not their mean)"
        if measured
        else ""
    )
    return (
        f"{said} sums over examples{how}, and micro_batches={k} weighs each chunk's loss by "
        f"its share of the batch — which equals the whole batch's step only for a "
        f"mean-reduced loss: with a sum, every step would be {k} times too small. Use "
        f"reduction='mean' (a sum over a batch of B examples is B times its mean: multiply "
        f"the learning rate by B for the same steps), or micro_batches=1"
    )
