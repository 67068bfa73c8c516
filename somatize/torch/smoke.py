"""A smoke run, ``Options(smoke=True)`` (or ``smoke=N``): Lightning's ``fast_dev_run``.

``fit`` trains one epoch of N batches (N = 1 for True) and evaluates N batches of each
validation set once at its end, reading and writing no checkpoint and telling no watcher,
and returns the ``TrainResult``. ``resume=`` is checked as the real run would check it
(the value; ``"last"`` needs a ``Checkpointing``; a named checkpoint must be there; a
fresh start must not be over an earlier run's checkpoints) but not read. The model's weights and buffers, its mode and the global
RNG states are then put back as they were, so a smoke run costs the real run nothing:
``fit`` after it trains exactly as ``fit`` alone would. ``evaluate`` and ``predict`` read
the first N batches of their data, so a whole script runs in seconds.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError, SettingError

if TYPE_CHECKING:
    from torch import nn

    from ..graph import Graph
    from .result import TrainResult
    from .trainer import Trainer

__all__ = ["check_resume", "check_smoke", "kept_as_is", "smoke_batches", "smoke_fit"]


def check_smoke(value: Any) -> None:
    """``Options(smoke=...)``: True, False, or a whole number of batches (0: off)."""
    if isinstance(value, bool):
        return
    if not isinstance(value, int) or value < 0:
        raise SettingError(
            f"Options(smoke={value!r}) must be True (one batch of training and of each "
            "validation set), a whole number N of batches (smoke=3), or False"
        )


def smoke_batches(options: Any) -> int | None:
    """The batches a smoke run reads of each data (None: not a smoke run)."""
    return int(options.smoke) if options.smoke else None


def check_resume(trainer: Trainer, resume: Any) -> None:
    """``fit(resume=...)`` under a smoke run: refused where the real run would refuse it,
    without reading the checkpoint."""
    from .policy import check_fresh, resume_path

    path = resume_path(trainer, resume)  # the value, and "last" without a Checkpointing
    if path is None:  # a fresh start, refused over an earlier run's checkpoints
        check_fresh(trainer)
    if path is not None and not path.is_file():
        raise CheckpointError(
            f"fit(resume={str(resume)!r}) under Options(smoke=...): no checkpoint at {path}, "
            "so the real run would fail to resume (a smoke run checks that it is there but "
            "does not read it); pass resume='last' or the path of a checkpoint file"
        )


def smoke_fit(
    trainer: Trainer,
    model: Graph | nn.Module,
    train: Iterable[Any],
    val: Iterable[Any] | None,
    resume: Any = None,
) -> TrainResult:
    """``fit`` under ``Options(smoke=N)``: see the module's docstring."""
    from .settings import check_fit
    from .start import as_module

    check_fit(trainer, val)  # the real run's settings, which the smoke run lifts, hold too
    check_resume(trainer, resume)
    n = int(trainer.options.smoke)
    quick = copy.copy(trainer)
    quick.epochs, quick.max_steps, quick.checkpoint, quick.watchers = 1, None, None, []
    quick.options = dataclasses.replace(
        trainer.options,
        smoke=False,
        limit_train_batches=n,
        limit_val_batches=n,
        eval_every_steps=None,
        eval_every_epochs=None,
        min_epochs=None,
        min_steps=None,
        sanity_val_batches=0,  # the smoke run's one evaluation is the check
        progress=False,
    )
    with kept_as_is(as_module(model)):
        return quick.fit(model, train, val)


@contextlib.contextmanager
def kept_as_is(net: nn.Module) -> Iterator[None]:
    """The module's weights, buffers and mode and the global RNG states, put back as they
    were however the block ends (a smoke run's, ``lr_find``'s)."""
    import torch

    from .rng import put_back, snapshot

    kept = {k: v.detach().to("cpu", copy=True) for k, v in net.state_dict().items()}
    mode = {m: m.training for m in net.modules()}
    rng = snapshot()
    try:
        yield
    finally:
        with torch.no_grad():
            net.load_state_dict(kept)
        for m, training in mode.items():
            m.training = training
        put_back(rng)
