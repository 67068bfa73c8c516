"""Evaluation inside a run: evaluate, record, tell the watchers, ask the pruner."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..watchers import Metrics, notify

if TYPE_CHECKING:
    from collections.abc import Iterable

    from .run import ActiveRun
    from .trainer import Trainer

__all__ = ["evaluate_into"]


def evaluate_into(trainer: Trainer, run: ActiveRun, val: Iterable[Any]) -> dict[str, float]:
    """Evaluate, record, tell the watchers, and ask the pruner."""
    s = run.state
    evaluated = trainer._evaluate(run.net, val, run.device, run.autocast, run.rank, run.world)
    values = {f"val_{k}": v for k, v in evaluated.items()}
    record: dict[str, float] = {"step": s.step, "epoch": s.epoch, **values}
    s.metrics.append(record)
    monitor, mode = trainer.options.monitor, trainer.options.mode
    if monitor in record:
        v = record[monitor]
        if s.best is None or (v < s.best if mode == "min" else v > s.best):
            s.best = v
    notify(run.watchers, Metrics(run.id, "", s.step, values))  # node '': the Trainer's own
    pruner = trainer.pruner
    if pruner is not None:
        name = getattr(pruner, "metric", monitor)
        if name not in record:
            raise KeyError(
                f"the pruner watches {name!r}, which evaluation does not produce; "
                f"evaluated: {', '.join(values)} (name a metric from Trainer(metrics=...))"
            )
        pruner.report(record[name], s.step)
        s.pruned = bool(pruner.should_prune())
    return record
