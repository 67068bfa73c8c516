"""A progress line on standard error: epoch, step, loss, learning rate, throughput, time left.

On by default when standard error is a terminal (``Options(progress=...)`` decides
otherwise); no dependency. On a terminal it redraws one line with a carriage return, at
most ten times a second; on anything else (a file, a pipe, a CI log) it writes plain
lines instead — one at each epoch's end (and every N steps with ``every_steps=N``), one
per evaluation, one with each epoch's mean loss, one at the end — with no control codes.
"""

from __future__ import annotations

import io
import sys
import time
from typing import TextIO

from ..watchers import EpochEnd, Event, FitEnd, FitStart, Metrics, StepEnd

__all__ = ["Progress"]

# an epoch's wait for data is shown from this share of its training time, and this long
_DATA_SHARE, _DATA_SECONDS = 0.2, 1.0


def _terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (ValueError, OSError):  # a closed or detached stream
        return False


class Progress:
    """Draws ``epoch 2/10 · step 120/500 · loss 0.1234 · lr 1e-03 · 5.2k ex/s · eta 1:05``
    (the time left at the fit's pace so far, when its steps are planned); keeps a line
    per evaluation, one per epoch with its mean training loss (``epoch 2 · mean loss
    0.1450``: ``EpochEnd.loss``, Lightning's ``train_loss_epoch``) and, when the graph
    remembers a node, one per epoch with what its cache found (``epoch 2 · cache hits: enc
    100% of 10,000``), and one when the epoch's training waited for its batches a fifth
    of its time or more, a second at least (``epoch 2 · waiting for data: 38% of training
    time``: the DataLoader holds the steps back). A step
    that tells its gradient norm (``Options(clip_grad_norm=)`` or ``log_grad_norm=True``)
    shows it after the loss (``loss 0.1234 · grad norm 1.52``), and a loss function's terms
    follow the loss (``loss 0.1234 recon 0.1 kl 0.234``).

    Args:
        stream: where to draw (default: standard error).
        interval: the shortest time between redraws, in seconds (on a terminal).
        redraw: redraw one line in place (``\\r`` and an erase code) — None: when ``stream``
            is a terminal. Otherwise each line is written once, plainly.
        every_steps: without redrawing, also write a line every N steps (else one an epoch).
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        interval: float = 0.1,
        *,
        redraw: bool | None = None,
        every_steps: int | None = None,
    ) -> None:
        from ..errors import SettingError
        from .settings import count

        if every_steps is not None:
            count("Progress every_steps", every_steps, hint="pass None for a line an epoch")
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval < 0:
            raise SettingError(
                f"Progress interval is the shortest time between redraws in seconds, a "
                f"number >= 0, not {interval!r}; e.g. st.Progress(interval=0.5)"
            )
        if isinstance(stream, io.RawIOBase | io.BufferedIOBase):  # (bytes: fails mid-fit)
            raise TypeError(
                f"Progress draws text, and {stream!r} is a binary stream; pass a text one, "
                "e.g. st.Progress(sys.stdout), not sys.stdout.buffer"
            )
        if stream is not None and not callable(getattr(stream, "write", None)):
            raise TypeError(
                f"Progress takes a text stream to draw on (with write), not {stream!r}; "
                "e.g. st.Progress(sys.stdout), or st.Progress() for standard error"
            )
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.redraw = _terminal(self.stream) if redraw is None else redraw
        self.every_steps = every_steps
        self._clear = "\r\x1b[2K" if self.redraw else ""
        self._epochs = self._max_steps = 0
        self._last = 0.0
        self._examples = 0
        self._seconds = 0.0
        self._step: StepEnd | None = None  # the last step not yet written (plain lines)
        self._start = 0  # the step the fit resumed from (FitStart.start_step)
        self._began = 0.0  # when the fit started (monotonic seconds)

    def on_event(self, event: Event) -> None:
        if isinstance(event, FitStart):
            self._epochs = event.epochs
            self._max_steps = event.total_steps or event.max_steps
            self._start = event.start_step  # (resumed: the steps before are not this fit's)
            # (a watcher reused for another fit, a sweep's next run: that fit's alone)
            self._examples, self._seconds, self._step, self._last = 0, 0.0, None, 0.0
            self._began = time.monotonic()
        elif isinstance(event, StepEnd):
            self._examples += event.examples
            self._seconds += event.seconds
            if self.redraw:
                now = time.monotonic()
                if now - self._last >= self.interval:
                    self._last = now
                    self._write(self._line(event))
            elif self.every_steps and event.step % self.every_steps == 0:
                self._write(self._line(event) + "\n")
                self._step = None
            else:
                self._step = event
        elif isinstance(event, Metrics) and not event.node:  # an evaluation: one line kept
            self._flush_step()
            shown = " · ".join(f"{k} {float(v):.4g}" for k, v in event.values.items())
            self._write(f"{self._clear}step {event.step} · {shown}\n")
        elif isinstance(event, EpochEnd):
            self._flush_step()
            if event.loss is not None:  # the epoch's mean training loss: one line
                terms = "".join(f" {k} {v:.4g}" for k, v in event.terms.items())
                self._write(
                    f"{self._clear}epoch {event.epoch + 1} · mean loss {event.loss:.4f}{terms}\n"
                )
            shown = " · ".join(
                f"{node} {c['hits'] * 100 // total}% of {total:,}"  # (99.8% is not 100%)
                for node, c in event.cache.items()
                if (total := c["hits"] + c["misses"])
            )
            if shown:  # what the cache found: one line
                self._write(f"{self._clear}epoch {event.epoch + 1} · cache hits: {shown}\n")
            trained = event.data + event.steps
            if event.data >= max(_DATA_SHARE * trained, _DATA_SECONDS):  # a slow DataLoader
                share = f"{event.data / trained:.0%}"
                self._write(
                    f"{self._clear}epoch {event.epoch + 1} · waiting for data: {share} of "
                    "training time\n"
                )
        elif isinstance(event, FitEnd):
            self._flush_step()
            end = " (pruned)" if event.pruned else ""
            resumed = f" ({event.step - self._start} in this fit)" if self._start else ""
            self._write(
                f"{self._clear}done: {event.step} steps{resumed} in {event.seconds:.1f}s{end}\n"
            )

    def _flush_step(self) -> None:
        """Without redrawing, write the step not yet written (the epoch's last, say)."""
        if self._step is not None:
            self._write(self._line(self._step) + "\n")
            self._step = None

    def _line(self, e: StepEnd) -> str:
        epoch = f"epoch {e.epoch + 1}" + (f"/{self._epochs}" if self._epochs else "")
        step = f"step {e.step}" + (f"/{self._max_steps}" if self._max_steps else "")
        rate = self._examples / self._seconds if self._seconds > 0 else 0.0
        norm = f" · grad norm {e.grad_norm:.3g}" if e.grad_norm is not None else ""
        terms = "".join(f" {k} {v:.4g}" for k, v in e.terms.items())  # (in the loss's part)
        return (
            f"{self._clear}{epoch} · {step} · loss {e.loss:.4f}{terms}{norm} · lr {e.lr:.2e} · "
            f"{rate:,.0f} ex/s{self._left(e.step)}"
        )

    def _left(self, step: int) -> str:
        """`` · eta 1:05``: the steps left at this fit's pace so far (wall time since it
        started, its evaluations included, as tqdm's); nothing without a planned end."""
        done = step - self._start
        if not self._max_steps or done <= 0 or step >= self._max_steps:
            return ""
        left = round((time.monotonic() - self._began) / done * (self._max_steps - step))
        hours, rest = divmod(left, 3600)
        clock = (
            f"{hours}:{rest // 60:02d}:{rest % 60:02d}"
            if hours
            else f"{rest // 60}:{rest % 60:02d}"
        )
        return f" · eta {clock}"

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()
