"""A run's calendar: when it evaluates, and from when a pruner may stop it.

Evaluations come every N optimizer steps (``Options(eval_every_steps=)``), or at the end of
every N-th epoch (``Options(eval_every_epochs=)``, Lightning's ``check_val_every_n_epoch``);
by default at every epoch's end. One schedule a run: both at once is refused, since a step
schedule replaces the epoch ends.

``Options(min_epochs=, min_steps=)`` (Lightning's) is the floor under early stopping: a
pruner's "stop" at an evaluation before it is not acted on — the run goes on, and the pruner
is asked again at the next evaluation, whose answer counts once the floor is reached.
``epochs`` and ``max_steps`` still end the run."""

from __future__ import annotations

from typing import Any

from ..errors import SettingError
from .settings import count

__all__ = [
    "check_floor",
    "check_schedule",
    "check_schedule_fits",
    "check_steps_fit",
    "evaluates_at_epoch_end",
    "may_stop",
]


def check_schedule(every_steps: Any, every_epochs: Any) -> None:
    """``Options``' two evaluation schedules: each a whole number >= 1, at most one given."""
    if isinstance(every_steps, float) and 0 < every_steps < 1:  # Lightning's val_check_interval
        raise SettingError(
            f"Options eval_every_steps counts optimizer steps between evaluations, not a "
            f"fraction of an epoch ({every_steps!r}, as Lightning's val_check_interval); give "
            "the steps: to evaluate 4 times an epoch of 100 steps, eval_every_steps=25"
        )
    if every_steps is not None:
        count(
            "Options eval_every_steps", every_steps, hint="pass None to evaluate at each epoch end"
        )
    if every_epochs is not None:
        count(
            "Options eval_every_epochs",
            every_epochs,
            hint="pass None to evaluate at every epoch's end",
        )
    if every_steps is not None and every_epochs is not None:
        raise SettingError(
            f"Options(eval_every_steps={every_steps}, eval_every_epochs={every_epochs}) asks "
            "for two evaluation schedules, and evaluating every N steps replaces the epoch "
            "ends; pass one of them: eval_every_steps=N (every N optimizer steps) or "
            "eval_every_epochs=N (at the end of every N-th epoch)"
        )


def check_schedule_fits(every_epochs: int | None, epochs: int | None) -> None:
    """A run given ``val=`` must evaluate at least once: ``eval_every_epochs`` <= ``epochs``."""
    if every_epochs is not None and epochs is not None and every_epochs > epochs:
        raise SettingError(
            f"Options(eval_every_epochs={every_epochs}) evaluates at the end of epoch "
            f"{every_epochs}, {2 * every_epochs}..., but this Trainer trains {epochs} "
            f"epoch{'s' if epochs != 1 else ''}, so val= would never be evaluated; pass "
            f"eval_every_epochs <= {epochs}, or fit without val="
        )


def check_steps_fit(every_steps: int | None, total: int) -> None:
    """A fresh run given ``val=`` must evaluate at least once: ``eval_every_steps`` <= the
    run's optimizer steps (``total``; 0 when unknown, e.g. data without a length). (A
    resumed run may have evaluated before its checkpoint, so it is not asked.)"""
    if every_steps is not None and total and every_steps > total:
        raise SettingError(
            f"Options(eval_every_steps={every_steps}) evaluates after step {every_steps}, "
            f"{2 * every_steps}..., but this run takes {total} optimizer step"
            f"{'s' if total != 1 else ''}, so val= would never be evaluated (no best, no "
            f"pruning, no best checkpoint); pass eval_every_steps <= {total}, None to "
            "evaluate at each epoch end, or fit without val="
        )


def evaluates_at_epoch_end(options: Any, epoch: int) -> bool:
    """Whether the end of ``epoch`` (counted from 0) is an evaluation."""
    if options.eval_every_steps is not None:
        return False
    every = options.eval_every_epochs
    return every is None or (epoch + 1) % every == 0


def check_floor(min_epochs: Any, min_steps: Any, epochs: int | None, max_steps: int | None) -> None:
    """``Options(min_epochs=, min_steps=)``: whole numbers >= 0, within ``epochs``/``max_steps``."""
    hint = "it is how long early stopping waits; pass None for no minimum"
    if min_epochs is not None:
        count("Options min_epochs", min_epochs, 0, hint=hint)
        if epochs is not None and min_epochs > epochs:
            raise SettingError(
                f"Options(min_epochs={min_epochs}) is more than the Trainer's epochs={epochs}, "
                f"which end the run first; pass min_epochs <= {epochs}, or train for more epochs"
            )
    if min_steps is not None:
        count("Options min_steps", min_steps, 0, hint=hint)
        if max_steps is not None and min_steps > max_steps:
            raise SettingError(
                f"Options(min_steps={min_steps}) is more than the Trainer's "
                f"max_steps={max_steps}, which ends the run first; pass min_steps <= "
                f"{max_steps}, or raise max_steps"
            )


def may_stop(options: Any, epochs_done: int, steps_done: int) -> bool:
    """Whether a pruner may stop the run now: ``min_epochs`` and ``min_steps`` are reached."""
    return (options.min_epochs is None or epochs_done >= options.min_epochs) and (
        options.min_steps is None or steps_done >= options.min_steps
    )
