"""A ``LightningGraph``'s epoch losses: ``lg.epoch_losses``, ``result(trainer, lg).epoch_losses``.

Each finished training epoch's mean loss, as ``st.Trainer`` defines it (``epoch_loss.py``):
``sum(loss * examples) / sum(examples)`` over the epoch's optimizer steps — each step's
loss the mean over its batches' examples (under ``accumulate_grad_batches``, as
``lg.losses`` holds it) — summed in float64, a step after the other; under DDP over every
rank's steps (one all-reduce of the two sums at the epoch's end, so every rank holds the
same list). It is the mean ``train_loss_epoch`` logs, which Lightning computes on the
device in float32 from the batches (the two agree to float32's precision).

Lightning keeps no running sums in its checkpoints: in an epoch a fit resumed in the middle
of, ``train_loss_epoch`` is over the steps since the resume, and so is that epoch's entry
here (the somatize Trainer checkpoints its sums and reports the uninterrupted run's). An
epoch that took no step is NaN (``epoch_loss.recorded``), so that entry ``e`` is epoch ``e``'s.

Used by ``somatize.torch.lightning``; needs the ``lightning`` extra there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from .epoch_loss import recorded

if TYPE_CHECKING:
    from .lightning import LightningGraph

__all__ = ["mean", "step_loss"]


def step_loss(group: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, int] | None:
    """An optimizer step's loss and examples from its batches' ``(loss, examples)``, as
    st.Trainer records it: under ``accumulate_grad_batches``, the batches' losses weighed by
    their examples (summed as st.Trainer sums them: the same float, the same order). None
    for no batch."""
    if len(group) == 1:
        return group[0]
    if not group:
        return None
    n = sum(size for _, size in group)
    total = torch.zeros((), device=group[0][0].device)
    for loss, size in group:
        total += loss.float() * (size / n)
    return total, n


def mean(lg: LightningGraph, steps: Sequence[tuple[torch.Tensor, int]]) -> float:
    """The epoch's mean loss over ``steps``, each ``(loss, examples)`` (a 0-d tensor on the
    device, read back here, once an epoch); under DDP every rank's (collective: called on
    every rank at the epoch's end)."""
    total, examples = 0.0, 0
    if steps:
        values = torch.stack([loss.float() for loss, _ in steps]).cpu().tolist()
        for value, (_, n) in zip(values, steps, strict=True):
            total += value * n  # (as EpochLoss.add: the same floats, the same order)
            examples += n
    if lg.trainer.world_size > 1:
        sums = torch.tensor([total, examples], dtype=torch.float64, device=lg.device)
        total, summed = lg.trainer.strategy.reduce(sums, reduce_op="sum").tolist()
        examples = round(summed)
    return recorded(total / examples if examples else None)
