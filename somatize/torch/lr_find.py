"""A learning-rate range test, ``Trainer.lr_find``: Lightning's ``Tuner.lr_find``.

A short run trains the model from where it is, the rate growing each step from
``min_lr`` to ``max_lr`` (exponentially, or linearly), and records each step's loss; it
stops early once the smoothed loss passes ``stop_at`` times the best so far, or is not
finite. The loss is smoothed as fastai and Lightning smooth it (an exponential average,
``beta=0.98``, bias corrected), and the suggestion is Lightning's: the rate where the
smoothed loss falls fastest against the rate (``torch.gradient`` with the rates as
spacing), the first 10 steps and the last left out. The model's weights, buffers and mode and the global RNG states are then put
back as they were, so a ``fit`` after it trains as it would alone.

The run is the Trainer's own (its loss, optimizer factory, precision, accumulation,
clipping, ``split``, cached nodes), without its checkpointing, watchers, pruner, EMA or
evaluations; the trainer's scheduler is replaced by the ramp. The optimizer factory's
rates are scaled so that the first parameter group follows the ramp and the others keep
their ratio to it (a backbone at a tenth of the head's rate stays at a tenth).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings
from collections.abc import Iterable, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..errors import SettingError
from ..stack import outside
from ..watchers import Event, StepEnd
from . import ddp
from .smoke import kept_as_is

if TYPE_CHECKING:
    from torch import nn

    from ..graph import Graph
    from .trainer import Trainer

__all__ = ["LRFind", "lr_find"]

BETA = 0.98  # Lightning's smoothing of the recorded loss
SKIP_BEGIN, SKIP_END = 10, 1  # the steps the suggestion leaves out, as Lightning's


@dataclass(frozen=True)
class LRFind:
    """What ``Trainer.lr_find`` found: the rate of each step taken (``lrs``), its loss
    (``raw_losses``) and the smoothed loss (``losses``, what to plot against ``lrs`` on a
    log axis); ``suggestion``, the rate of the smoothed loss's steepest descent (None when
    too few steps were taken: fewer than 13); ``stopped_early``, whether the loss
    diverged (passed ``stop_at`` times its best, or was not finite) before ``steps``."""

    lrs: list[float]
    losses: list[float]
    raw_losses: list[float]
    suggestion: float | None
    stopped_early: bool


class _Diverged(Exception):
    """Raised by the recorder to end the run (caught by ``lr_find``)."""


class _Recorder:
    def __init__(self, stop_at: float | None) -> None:
        self.stop_at = stop_at
        self.lrs: list[float] = []
        self.raw: list[float] = []
        self.smoothed: list[float] = []
        self.average, self.best = 0.0, math.inf

    def on_event(self, event: Event) -> None:
        if not isinstance(event, StepEnd):
            return
        self.lrs.append(event.lr)
        self.raw.append(event.loss)
        self.average = BETA * self.average + (1 - BETA) * event.loss
        smoothed = self.average / (1 - BETA ** len(self.raw))
        self.smoothed.append(smoothed)
        if self.stop_at is None:
            return
        if not math.isfinite(smoothed) or (
            len(self.raw) > 1 and smoothed > self.stop_at * self.best
        ):
            raise _Diverged
        self.best = min(self.best, smoothed)


def _ramp(min_lr: float, max_lr: float, steps: int, mode: str) -> Any:
    def lr(i: int) -> float:
        r = min(i, steps - 1) / (steps - 1)
        if mode == "linear":
            return min_lr + (max_lr - min_lr) * r
        return float(min_lr * (max_lr / min_lr) ** r)

    def scheduler(opt: Any) -> Any:
        import torch

        base = opt.param_groups[0]["lr"]
        if not base > 0:
            raise SettingError(
                f"lr_find scales the optimizer's rates so that its first parameter group "
                f"follows the ramp, but the optimizer factory gives that group lr={base}; "
                "give it a positive rate (any: only the ratios between groups are kept)"
            )
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda i: lr(i) / base)

    return scheduler


def suggest(losses: list[float], lrs: list[float]) -> float | None:
    """The rate where ``losses`` fall fastest against the rate (``torch.gradient`` with the
    rates as spacing, as Lightning's suggestion), the first ``SKIP_BEGIN`` steps and the
    last ``SKIP_END`` left out, and any not finite; None with fewer than two left."""
    import torch

    index = [
        i
        for i in range(SKIP_BEGIN, len(losses) - SKIP_END)
        if math.isfinite(losses[i]) and math.isfinite(lrs[i])
    ]
    if len(index) < 2:
        return None
    loss = torch.tensor([losses[i] for i in index], dtype=torch.float64)
    rate = torch.tensor([lrs[i] for i in index], dtype=torch.float64)
    slopes = torch.gradient(loss, spacing=[rate])[0]
    return lrs[index[int(torch.argmin(slopes))]]


def check_finder(min_lr: Any, max_lr: Any, steps: Any, mode: Any, stop_at: Any) -> None:
    for name, value in (("min_lr", min_lr), ("max_lr", max_lr)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise SettingError(f"lr_find({name}={value!r}) must be a positive number")
    if not min_lr < max_lr:
        raise SettingError(
            f"lr_find(min_lr={min_lr}, max_lr={max_lr}): min_lr must be below max_lr"
        )
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise SettingError(f"lr_find(steps={steps!r}) must be a whole number of steps, at least 2")
    if mode not in ("exponential", "linear"):
        raise SettingError(f"lr_find(mode={mode!r}) must be 'exponential' or 'linear'")
    if stop_at is not None and (
        isinstance(stop_at, bool) or not isinstance(stop_at, int | float) or not stop_at > 1
    ):
        raise SettingError(
            f"lr_find(stop_at={stop_at!r}) must be a number above 1 (the run stops once the "
            "smoothed loss passes stop_at times its best), or None to take every step"
        )


def lr_find(
    trainer: Trainer,
    model: Graph | nn.Module,
    train: Iterable[Any],
    *,
    min_lr: float = 1e-8,
    max_lr: float = 1.0,
    steps: int = 100,
    mode: Literal["exponential", "linear"] = "exponential",
    stop_at: float | None = 4.0,
) -> LRFind:
    """``Trainer.lr_find``: see the module's docstring."""
    from .start import as_module

    check_finder(min_lr, max_lr, steps, mode, stop_at)
    if trainer.optimizer is None:
        raise SettingError(
            "lr_find() trains, so the Trainer needs an optimizer factory: st.Trainer(..., "
            "optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3))"
        )
    if ddp.planned()[1] > 1:
        raise SettingError(
            "lr_find() runs in one process, not under torchrun (each rank would find its own "
            "rate): run it once in one process (python train.py) and train with the rate it "
            "suggests under torchrun"
        )
    recorder = _Recorder(stop_at)
    quick = copy.copy(trainer)
    quick.epochs = None if isinstance(train, Sized) else 1  # (a generator: one pass)
    quick.max_steps, quick.checkpoint, quick.pruner = steps, None, None
    quick.watchers, quick.scheduler = [recorder], _ramp(min_lr, max_lr, steps, mode)
    quick.options = dataclasses.replace(
        trainer.options,
        smoke=False,
        scheduler_every="step",
        nonfinite="ignore",  # (a non-finite loss ends the range test, not the process)
        eval_every_steps=None,
        eval_every_epochs=None,
        min_epochs=None,
        min_steps=None,
        sanity_val_batches=0,
        progress=False,
        ema=None,
        max_time=None,
    )
    stopped = False
    with kept_as_is(as_module(model)):
        try:
            quick.fit(model, train)
        except _Diverged:
            stopped = True
    found = LRFind(
        lrs=recorder.lrs,
        losses=recorder.smoothed,
        raw_losses=recorder.raw,
        suggestion=suggest(recorder.smoothed, recorder.lrs),
        stopped_early=stopped,
    )
    if found.suggestion is None:
        warnings.warn(
            f"lr_find took {len(found.lrs)} step(s){' before the loss diverged' if stopped else ''}: "
            f"too few to suggest a rate (the first {SKIP_BEGIN} and the last are left out); "
            "lower min_lr, or give it more steps or data",
            UserWarning,
            stacklevel=outside(),
        )
    return found
