"""Metrics: functions for ``Trainer(metrics={...})`` and the evaluation that averages them.

A metric is ``fn(output, target) -> scalar``, a mean over the batch; evaluation
weighs each batch by its number of examples, so a smaller last batch weighs less.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from . import ddp
from .batches import epoch_batches, num_examples, to_device

__all__ = ["accuracy", "evaluate"]


def accuracy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The fraction of rows whose highest logit is the target class.

    Example:
        >>> accuracy(torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([1, 1]))
        tensor(0.5000)
    """
    return (output.argmax(dim=-1) == target).float().mean()


def evaluate(
    net: nn.Module,
    data: Iterable[Any],
    fns: Mapping[str, Callable[[Any, Any], Any]],
    *,
    split: Callable[[Any], tuple[Any, Any]],
    device: torch.device,
    autocast: Callable[[], Any],
    rank: int = 0,
    world: int = 1,
) -> dict[str, float]:
    """Each of ``fns`` on ``net``'s outputs over ``data``, averaged over examples (and ranks).

    Runs in eval mode under ``torch.no_grad()`` and restores the module's mode. Under
    DDP each rank takes every ``world``-th batch, none dropped, and the sums are reduced.
    Values are summed on the device: no synchronisation per batch.
    """
    was_training = net.training
    net.eval()
    names = list(fns)
    dtype = torch.float32 if device.type == "mps" else torch.float64
    sums = torch.zeros(len(names) + 1, dtype=dtype, device=device)  # the last counts examples
    try:
        with torch.no_grad():
            for batch in epoch_batches(data, 0, 0, False, rank, world, even=False):
                x, y = split(batch)
                x, y = to_device(x, device), to_device(y, device)
                with autocast():
                    out = net(x)
                n = num_examples(x)
                for j, name in enumerate(names):
                    sums[j] += _scalar(fns[name](out, y), name) * n
                sums[-1] += n
    finally:
        net.train(was_training)
    if world > 1:
        sums = ddp.total(sums)
    values = sums.tolist()
    if values[-1] == 0:
        raise ValueError("the evaluation data yielded no batches: pass at least one batch")
    return {name: values[j] / values[-1] for j, name in enumerate(names)}


def _scalar(value: Any, name: str) -> Any:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(
                f"{name!r} must give one number per batch (a mean), got a tensor of shape "
                f"{tuple(value.shape)}; reduce it, e.g. with .mean()"
            )
        return value.detach().reshape(())
    return float(value)
