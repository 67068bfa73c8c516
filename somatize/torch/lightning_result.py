"""``result(trainer, lg)``: the ``TrainResult`` of a graph trained by ``lightning.Trainer``.

Re-exported by ``somatize.torch.lightning``; needs the ``lightning`` extra.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import SettingError
from . import tally
from .result import TrainResult, state_copy

if TYPE_CHECKING:
    import lightning as L

    from .lightning import LightningGraph

__all__ = ["result"]


def _pruned(trainer: L.Trainer) -> bool:
    return bool(trainer.should_stop)


def _pruned_reason(trainer: L.Trainer) -> str | None:
    """The message of the callback that stopped the run (``EarlyStopping``'s says why)."""
    if not _pruned(trainer):
        return None
    for callback in getattr(trainer, "callbacks", ()):
        message = getattr(callback, "stopping_reason_message", None)
        reason = getattr(callback, "stopping_reason", None)  # (stopped_epoch may be 0)
        if reason is not None:
            stopped = getattr(reason, "name", "") != "NOT_STOPPED"
        else:
            stopped = bool(getattr(callback, "stopped_epoch", 0))
        if message and stopped:
            return str(message)
    return "a callback set trainer.should_stop"


def _check_process(trainer: L.Trainer) -> None:
    """Refuse a trainer that fit in processes it started, asked from the one that started
    them: Lightning's launcher brings back the weights (and ``callback_metrics``), not the
    run, so a result here would be empty — weighted zero by ``fedavg``."""
    import torch.distributed as dist

    try:
        from lightning.pytorch.strategies.launchers.multiprocessing import (
            _MultiProcessingLauncher,
        )
    except ImportError:  # (another Lightning: nothing to tell)
        return
    launcher = getattr(trainer.strategy, "launcher", None)
    if not isinstance(launcher, _MultiProcessingLauncher):
        return
    if dist.is_available() and dist.is_initialized():  # (asked inside the run: a worker's)
        return
    how = getattr(launcher, "_start_method", "spawn")
    raise SettingError(
        f"result() reads the run from the LightningGraph, and this trainer fit it in "
        f'processes it started ({how!r}: strategy="ddp_spawn" or "ddp_notebook"), of '
        "which only the weights come back to this one: lg.losses, lg.history, the step, "
        "epoch and example counts are not here, and a result would say steps=0, "
        'num_examples=0 (weighted zero by fedavg). Train with strategy="ddp" launched by '
        "torchrun (torchrun --nproc_per_node=2 train.py, each process calling "
        "result(trainer, lg)), or devices=1"
    )


def result(trainer: L.Trainer, lg: LightningGraph) -> TrainResult:
    """The ``TrainResult`` of a graph trained by ``trainer.fit(lg, ...)``.

    ``state`` is named as ``module(g).state_dict()`` (no ``net.`` prefix), so results
    from either trainer average together in ``fedavg``. ``monitor``/``best`` come from
    the trainer's ``ModelCheckpoint`` when it monitors a metric, else ``val_loss``
    over ``lg.history`` (with several validation loaders the first's,
    ``val_loss/dataloader_idx_0``); ``checkpoint`` is its last checkpoint (``save_last``) or its
    best; ``pruned`` is whether a callback stopped the run (``EarlyStopping``...), and
    ``pruned_reason`` its message; ``val_examples`` the examples the last validation
    averaged over, over every rank (``fl.weighted_metrics`` weighs its metrics by them):
    ``{"val_": n}``, or with several loaders each metric's own set's count by its name.
    A ``trainer.validate(lg, ...)`` is not part of the run: it is in ``lg.validated``, not
    in ``metrics``, ``best`` or ``val_examples``.

    Raises:
        SettingError: the trainer ran the fit in processes it started
            (``strategy="ddp_spawn"``, ``"ddp_notebook"``): only the weights came back to
            this one, not the losses, history, step and example counts a result is made
            of — train with ``strategy="ddp"`` under ``torchrun``.

    Example:
        >>> trainer.fit(lg, train_loader, val_loader)  # doctest: +SKIP
        >>> r = result(trainer, lg); r.steps == trainer.global_step  # doctest: +SKIP
        True
    """
    from .lightning import LightningGraph  # imported by then: it re-exports this module

    if not isinstance(lg, LightningGraph):
        raise TypeError(
            f"result() takes the LightningGraph the trainer fit, got {type(lg).__qualname__}"
        )
    _check_process(trainer)
    ckpt = trainer.checkpoint_callback
    monitor = getattr(ckpt, "monitor", None)
    best: float | None = None
    if monitor is not None and ckpt is not None:
        score = getattr(ckpt, "best_model_score", None)
        best = float(score) if score is not None else None
    else:  # the loss; with several validation loaders, the first's (as Lightning names it)
        several = any("val_loss/dataloader_idx_0" in r for r in lg.history)
        monitor = "val_loss/dataloader_idx_0" if several else "val_loss"
        seen = [r[monitor] for r in lg.history if monitor in r]
        best = min(seen) if seen else None
    path = (
        (getattr(ckpt, "last_model_path", "") or getattr(ckpt, "best_model_path", ""))
        if ckpt
        else ""
    )
    seed = os.environ.get("PL_GLOBAL_SEED")
    return TrainResult(
        state=state_copy(lg.net.state_dict()),
        num_examples=lg.num_examples,
        steps=int(trainer.global_step),
        epochs=int(trainer.current_epoch),
        losses=list(lg.losses),
        epoch_losses=list(lg.epoch_losses),
        terms={k: list(v) for k, v in lg.terms.items()},
        epoch_terms={k: list(v) for k, v in lg.epoch_terms.items()},
        metrics=[dict(r) for r in lg.history],
        monitor=monitor,
        best=best,
        pruned=_pruned(trainer),
        pruned_reason=_pruned_reason(trainer),
        checkpoint=path or None,
        seconds=lg.seconds,
        seed=int(seed) if seed is not None else None,
        cache=lg._cache_run if lg._cache_run is not None else tally.totals(lg._tally),
        val_examples=dict(lg._val_examples),
    )
