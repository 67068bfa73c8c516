"""``TrainResult.timing``: where a fit's time went — Lightning's ``profiler="simple"``, lean.

Five parts, in seconds of ``time.perf_counter``, that add up to ``TrainResult.seconds``:

* ``data``: waiting for the next batch — the DataLoader's ``__next__``, its collate, its
  workers (started, waited for, shut down at the epoch's end), the batches a resumed
  epoch reads again to reach its position — not the move to the device;
* ``steps``: forward, backward, optimizer, the step's bookkeeping, the device move;
* ``evaluation``: validation, the sanity check's included;
* ``checkpoints``: writing them (and waiting for rank 0 to, under DDP);
* ``other``: the rest of the fit — set-up, tear-down, epoch ends.

The loops stamp the clock twice a batch (when the batch arrives and when its step is
done); evaluations and checkpoints are timed as a whole (``timed``), and a loop's steps
are its time less the rest. It is the host's clock: under CUDA, work the device still
has queued is counted where the host waits for it (each step reads its loss back unless
``Options(nonfinite="ignore")``, so it is in ``steps``).

Like ``seconds``, the timing is this ``fit`` call's, this process's: a resumed fit counts
its own time, not its checkpoint's run before it (``Options(max_time=)``, a budget, goes on
across resumes; ``timelimit.py``). Under DDP each rank's result holds its own.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Concatenate, Literal, ParamSpec, TypeVar

if TYPE_CHECKING:
    from .run import ActiveRun
    from .trainer import Trainer

__all__ = ["Timing", "timed"]

P = ParamSpec("P")
R = TypeVar("R")


class Timing:
    """Seconds a fit has spent waiting for data, in steps, evaluations and checkpoints."""

    __slots__ = ("checkpoints", "data", "evaluation", "steps")

    def __init__(self) -> None:
        self.data = self.steps = self.evaluation = self.checkpoints = 0.0

    def total(self) -> float:
        """The seconds of every part counted so far."""
        return self.data + self.steps + self.evaluation + self.checkpoints

    def parts(self, seconds: float) -> dict[str, float]:
        """``TrainResult.timing`` of a fit of ``seconds``: the parts and ``other``, the
        rest (each part was timed within the fit, so it is >= 0 up to rounding)."""
        return {
            "data": self.data,
            "steps": self.steps,
            "evaluation": self.evaluation,
            "checkpoints": self.checkpoints,
            "other": max(seconds - self.total(), 0.0),
        }


def timed(
    part: Literal["evaluation", "checkpoints"],
) -> Callable[
    [Callable[Concatenate[Trainer, ActiveRun, P], R]],
    Callable[Concatenate[Trainer, ActiveRun, P], R],
]:
    """Count the time of ``fn(trainer, run, ...)`` in ``run.timing``'s ``part``."""

    def wrap(
        fn: Callable[Concatenate[Trainer, ActiveRun, P], R],
    ) -> Callable[Concatenate[Trainer, ActiveRun, P], R]:
        @functools.wraps(fn)
        def counted(trainer: Trainer, run: ActiveRun, /, *args: P.args, **kwargs: P.kwargs) -> R:
            started = time.perf_counter()
            try:
                return fn(trainer, run, *args, **kwargs)
            finally:
                t = run.timing
                setattr(t, part, getattr(t, part) + time.perf_counter() - started)

        return counted

    return wrap
