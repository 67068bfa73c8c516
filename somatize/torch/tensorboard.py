"""A watcher writing TensorBoard event files: loss, learning rate, throughput, metrics.

Tags: ``train/loss``, ``train/lr``, ``train/examples_per_second`` per step;
``val/<metric>`` per evaluation (``val/loss``, ``val/acc``...); ``train/epoch`` at
each epoch end; ``node/<node>/<metric>`` for metrics nodes return in ``Done``. Needs the ``tensorboard`` package (in the ``somatize[torch]`` extra).
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import require
from ..watchers import EpochEnd, Event, FitEnd, FitStart, Metrics, StepEnd

__all__ = ["TensorBoard"]


class TensorBoard:
    """Writes a run's scalars under ``log_dir`` (readable by ``tensorboard --logdir``).

    Args:
        log_dir: the directory of the event files.
        every_steps: write step scalars every N steps (evaluations are always written).

    Example:
        >>> st.Trainer(..., watchers=[st.TensorBoard("runs/digits")])  # doctest: +SKIP
    """

    def __init__(self, log_dir: str | os.PathLike[str], *, every_steps: int = 1) -> None:
        self.log_dir = str(log_dir)
        self.every_steps = every_steps
        self._writer: Any = None
        self._start = 0

    def _w(self) -> Any:
        if self._writer is None:
            require("tensorboard", "torch")
            from torch.utils.tensorboard import SummaryWriter

            # a resumed run hides what the interrupted one logged after its checkpoint
            purge = self._start + 1 if self._start else None
            self._writer = SummaryWriter(self.log_dir, purge_step=purge)
        return self._writer

    def on_event(self, event: Event) -> None:
        if isinstance(event, FitStart):
            self._start = event.start_step
        elif isinstance(event, StepEnd):
            if event.step % self.every_steps:
                return
            w = self._w()
            w.add_scalar("train/loss", event.loss, event.step)
            w.add_scalar("train/lr", event.lr, event.step)
            if event.seconds > 0:
                w.add_scalar(
                    "train/examples_per_second", event.examples / event.seconds, event.step
                )
        elif isinstance(event, EpochEnd):
            self._w().add_scalar("train/epoch", event.epoch + 1, event.step)
        elif isinstance(event, Metrics):
            if not event.node:  # the Trainer's evaluation: always written
                for name, value in event.values.items():
                    tag = f"val/{name[4:]}" if name.startswith("val_") else name
                    self._w().add_scalar(tag, float(value), event.step)
                return
            if event.step % self.every_steps:
                return
            for name, value in event.values.items():
                self._w().add_scalar(f"node/{event.node}/{name}", float(value), event.step)
        elif isinstance(event, FitEnd) and self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __getstate__(self) -> dict[str, Any]:  # a copy in another process opens its own writer
        return {**self.__dict__, "_writer": None}
