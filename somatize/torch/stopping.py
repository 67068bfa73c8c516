"""``Options(stop_on=...)``: a preempted run stops at a step's end, checkpoints and exits.

A cluster preempts a job with SIGTERM (SLURM also sends ``--signal=USR1@90`` ahead of
time), then SIGKILL after a grace period. With ``stop_on`` set, ``fit`` installs a
handler for each of its signals (main thread only: Python installs handlers nowhere
else) that only notes the signal. At the end of the step under way the run stops as at
``max_time`` — its position recorded, so ``fit(resume="last")`` goes on bitwise — the
checkpoint is written (with ``checkpoint=``), watchers get ``FitEnd`` and are closed, the
previous handlers are put back, and ``fit`` raises ``SystemExit(128 + signum)``: what
the signal's default action means to a scheduler, a job that did not complete (143 for
SIGTERM), so it is requeued. A second signal while stopping is noted and ignored: the
checkpoint write is not interrupted. Under DDP, ranks stop together at one step: the
note is folded into the per-step agreement ``max_time`` makes (one small all-reduce per
step with either set; none in one process), and every rank exits with the same code.
"""

from __future__ import annotations

import contextlib
import difflib
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from ..errors import SettingError
from ..stack import outside
from . import ddp

if TYPE_CHECKING:
    from .checkpoint import Checkpointing
    from .run import ActiveRun

__all__ = ["Stop", "check_stop_on", "exit_if_stopped", "signals_of", "step_end", "stopping"]

_UNCATCHABLE = ("SIGKILL", "SIGSTOP")


def _names() -> list[str]:
    return sorted(s.name for s in signal.Signals if not s.name.startswith("SIG_"))


def _one(value: Any) -> signal.Signals:
    if isinstance(value, str):
        name = value.strip().upper()
        name = name if name.startswith("SIG") else "SIG" + name
        found: signal.Signals | None = getattr(signal.Signals, name, None)
        if found is None:
            close = difflib.get_close_matches(name, _names(), n=3)
            hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
            raise SettingError(
                f"Options stop_on={value!r} names no signal of this system; {hint}e.g. "
                "stop_on='SIGTERM', or ('SIGTERM', 'SIGUSR1') for SLURM's --signal=USR1@90"
            )
        return found
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingError(
            f"Options stop_on must be a signal (signal.SIGTERM), its name ('SIGTERM') or a "
            f"tuple of them, not {value!r}; e.g. stop_on='SIGTERM' or "
            "stop_on=('SIGTERM', 'SIGUSR1'), or None to install nothing"
        )
    try:
        return signal.Signals(value)
    except ValueError:
        raise SettingError(
            f"Options stop_on={value!r} is no signal number of this system; pass "
            "signal.SIGTERM or a name, e.g. stop_on='SIGTERM'"
        ) from None


def signals_of(value: Any) -> tuple[signal.Signals, ...]:
    """``Options.stop_on`` as signals, in order, each once: () for None."""
    if value is None:
        return ()
    values = value if isinstance(value, tuple) else (value,)
    if not values:
        raise SettingError(
            "Options stop_on=() names no signal; pass None to install nothing, or e.g. "
            "stop_on='SIGTERM'"
        )
    out: list[signal.Signals] = []
    for v in values:
        s = _one(v)
        if s.name in _UNCATCHABLE:
            raise SettingError(
                f"Options stop_on={value!r} holds {s.name}, which no process can catch (it "
                "stops or kills at once); pass the signal a scheduler sends first, e.g. "
                "stop_on='SIGTERM' (SLURM and Kubernetes send it before SIGKILL)"
            )
        if s not in out:
            out.append(s)
    return tuple(out)


def check_stop_on(value: Any) -> None:
    """``Options(stop_on=...)``: None, or signals that can be caught, by number or name."""
    signals_of(value)


class Stop:
    """The signals a fit stops on, and the one it got (0: none yet)."""

    __slots__ = ("installed", "received", "signals", "stopped")

    def __init__(self, signals: tuple[signal.Signals, ...]) -> None:
        self.signals = signals
        self.received = 0  # the first signal this process got during the fit
        self.stopped = 0  # the signal the run stopped on (under DDP: agreed by every rank)
        self.installed = False

    def note(self, signum: int, frame: Any) -> None:
        if not self.received:  # (a second signal while stopping changes nothing)
            self.received = signum


@contextlib.contextmanager
def stopping(stop_on: Any, checkpoint: Checkpointing | None) -> Iterator[Stop | None]:
    """For the length of a fit: a handler noting each of ``stop_on``'s signals, the
    previous handlers put back however the fit ends. None without ``stop_on``."""
    signals = signals_of(stop_on)
    if not signals:
        yield None
        return
    stop = Stop(signals)
    if checkpoint is None:
        warnings.warn(
            f"Options(stop_on={stop_on!r}) without checkpoint=: on a signal the run stops "
            "cleanly and exits, but nothing is saved, so its steps are lost; pass "
            "checkpoint=st.Checkpointing(dir) and fit(..., resume='last') in the requeued job",
            UserWarning,
            stacklevel=outside(),
        )
    if threading.current_thread() is not threading.main_thread():
        warnings.warn(
            f"Options(stop_on={stop_on!r}): fit() runs outside the main thread, where Python "
            "cannot install a signal handler, so nothing is installed and a signal acts as "
            "it would without stop_on; call fit() from the main thread",
            UserWarning,
            stacklevel=outside(),
        )
        yield stop  # (still takes part in the ranks' agreement: each rank asks the same)
        return
    previous = {s: signal.getsignal(s) for s in signals}
    try:
        for s in signals:
            signal.signal(s, stop.note)
        stop.installed = True
        yield stop
    finally:
        for s, handler in previous.items():  # (None: one set outside Python; the default)
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def step_end(run: ActiveRun) -> None:
    """After each step, with ``max_time`` or ``stop_on`` set: whether the budget is spent,
    whether a signal came — under DDP, on any rank, so that all stop at this step."""
    deadline, stop = run.deadline, run.stop
    up = deadline is not None and time.monotonic() >= deadline
    signum = stop.received if stop is not None else 0
    if run.world > 1:
        flags = ddp.largest(torch.tensor([1.0 if up else 0.0, float(signum)]))
        up, signum = bool(flags[0] > 0), int(flags[1])
    run.timed_out = up
    if signum and stop is not None:
        run.stopped = stop.stopped = signum


def exit_if_stopped(stop: Stop | None) -> None:
    """Once the fit has ended and the handlers are back: a run a signal stopped (or that
    got one after its last step) leaves with the exit status the signal would have given."""
    if stop is None:
        return
    signum = stop.stopped or stop.received
    if signum:
        raise SystemExit(128 + signum)
