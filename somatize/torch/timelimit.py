"""``Options(max_time=...)``: a run's budget of training time (Lightning's ``max_time``).

The time counts from the start of a fresh run's training and goes on across resumes:
every checkpoint holds the seconds trained so far (``payload["elapsed"]``), so a run killed
and resumed stops where one uninterrupted run would have, near the same total. It is
checked after each optimizer step, so a fresh run takes at least one step however small
its budget; once it is spent, the run stops there, as at ``max_steps`` — stopped
mid-epoch, it evaluates once more where the epoch's end would have (``loop.py``), the
last checkpoint is written (with ``checkpoint=``), ``fit`` returns with
``TrainResult.timed_out`` True, and ``fit(resume="last")`` with a larger budget goes on
bitwise from there; with the same budget it takes no step. Under DDP, ranks stop
together: a rank whose clock says the time is spent stops them all at that step (one
small all-reduce per step, only with a budget or ``stop_on`` set: ``stopping.step_end``).
"""

from __future__ import annotations

import datetime
import math
import re
import time
from typing import Any

from ..errors import SettingError

__all__ = ["Clock", "check_max_time", "seconds_of", "spent_before"]

_DHMS = re.compile(r"^(\d+):(\d{1,2}):(\d{1,2}):(\d{1,2})$")  # Lightning's "DD:HH:MM:SS"


def seconds_of(value: Any) -> float | None:
    """``Options.max_time`` in seconds: a number of seconds, a ``datetime.timedelta``, or
    Lightning's ``"DD:HH:MM:SS"`` string; None for no budget."""
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, str):
        m = _DHMS.match(value.strip())
        if m is None:
            raise ValueError(value)
        days, hours, minutes, seconds = (int(g) for g in m.groups())
        return ((days * 24 + hours) * 60 + minutes) * 60.0 + seconds
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(value)
    return float(value)


def check_max_time(value: Any) -> None:
    """``Options(max_time=...)`` is a positive, finite duration."""
    try:
        seconds = seconds_of(value)
    except (TypeError, ValueError):
        raise SettingError(
            f"Options max_time must be a number of seconds, a datetime.timedelta or "
            f"Lightning's 'DD:HH:MM:SS' string, not {value!r}; e.g. max_time=3600, "
            "max_time=timedelta(hours=1) or max_time='00:01:00:00'"
        ) from None
    if seconds is not None and not (seconds > 0 and math.isfinite(seconds)):
        raise SettingError(
            f"Options max_time={value!r} is {seconds} seconds: a budget of training time "
            "is above 0 and finite; pass None for no budget"
        )


class Clock:
    """Seconds a run has trained: those of earlier fits (from its checkpoint) and this one's
    since its training began (``start``)."""

    __slots__ = ("before", "since")

    def __init__(self, before: float = 0.0) -> None:
        self.before = before
        self.since: float | None = None

    def start(self) -> None:
        self.since = time.monotonic()

    def spent(self) -> float:
        return self.before + (time.monotonic() - self.since if self.since is not None else 0.0)

    def deadline(self, budget: float | None) -> float | None:
        """The ``time.monotonic()`` at which ``budget`` seconds in all are spent."""
        if budget is None or self.since is None:
            return None
        return self.since + budget - self.before


def restored(payload: dict[str, Any]) -> Clock:
    """The clock a checkpoint left (0 seconds in one from before they were kept)."""
    elapsed = payload.get("elapsed", 0.0)
    ok = isinstance(elapsed, (int, float)) and not isinstance(elapsed, bool)
    return Clock(float(elapsed) if ok and math.isfinite(elapsed) and elapsed >= 0 else 0.0)


def spent_before(clock: Clock, budget: float | None) -> bool:
    """Whether earlier fits of a resumed run spent the budget, so this one takes no step.
    The time this fit trains is read only after each step, so a fresh run takes at least
    one, however small its budget. (Every rank restores the same seconds, so all agree.)"""
    return budget is not None and clock.before >= budget
