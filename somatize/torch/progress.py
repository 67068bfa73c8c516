"""A progress line on standard error: epoch, step, loss, learning rate, throughput.

On by default when standard error is a terminal (``Options(progress=...)`` decides
otherwise); no dependency: it redraws one line with a carriage return, at most
ten times a second.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from ..watchers import EpochEnd, Event, FitEnd, FitStart, Metrics, StepEnd

__all__ = ["Progress"]


class Progress:
    """Draws ``epoch 2/10 · step 120/500 · loss 0.1234 · lr 1e-03 · 5.2k ex/s``; keeps a line
    per evaluation and, when the graph remembers a node, one per epoch with what its cache
    found (``epoch 2 · cache hits: enc 100% of 10,000``).

    Args:
        stream: where to draw (default: standard error).
        interval: the shortest time between redraws, in seconds.
    """

    def __init__(self, stream: TextIO | None = None, interval: float = 0.1) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self._epochs = self._max_steps = 0
        self._last = 0.0
        self._examples = 0
        self._seconds = 0.0

    def on_event(self, event: Event) -> None:
        if isinstance(event, FitStart):
            self._epochs = event.epochs
            self._max_steps = event.total_steps or event.max_steps
        elif isinstance(event, StepEnd):
            self._examples += event.examples
            self._seconds += event.seconds
            now = time.monotonic()
            if now - self._last >= self.interval:
                self._last = now
                self._draw(event)
        elif isinstance(event, Metrics) and not event.node:  # an evaluation: one line kept
            shown = " · ".join(f"{k} {float(v):.4g}" for k, v in event.values.items())
            self.stream.write(f"\r\x1b[2Kstep {event.step} · {shown}\n")
            self.stream.flush()
        elif isinstance(event, EpochEnd) and event.cache:  # what the cache found: one line
            shown = " · ".join(
                f"{node} {c['hits'] / total:.0%} of {total:,}"
                for node, c in event.cache.items()
                if (total := c["hits"] + c["misses"])
            )
            if shown:
                self.stream.write(f"\r\x1b[2Kepoch {event.epoch + 1} · cache hits: {shown}\n")
                self.stream.flush()
        elif isinstance(event, FitEnd):
            end = " (pruned)" if event.pruned else ""
            self.stream.write(f"\r\x1b[2Kdone: {event.step} steps in {event.seconds:.1f}s{end}\n")
            self.stream.flush()

    def _draw(self, e: StepEnd) -> None:
        epoch = f"epoch {e.epoch + 1}" + (f"/{self._epochs}" if self._epochs else "")
        step = f"step {e.step}" + (f"/{self._max_steps}" if self._max_steps else "")
        rate = self._examples / self._seconds if self._seconds > 0 else 0.0
        self.stream.write(
            f"\r\x1b[2K{epoch} · {step} · loss {e.loss:.4f} · lr {e.lr:.2e} · {rate:,.0f} ex/s"
        )
        self.stream.flush()
