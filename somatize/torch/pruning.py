"""Pruners: the Trainer asks, the pruner answers.

A pruner is any object with ``report(value, step)`` and ``should_prune()``. The
Trainer reports the monitored metric after each evaluation and asks whether to
stop; the pruner never drives the loop. An Optuna ``Trial`` fits as it is.

Pruners that keep state across evaluations (``Patience``) also offer
``state_dict()``/``load_state_dict()`` so a resumed run decides exactly as an
uninterrupted one would.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Literal, Protocol, runtime_checkable

from ..errors import SettingError
from ..stack import outside
from .options import improves
from .ported import ported
from .settings import count

__all__ = ["Patience", "Pruner", "Threshold", "pruned_reason"]


@runtime_checkable
class Pruner(Protocol):
    """The shape of a pruner (an ``optuna.trial.Trial`` matches it)."""

    def report(self, value: float, step: int) -> None: ...

    def should_prune(self) -> bool: ...


class Patience:
    """Early stopping: prune when ``metric`` has not improved for ``patience`` evaluations.

    As Lightning's ``EarlyStopping``: each evaluation that does not improve on the best
    counts, an improvement resets the count, and the run stops when the count reaches
    ``patience`` — so ``patience=0`` stops at the first evaluation that does not improve.
    A NaN or infinite value stops the run at once (``check_finite=True``, as
    ``EarlyStopping``'s default): a diverged run does not recover by waiting.

    Args:
        metric: the metric to watch (``"val_loss"``, ``"val_acc"``, ...).
        patience: evaluations without improvement before stopping (a whole number >= 0).
        mode: ``"min"`` if lower is better, ``"max"`` if higher is better; None (the
            default): ``"min"``. Left unset on a metric whose name says it rises
            (``"val_acc"``, ``"val_f1"``...), it warns, as ``Options(mode=)`` does; on the
            Trainer's ``Options.monitor`` while ``Options(mode="max")``, it is refused when
            ``fit`` starts (say which you mean).
        min_delta: the smallest change that counts as an improvement (a number >= 0).
        check_finite: stop when the value is NaN or infinite (False: such a value is one
            more evaluation that does not improve, and ``-inf`` under ``"min"`` a best).

    Attributes:
        reason: why ``should_prune()`` answers yes, in words (the value and the best so
            far), or None while it answers no; ``TrainResult.pruned_reason`` holds it.

    Raises:
        SettingError: ``metric`` is not a name, or ``patience`` or ``min_delta`` out of range.

    Warns:
        UserWarning: ``mode`` is left unset on a metric whose name says it improves by
            rising: the run would stop while it improves.

    Example:
        >>> p = Patience("val_loss", patience=2)
        >>> for step, v in enumerate([1.0, 0.9, 0.95, 0.91]):
        ...     p.report(v, step)
        >>> p.should_prune()
        True
    """

    def __init__(
        self,
        metric: str = "val_loss",
        *,
        patience: int = 3,
        mode: Literal["min", "max"] | None = None,
        min_delta: float = 0.0,
        check_finite: bool = True,
    ) -> None:
        if not isinstance(metric, str) or not metric:
            fix = (
                f"Patience(patience={metric!r})"
                if isinstance(metric, int)
                else "Patience('val_loss')"
            )
            raise SettingError(
                f"Patience's first argument is the name of the metric to watch, not "
                f"{metric!r}; e.g. {fix} (the metric defaults to 'val_loss'; patience is "
                "keyword-only)"
            )
        if mode not in ("min", "max", None):  # (as Options(mode=) refuses it)
            raise SettingError(
                f"Patience mode must be 'min' or 'max', not {mode!r}: 'min' when lower is "
                "better (a loss), 'max' when higher is (an accuracy)"
            )
        count("Patience patience", patience, 0, hint="it is how many evaluations may not improve")
        if (
            isinstance(min_delta, bool)
            or not isinstance(min_delta, (int, float))
            or not 0 <= min_delta < math.inf
        ):
            raise SettingError(
                f"Patience min_delta must be a finite number >= 0, not {min_delta!r}; it is "
                "the smallest change that counts as an improvement (0: any change)"
            )
        if not isinstance(check_finite, bool):
            raise SettingError(
                f"Patience check_finite must be True or False, not {check_finite!r}; True "
                "stops the run at a NaN or infinite value, as Lightning's EarlyStopping does"
            )
        self.metric, self.patience, self.min_delta = metric, patience, float(min_delta)
        self.mode: Literal["min", "max"] = mode if mode is not None else "min"
        self.mode_given = mode is not None  # fit() refuses a default "min" on a "max" monitor
        if not self.mode_given:
            _check_default_mode(metric)
        self.check_finite = check_finite
        self.best: float | None = None
        self.bad = 0
        self.reason: str | None = None

    def report(self, value: float, step: int) -> None:
        value = float(value)
        best = f"{self.best:.6g}" if self.best is not None else "none yet"
        if self.check_finite and not math.isfinite(value):
            # as EarlyStopping: a stop of its own, the count of evaluations left as it is
            self.reason = f"{self.metric} = {value} at step {step} is not finite (best {best})"
            return
        better = (
            self.best is None
            or (self.mode == "min" and value < self.best - self.min_delta)
            or (self.mode == "max" and value > self.best + self.min_delta)
        )
        if better and not math.isnan(value):
            self.best, self.bad = value, 0
        else:
            self.bad += 1
        self.reason = None
        if self.bad > 0 and self.bad >= self.patience:  # only ever after a non-improvement
            self.reason = (
                f"{self.metric} did not improve for {self.bad} evaluation"
                f"{'s' if self.bad != 1 else ''} (best {best}, min_delta {self.min_delta:g})"
            )

    def should_prune(self) -> bool:
        return self.reason is not None

    def state_dict(self) -> dict[str, Any]:
        # metric and mode: what ``best`` means, checked when a run resumes (resumed_monitor.py)
        state = {"best": self.best, "bad": self.bad, "reason": self.reason}
        return {**state, "metric": self.metric, "mode": self.mode}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.bad = state["best"], state["bad"]
        # a checkpoint from before ``reason``: the count decides, as it did then
        patient = self.bad > 0 and self.bad >= self.patience
        fallback = f"{self.metric} did not improve for {self.bad} evaluations" if patient else None
        self.reason = state.get("reason", fallback)


class Threshold:
    """Prune as soon as ``metric`` is worse than a bound (e.g. a diverging loss).

    Args:
        metric: the metric to watch.
        upper: prune when the value exceeds it (or is NaN).
        lower: prune when the value falls below it.

    Attributes:
        reason: the value that crossed the bound, in words (None until one does).
    """

    def __init__(
        self, metric: str = "val_loss", *, upper: float | None = None, lower: float | None = None
    ) -> None:
        if upper is None and lower is None:
            raise ValueError(
                f"Threshold({metric!r}) needs an upper or a lower bound, and was given neither; "
                f"e.g. st.Threshold({metric!r}, upper=10.0) prunes a run once it passes 10"
            )
        self.metric, self.upper, self.lower = metric, upper, lower
        self.tripped = False
        self.reason: str | None = None

    def report(self, value: float, step: int) -> None:
        value = float(value)
        if self.tripped:
            return
        if math.isnan(value):
            self.reason = f"{self.metric} = nan at step {step}"
        elif self.upper is not None and value > self.upper:
            self.reason = f"{self.metric} = {value:.6g} at step {step} is above {self.upper:g}"
        elif self.lower is not None and value < self.lower:
            self.reason = f"{self.metric} = {value:.6g} at step {step} is below {self.lower:g}"
        self.tripped = self.reason is not None

    def should_prune(self) -> bool:
        return self.tripped

    def state_dict(self) -> dict[str, Any]:
        return {"tripped": self.tripped, "reason": self.reason, "metric": self.metric}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tripped = state["tripped"]
        self.reason = state.get(
            "reason", f"{self.metric} crossed a bound" if self.tripped else None
        )


def _check_default_mode(metric: str) -> None:
    """Warn when a ``Patience`` left at its default ``"min"`` watches a metric whose name
    says it improves by rising (``options.improves``, the rule ``Options(mode=)`` warns by)."""
    if improves(metric) == "max":
        warnings.warn(
            f"Patience({metric!r}) leaves mode at its default 'min', but the name says "
            f"{metric} improves by rising: the run would stop while it improves (and say it "
            f"'did not improve'); pass Patience({metric!r}, mode='max') (or mode='min' if "
            "that is what you mean)",
            UserWarning,
            stacklevel=outside(),
        )


def pruned_reason(pruner: Any) -> str:
    """Why ``pruner`` stopped a run: its ``reason`` when it gives one (``Patience``,
    ``Threshold``), else its class (an Optuna ``Trial``: "pruned by Trial")."""
    reason = getattr(pruner, "reason", None)
    return str(reason) if reason else f"pruned by {type(pruner).__qualname__}"


def check_study_direction(pruner: Any, monitor: str, mode: str) -> None:
    """An Optuna ``Trial`` (a pruner with a ``study``) is told ``Options.monitor``; its
    study's direction must be the way ``Options.mode`` says that metric improves. The
    other way round, the study's pruner ranks each trial's values upside down — a
    ``MedianPruner`` prunes the best trials and keeps the worst — and nothing fails.

    The trial must also be fresh: see ``check_fresh_trial``.

    Raises:
        SettingError: naming the direction, the monitor and its mode, and the fix.
    """
    if getattr(pruner, "metric", None) is not None:
        return  # a pruner of its own metric (Patience, Threshold): not a study's trial
    check_fresh_trial(pruner)
    try:
        directions = list(pruner.study.directions)
    except Exception:  # no study, or one that does not say: nothing to compare
        return
    if len(directions) != 1:
        return  # a multi-objective study: Optuna refuses report() itself
    way = {"MAXIMIZE": "max", "MINIMIZE": "min"}.get(str(getattr(directions[0], "name", "")))
    if way is None or way == mode:
        return
    wanted = "maximize" if way == "max" else "minimize"
    other = "minimize" if way == "max" else "maximize"
    example = (
        "Options(monitor='val_acc', mode='max')"
        if way == "max"
        else ("Options(monitor='val_loss', mode='min')")
    )
    raise SettingError(
        f"pruner={type(pruner).__qualname__}: its study has direction={wanted!r}, but the "
        f"Trainer reports {monitor!r} to it, which Options(monitor={monitor!r}, mode={mode!r}) "
        f"says improves by {'falling' if mode == 'min' else 'rising'}: the study's pruner "
        "would prune the best trials and keep the worst. Report the metric the study "
        f"optimizes, with its mode (e.g. {example}), or create the study with "
        f"direction={other!r}"
    )


def check_fresh_trial(pruner: Any) -> None:
    """An Optuna ``Trial`` prunes one fit: a second fit given the same trial (the next seed
    of a configuration) reports at the steps the first reported, which Optuna ignores with
    a warning per step, while ``should_prune()`` still answers from the first fit's values —
    at its last step, not this fit's — so the second fit is pruned, or kept, for the first
    one's curve, and the study never sees its own.

    Raises:
        SettingError: the trial already holds reported values, naming the trial, the
            steps and the fix.
    """
    try:  # (Optuna's Trial: its storage and id; anything else is not checked)
        steps = sorted(pruner.storage.get_trial(pruner._trial_id).intermediate_values)
    except Exception:
        return
    if not steps:
        return
    held = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]} … {steps[-1]}"
    number = getattr(pruner, "number", "?")
    raise SettingError(
        f"pruner={type(pruner).__qualname__} {number} already holds values reported at "
        f"{held} by an earlier fit (another seed of the same configuration?): Optuna ignores "
        "a second report at a step, and its pruner would judge this fit by the earlier one's "
        "values. Give the trial to one fit only — pruner=trial for the first seed, "
        "pruner=None for the others, and return the seeds' mean — or ask a trial per fit"
    )


Patience.__init__ = ported("Patience")(Patience.__init__)  # type: ignore[method-assign]
