"""One optimizer step over one batch: forward, loss, backward (in micro-batches), step."""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..errors import NonFiniteError
from . import ddp
from .batches import chunk, num_examples, to_device

if TYPE_CHECKING:
    from .run import ActiveRun
    from .trainer import Trainer

__all__ = ["step"]


def step(
    trainer: Trainer, run: ActiveRun, batch: Any, index: int
) -> tuple[torch.Tensor, int, bool]:
    """One optimizer step over a batch (in micro-batches): its loss, size, and whether the
    optimizer stepped (False: skipped for a non-finite loss).

    Raises:
        NonFiniteError: the loss is NaN or infinite under ``Options(nonfinite="raise")``.
    """
    wrapped, opt, device, autocast = run.wrapped, run.opt, run.device, run.autocast
    x, y = trainer._split(batch)
    x, y = to_device(x, device), to_device(y, device)
    n = num_examples(x)
    opt.zero_grad(set_to_none=True)
    k = trainer.micro_batches
    if k == 1:
        if autocast is contextlib.nullcontext:  # full precision: no context to enter
            loss = trainer._loss(wrapped(x), y)
        else:
            with autocast():
                loss = trainer._loss(wrapped(x), y)
        loss.backward()
        total = loss.detach()  # the history is made float32 when it is read back
    else:
        xs = chunk(x, k)
        ys = chunk(y, k) if y is not None else [None] * len(xs)
        total = torch.zeros((), device=device)
        for i, (xc, yc) in enumerate(zip(xs, ys, strict=True)):
            share = num_examples(xc) / n  # each chunk weighs by its size: exact for mean losses
            sync = run.world == 1 or i == len(xs) - 1  # all-reduce gradients once, at the end
            with contextlib.nullcontext() if sync else wrapped.no_sync():  # type: ignore[operator]
                with autocast():
                    loss = trainer._loss(wrapped(xc), yc)
                (loss * share).backward()
            total += loss.detach().float() * share
    policy = trainer.options.nonfinite
    if policy != "ignore" and not _finite(total, run.world):
        if policy == "raise":
            s = run.state
            raise NonFiniteError(
                f"the loss is {float(total)} at step {s.step + 1} (epoch {s.epoch}, batch "
                f"{index} of the epoch); nothing was stepped or checkpointed with it. Look for "
                "a too-high learning rate or bad data, clip gradients (Options(clip_grad_norm=...)),"
                " or skip such steps with Options(nonfinite='skip')"
            )
        opt.zero_grad(set_to_none=True)
        return total, n, False
    if trainer.options.clip_grad_norm is not None:
        nn.utils.clip_grad_norm_(run.params, trainer.options.clip_grad_norm)
    opt.step()
    return total, n, True


def _finite(loss: torch.Tensor, world: int) -> bool:
    """Whether the loss is finite (on every rank: they all skip, or none does)."""
    if world == 1:
        return math.isfinite(loss.item())
    bad = torch.tensor(0.0 if math.isfinite(loss.item()) else 1.0, device=loss.device)
    return float(ddp.total(bad)) == 0.0
