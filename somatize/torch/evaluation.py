"""Evaluation inside a run: evaluate, record, tell the watchers, ask the pruner."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

from ..errors import SettingError, add_note
from ..watchers import Metrics, notify
from . import ddp
from .carry import reset
from .ema import swapped
from .schedule import may_stop
from .timing import timed
from .valsets import warn_dropped

if TYPE_CHECKING:
    from .run import ActiveRun
    from .trainer import Trainer

__all__ = ["evaluate_into", "rank_checkpoint"]


@timed("evaluation")  # TrainResult.timing
def evaluate_into(
    trainer: Trainer, run: ActiveRun, *, epoch_end: bool = False, final: bool = False
) -> dict[str, float]:
    """Evaluate every validation set of the run (``run.val_sets``, see ``valsets.py``),
    record, tell the watchers, and ask the pruner (``epoch_end``: the epoch
    ``run.state.epoch`` has ended, for ``Options(min_epochs=)``). ``final``: the run stops
    after it (out of time): recorded and ranked, but no plateau stepped, no pruner asked."""
    s = run.state
    kept = [c.value for c in run.carries]  # training's carried state, given back afterwards
    values: dict[str, float] = {}
    counted: list[int] = []  # each set's examples (this rank's), for TrainResult.val_examples
    paused = run.tally.paused() if run.tally is not None else contextlib.nullcontext()
    with paused, swapped(run.average):  # Options(ema=): the average is what is evaluated
        if run.world > 1:  # rank 0's model (its average's buffers too) on every rank's share
            ddp.broadcast_buffers(run.net)
        for vs in run.val_sets or ():
            reset(run.carries)  # each set's evaluation starts afresh
            counted.append(0)
            if run.rank == 0 and not run.carries:  # (carried state: drop_last is the fix)
                warn_dropped(vs.data, f"val set {vs.name!r}" if vs.name else "val=", vs.limit)
            try:
                evaluated = trainer._evaluate(
                    run.net, vs.data, run.device, run.autocast, run.rank, run.world, vs.limit,
                    counted=counted,
                )  # fmt: skip
            except Exception as e:
                where = f"val set {vs.name!r}" if vs.name else "the validation set"
                add_note(e, f"(raised evaluating {where} after step {s.step})")
                raise
            named = {f"{vs.prefix}{k}": v for k, v in evaluated.items()}
            if values.keys() & named.keys():  # (fit() checked the loss's and metrics' names)
                _collide(sorted(values.keys() & named.keys()), vs.name)
            values.update(named)
    for c, value in zip(run.carries, kept):
        c.value = value
    if run.world > 1 and counted:  # every rank's share, in one reduction for all sets
        counted = [int(n) for n in ddp.total(torch.tensor(counted)).tolist()]
    s.val_examples = {vs.prefix: n for vs, n in zip(run.val_sets or (), counted)}
    record: dict[str, float] = {"step": s.step, "epoch": s.epoch, **values}
    s.metrics.append(record)
    monitor, mode = s.monitor, s.mode  # (Options' as this fit reads them: begin.py)
    v = record.get(monitor)
    if v is None:  # fit() checked the names it knows; a node metric is known only now
        raise KeyError(
            f"Options(monitor={monitor!r}) names a metric evaluation does not produce; "
            f"evaluated: {', '.join(values)} (set Options(monitor=...) to one of them)"
        )
    if v == v:  # NaN never ranks
        if s.best is None or (v < s.best if mode == "min" else v > s.best):
            s.best = v
        keep = trainer.checkpoint.best if trainer.checkpoint is not None else 0
        if keep:
            run.due = rank_checkpoint(s.ranked, v, s.step, keep, mode)
    if run.plateau and not final:
        run.sched.step(v)
    notify(run.watchers, Metrics(run.id, "", s.step, values))  # node '': the Trainer's own
    pruner = trainer.pruner
    if pruner is not None and not final:
        name = getattr(pruner, "metric", monitor)
        if name not in record:
            raise KeyError(
                f"the pruner watches {name!r}, which evaluation does not produce; "
                f"evaluated: {', '.join(values)} (name a metric from Trainer(metrics=...))"
            )
        pruner.report(record[name], s.step)
        # below Options(min_epochs=, min_steps=) a "stop" is not acted on (schedule.py)
        s.pruned = bool(pruner.should_prune()) and may_stop(
            trainer.options, s.epoch + epoch_end, s.step
        )
    return record


def _collide(names: list[str], name: str) -> None:
    """Two validation sets whose evaluated names collide (a loss's term ``b_recon`` of set
    ``a`` and ``recon`` of set ``a_b``: both ``val_a_b_recon``)."""
    raise SettingError(
        f"val set {name!r} evaluates {', '.join(map(repr, names))}, which an earlier val set "
        "evaluates too; rename a set (or the term or metric) so every evaluated name is its own"
    )


def rank_checkpoint(
    ranked: list[list[float]], value: float, step: int, keep: int, mode: str
) -> bool:
    """Enter ``[value, step]`` into the ``keep`` best (best first); whether it ranks.

    Ties keep the earlier checkpoint ahead, as Lightning's ``ModelCheckpoint`` does.
    """
    ranked[:] = [r for r in ranked if r[1] != step]  # a step evaluated again counts once
    sign = 1.0 if mode == "min" else -1.0
    ranked.append([value, step])
    ranked.sort(key=lambda r: (sign * r[0], r[1]))
    del ranked[keep:]
    return any(r[1] == step for r in ranked)
