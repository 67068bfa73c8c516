"""What a run plans, and the LR schedulers built for fewer steps than that.

``planned_steps`` counts the optimizer steps a fit takes as planned (Lightning's
``trainer.estimated_stepping_batches``): the batches an epoch takes (this rank's share
under DDP, at most ``Options(limit_train_batches=)``) in groups of ``Options(accumulate=)``,
times ``epochs``, at most ``max_steps``. The Trainer steps a scheduler after each of them,
or after each epoch with ``Options(scheduler_every="epoch")`` (as Lightning steps a bare
scheduler); a pruner or ``Options(max_time=)`` may end the run sooner.

A scheduler sized for fewer steps goes wrong in the middle of the run: past its ``T_max`` a
``CosineAnnealingLR`` climbs back up (a cycling rate), a ``PolynomialLR`` — or a
``LinearLR`` that decays — stays at its end rate, and a ``OneCycleLR`` raises past its
``total_steps``. A fresh run warns of the first and refuses the last before its first step
(``check_horizon``); a resumed run, whose scheduler's horizon comes from its checkpoint,
warns when it is shorter than the run (``check_restored``). ``CosineAnnealingWarmRestarts``
restarts on purpose, and a ``LinearLR`` warm-up ends on purpose: neither is warned about.

Composed schedulers are looked into: in a ``SequentialLR`` the last scheduler runs from the
last milestone to the end of the run (the earlier ones end at their milestones, on
purpose), and in a ``ChainedScheduler`` every scheduler runs the whole run.

A scheduler with no such length (a ``StepLR``, ``ExponentialLR``...), or one whose lengths
fit, is then replayed for a decay that is over early, as one sized in epochs but stepped
every optimizer step decays (``decay.py``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ..errors import SettingError
from ..stack import outside
from .decay import check_decay
from .limits import batches_per_epoch, steps_per_epoch

if TYPE_CHECKING:
    from .run import ActiveRun
    from .trainer import Trainer

__all__ = [
    "Part",
    "check_horizon",
    "check_restored",
    "horizon",
    "optimizer_steps",
    "parts",
    "scheduler_steps",
    "total_steps",
]

_HORIZONS = ("total_steps", "T_max", "total_iters")  # OneCycleLR, CosineAnnealingLR, LinearLR...
_lr = torch.optim.lr_scheduler


class Part(NamedTuple):
    """One length a scheduler was built for: ``sched.key == built`` ends the rate's plan
    at step ``start + built`` of the run (``start``: a ``SequentialLR``'s last milestone)."""

    sched: Any
    key: str
    built: int
    start: int
    where: str  # how to name it: "the CosineAnnealingLR", "the SequentialLR's CosineAnnealingLR"


def parts(sched: Any, start: int = 0, outer: str = "") -> list[Part]:
    """The lengths ``sched`` was built for: its own ``total_steps``, ``T_max`` or
    ``total_iters``, or those of what it composes (see the module's docstring)."""
    inner = getattr(sched, "_schedulers", None)
    name = f"{outer}{type(sched).__name__}"
    if isinstance(sched, _lr.SequentialLR) and inner:
        milestones = list(getattr(sched, "_milestones", ()))
        last = milestones[-1] if milestones else 0
        return parts(inner[-1], start + last, f"{name}'s ")
    if isinstance(sched, _lr.ChainedScheduler) and inner:
        return [p for s in inner for p in parts(s, start, f"{name}'s ")]
    return [
        Part(sched, k, v, start, f"the {name}")
        for k in _HORIZONS
        if isinstance(v := getattr(sched, k, None), int) and not isinstance(v, bool)
    ]


def horizon(sched: Any) -> dict[str, int]:
    """The steps of the run at which each length ``sched`` was built for ends, by name."""
    return {f"{p.where}'s {p.key}": p.start + p.built for p in parts(sched)}


def optimizer_steps(trainer: Trainer, train: Iterable[Any], rank: int, world: int) -> int | None:
    """The optimizer steps a fit of ``train`` plans on ``rank`` of ``world`` (each rank steps
    once per step of the run): None when neither the data's length nor ``max_steps`` says."""
    per_epoch = _per_epoch(trainer, train, rank, world)
    by_data = (
        per_epoch * trainer.epochs if per_epoch is not None and trainer.epochs is not None else None
    )
    bounds = [n for n in (by_data, trainer.max_steps) if n is not None]
    return min(bounds) if bounds else None


def scheduler_steps(trainer: Trainer, train: Iterable[Any], rank: int, world: int) -> int | None:
    """How often a fit of ``train`` plans to step its scheduler (None when the data cannot
    say): once per optimizer step, or with ``Options(scheduler_every="epoch")`` once per
    epoch that runs to its end (``max_steps`` may end the run within one)."""
    if trainer.options.scheduler_every != "epoch":
        return optimizer_steps(trainer, train, rank, world)
    per_epoch = _per_epoch(trainer, train, rank, world)
    if trainer.max_steps is None or not per_epoch:
        return trainer.epochs
    ended = trainer.max_steps // per_epoch
    return ended if trainer.epochs is None else min(trainer.epochs, ended)


def _per_epoch(trainer: Trainer, train: Iterable[Any], rank: int, world: int) -> int | None:
    o = trainer.options
    limit = batches_per_epoch(
        "limit_train_batches", o.limit_train_batches, train, rank, world, even=True
    )
    return steps_per_epoch(train, limit, o.accumulate, rank, world)


def total_steps(trainer: Trainer, train: Iterable[Any], world: int) -> int:
    """``FitStart.total_steps``: the optimizer steps the run plans in all, 0 when unknown
    (no length, or several ranks)."""
    return (optimizer_steps(trainer, train, 0, 1) or 0) if world == 1 else 0


def check_horizon(trainer: Trainer, run: ActiveRun, train: Iterable[Any]) -> None:
    """Before a fresh run's first step: its scheduler is built for as many steps as the run
    plans (see the module's docstring).

    Raises:
        SettingError: a ``OneCycleLR`` whose ``total_steps`` is fewer, which torch would
            raise at in mid-run; naming both counts and the fix.
    """
    sched = run.sched
    if sched is None or run.plateau:
        return
    planned = scheduler_steps(trainer, train, run.rank, run.world)
    if planned is None:
        return
    warned = False
    for p in parts(sched):
        if p.start + p.built >= planned:
            continue
        said = (
            f"{p.where} was built for {p.key}={p.built}"
            + (f" from step {p.start}" if p.start else "")
            + f", but this run steps it {planned} times ({_how(trainer)})"
        )
        fix = _fix(trainer, p.key, planned - p.start, p.start)
        if isinstance(p.sched, _lr.OneCycleLR):
            raise SettingError(
                f"{said}; torch raises once it is stepped past total_steps, in the middle of the "
                f"run. {fix}"
            )
        wrong = _goes_wrong(p.sched, p.start + p.built, planned)
        if wrong is not None:
            warnings.warn(f"{said}: {wrong}. {fix}", UserWarning, stacklevel=outside())
            warned = True
    if not warned and trainer.options.scheduler_every == "step":  # sized in epochs? (decay.py)
        check_decay(sched, run.opt, planned, _per_epoch(trainer, train, run.rank, run.world))


def check_restored(
    trainer: Trainer, run: ActiveRun, path: Path, fresh: dict[str, int], planned: int | None
) -> None:
    """Warn when the scheduler restored from ``path`` was built for fewer steps than this
    run plans (``planned``, or what the freshly built one was sized for: ``fresh``): because
    the run is longer than the one that wrote the checkpoint, or because the scheduler
    factory builds it that short for this run too (then the fix is the factory's)."""
    for p in parts(run.sched):
        ends = p.start + p.built
        name = f"{p.where}'s {p.key}"
        wanted = max(fresh.get(name, 0), planned or 0)
        if ends < wanted and not (
            not isinstance(p.sched, _lr.OneCycleLR) and _goes_wrong(p.sched, ends, wanted) is None
        ):  # (a warm-up that ends on purpose is not warned about, as in a fresh run)
            at = f" from step {p.start}" if p.start else ""
            said = (
                f"{p.where} restored from {path} was built for {p.key}={p.built}{at}, but "
                f"this run plans {wanted}"
            )
            if fresh.get(name) == ends:  # built as short now: not the resume's doing
                why = (
                    "; the scheduler factory builds it so for this run too, so it ends before "
                    "the run does, resumed or not. "
                    + _fix(trainer, p.key, wanted - p.start, p.start)
                )
            else:
                why = (
                    "; the checkpoint's schedule is kept (it may end, or raise, before the run "
                    "does). Resume into a run of the same length, or start a fresh one for the "
                    "longer schedule"
                )
            warnings.warn(said + why, UserWarning, stacklevel=outside())


def _how(trainer: Trainer) -> str:
    if trainer.options.scheduler_every == "epoch":
        return "once after each epoch, Options(scheduler_every='epoch')"
    return "once after each optimizer step, the default"


def _fix(trainer: Trainer, key: str, planned: int, start: int) -> str:
    left = f" (what is left after its milestone {start})" if start else ""
    if trainer.options.scheduler_every == "epoch":
        return f"Size it in epochs: {key}={planned}{left}"
    given = "gives the run's steps" if start else "gives it"
    return (
        f"Size it in optimizer steps, {key}={planned}{left} (trainer.planned_steps(train) "
        f"{given}), or step it once an epoch as Lightning steps a scheduler by default: "
        f"Options(scheduler_every='epoch') with {key} in epochs"
    )


def _goes_wrong(sched: Any, built: int, planned: int) -> str | None:
    """What the rate does past the scheduler's horizon, where that is not what it is for."""
    rest = planned - built
    if isinstance(sched, _lr.CosineAnnealingLR):
        return (
            f"its rate falls to eta_min at step {built} and then climbs back up, cycling "
            "(for restarts on purpose use CosineAnnealingWarmRestarts)"
        )
    if isinstance(sched, _lr.PolynomialLR):
        return f"its rate reaches 0 at step {built} and stays there for the other {rest}"
    if isinstance(sched, _lr.LinearLR) and sched.end_factor < sched.start_factor:
        return (
            f"its rate decays to end_factor={sched.end_factor} of lr at step {built} and "
            f"stays there for the other {rest}"
        )
    return None
