"""A watcher writing TensorBoard event files: loss, learning rate, throughput, metrics.

Tags: ``train/loss``, ``train/lr`` (and ``train/lr/group<i>`` for each parameter group
after the first), ``train/examples_per_second`` per step, and ``train/grad_norm`` when
``StepEnd`` tells it (``Options(clip_grad_norm=)`` or ``log_grad_norm=True``), and
``train/<term>`` for each term of a loss function's dict (``StepEnd.terms``);
``val/<metric>`` per evaluation (``val/loss``, ``val/recon``, ``val/acc``...); ``train/epoch``,
``train/epoch_loss`` (the epoch's mean training loss, ``EpochEnd.loss``: Lightning's
``train_loss_epoch``) and ``train/epoch_<term>`` for each term, for each remembered node
``cache/<node>/hit_rate`` (its epoch's ``EpochEnd.cache``), and ``time/data`` and
``time/steps`` (the epoch's seconds waiting for batches and in steps) and ``time/epoch``
(its wall seconds since the previous epoch ended) at each epoch end;
``node/<node>/<metric>`` for metrics nodes return in ``Done`` during training (and
``node/<node>/epoch_<metric>``, the epoch's mean, ``EpochEnd.node_metrics``, at its end),
``val/<node>/<metric>`` during evaluation. With ``hparams=``, the run's
hyper-parameters go to TensorBoard's HParams view as it starts (its end is marked when it
ends), where tensorboard shows beside them each run's last value of every scalar.
Under DDP rank 0 writes, and ``train/loss`` and ``train/examples_per_second`` are over
all ranks as ``StepEnd`` says. ``writer``, the run folder's ``SummaryWriter``, takes what it does
not write (images, histograms). Needs the ``tensorboard`` package (in the ``somatize[torch]`` extra).
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
import warnings
from collections.abc import Mapping
from functools import cache
from time import monotonic
from typing import Any

from ..errors import require
from ..stack import outside
from ..watchers import EpochEnd, Event, FitEnd, FitStart, Metrics, StepEnd
from .claims import Claim, claim
from .ported import ported
from .settings import count
from .tensorboard_hparams import flat_hparams, session

__all__ = ["TensorBoard"]

_HOLD_SECONDS = 1.0  # how far behind the training the event file may be


class TensorBoard:
    """Writes a run's scalars under ``log_dir`` (readable by ``tensorboard --logdir``).

    Args:
        log_dir: the directory of the event files, one run's own: a fresh run into one that
            holds earlier event files warns, and so does a run that starts while another
            writes there (clients run in parallel: give each a sub-folder).
        every_steps: write step scalars every N steps (evaluations are always written).
        hparams: the run's hyper-parameters, shown with the final metrics in the HParams
            view, from the run's start on: a dict, an ``argparse.Namespace`` or a dataclass
            instance. As Lightning logs them, nested ones become ``outer/inner`` columns,
            numpy scalars and one-element tensors numbers, and any other value that is not a
            number, string or bool its ``str``.

    Example:
        >>> st.Trainer(..., watchers=[st.TensorBoard("runs/digits", hparams={"lr": 3e-3})])  # doctest: +SKIP
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        *,
        every_steps: int = 1,
        hparams: Any = None,  # a dict, an argparse.Namespace or a dataclass instance
    ) -> None:
        if not isinstance(log_dir, (str, os.PathLike)):
            raise TypeError(
                f"TensorBoard takes the directory to log to, not {log_dir!r}; e.g. "
                "st.TensorBoard('runs/tb')"
            )
        if os.path.exists(log_dir) and not os.path.isdir(log_dir):  # (a FileExistsError at step 1)
            raise NotADirectoryError(
                errno.ENOTDIR,
                f"TensorBoard takes a directory for its event files, and {os.fspath(log_dir)} "
                "is a file; pass a directory, e.g. st.TensorBoard('runs/tb')",
            )
        count(
            "TensorBoard every_steps", every_steps, hint="e.g. st.TensorBoard(dir, every_steps=10)"
        )
        self.log_dir = str(log_dir)
        self.every_steps = every_steps
        self.hparams = flat_hparams(hparams)  # (a wrong kind is refused here, not at step 1)
        self._writer: Any = None
        self._fitting = False  # between a fit's FitStart and close(): its writer marks a START
        self._claim: Claim | None = None  # log_dir, while this run writes there (claims.py)
        self._start, self._resuming = 0, False
        self._made: list[str] = []  # folders the claim made, deepest first (removed if empty)
        self._held: list[tuple[Any, int]] = []  # (summary, step) not handed to the writer yet
        self._handed = 0.0  # when they last were (monotonic seconds)
        self._epoch_began: float | None = None  # the fit's start, then the last epoch's end
        # whether log_dir held event files before ``writer`` opened one outside a fit (None:
        # not opened since the last fit started): the next fit's "earlier run" is not it
        self._earlier: bool | None = None

    def _w(self) -> Any:
        if self._writer is None:
            require("tensorboard", "torch")
            from torch.utils.tensorboard import SummaryWriter

            # A fit's writer begins with a START at its first step: tensorboard hides what the
            # folder's earlier files hold from there on (an interrupted run's steps after its
            # checkpoint, a run restarted without one). Its Python loader honours a START only
            # after an earlier one, so a fresh run writes one too. Outside a fit (``writer``
            # after it ended) none: it would hide the run's own steps.
            purge = self._start + 1 if self._fitting else None
            if not self._fitting and self._earlier is None:
                self._earlier = _has_events(self.log_dir)
            self._writer = SummaryWriter(self.log_dir, purge_step=purge)
        return self._writer

    @property
    def writer(self) -> Any:
        """The ``torch.utils.tensorboard.SummaryWriter`` of this run's folder, for what the
        watcher does not write itself — images, histograms, text, figures (Lightning's
        ``logger.experiment``): ``tb.writer.add_image("samples", grid, step)``. Give the
        Trainer's step (``StepEnd.step``, ``EpochEnd.step``, ``result.steps``): tensorboard
        draws every tag of a folder on that axis. Opened on first use: during a fit, the
        watcher's own writer (from a watcher of yours listed after it); before or after the
        fit, one that appends to the folder, hiding nothing (the next fit opens its own, and
        does not take that one's file for an earlier run's)."""
        return self._w()

    def on_event(self, event: Event) -> None:
        if isinstance(event, FitStart):
            self._start, self._resuming = event.start_step, event.resuming
            self._epoch_began = time.perf_counter()  # (the clock of TrainResult.timing)
            if self._writer is not None and not self._fitting:  # (``writer`` used before)
                self._writer.close()  # the fit's own writer marks where its steps begin
                self._writer = None
            self._fitting = True
            earlier, self._earlier = self._earlier, None  # (before ``writer`` wrote, if it did)
            if self._claim_folder():
                warnings.warn(
                    f"TensorBoard: another run is writing into {self.log_dir} at this moment "
                    "(clients or trials run in parallel with one log_dir): tensorboard draws "
                    "both runs' event files as one run, their curves over each other. Give "
                    "each run a folder of its own — a sub-folder per client, e.g. "
                    f"st.TensorBoard(f'{_posix(self.log_dir)}/client{{i}}')",
                    RuntimeWarning,
                    stacklevel=outside(),  # (the user's fit call, not the watcher's caller)
                )
            elif (
                not self._start
                and not self._resuming
                and self._writer is None
                and (_has_events(self.log_dir) if earlier is None else earlier)
            ):
                warnings.warn(
                    f"TensorBoard: {self.log_dir} already holds the event files of an earlier "
                    "run, and this one starts afresh from step 1: tensorboard shows this run's "
                    "steps and hides the earlier run's (its files stay). Give each run a "
                    f"log_dir of its own (a sub-folder per run of a sweep, e.g. "
                    f"st.TensorBoard(f'{_posix(self.log_dir)}/lr={{lr}}'), per federated "
                    f"client: st.TensorBoard(f'{_posix(self.log_dir)}/client{{i}}')), or "
                    "remove the old files",
                    RuntimeWarning,
                    stacklevel=outside(),
                )
            if self.hparams:  # from the start: a run still training, or one that failed, shows
                self._w().file_writer.add_summary(session(self.hparams))
        elif isinstance(event, StepEnd):
            if event.step % self.every_steps:
                return
            step = {"train/loss": event.loss, "train/lr": event.lr}
            for i, lr in enumerate(event.lrs[1:], 1):  # parameter groups after the first
                step[f"train/lr/group{i}"] = lr
            if event.grad_norm is not None:  # (clip_grad_norm or log_grad_norm)
                step["train/grad_norm"] = event.grad_norm
            for name, value in event.terms.items():  # a loss function's terms
                step[f"train/{name}"] = value
            if event.seconds > 0:
                step["train/examples_per_second"] = event.examples / event.seconds
            self._scalars(step, event.step)
        elif isinstance(event, EpochEnd):
            epoch: dict[str, float] = {"train/epoch": event.epoch + 1}
            if event.loss is not None:  # the epoch's mean (Lightning's train_loss_epoch)
                epoch["train/epoch_loss"] = event.loss
                for name, value in event.terms.items():
                    epoch[f"train/epoch_{name}"] = value
            for node, means in event.node_metrics.items():  # its node metrics' means
                for name, value in means.items():
                    epoch[f"node/{node}/epoch_{name}"] = value
            if event.data or event.steps:  # where the epoch's time went (0.0: not measured)
                epoch["time/data"], epoch["time/steps"] = event.data, event.steps
            if self._epoch_began is not None:  # (None: told no FitStart)
                now = time.perf_counter()
                epoch["time/epoch"], self._epoch_began = now - self._epoch_began, now
            for node, c in event.cache.items():
                if total := c["hits"] + c["misses"]:
                    epoch[f"cache/{node}/hit_rate"] = c["hits"] / total
            self._scalars(epoch, event.step)
        elif isinstance(event, Metrics):
            if not event.node:  # the Trainer's evaluation: always written
                self._scalars({_tag(k): v for k, v in event.values.items()}, event.step)
            elif not event.step % self.every_steps:
                values = event.values.items()
                self._scalars({f"node/{event.node}/{k}": v for k, v in values}, event.step)
        elif isinstance(event, FitEnd):
            self._hand_over()
            if self.hparams:
                self._w().file_writer.add_summary(session(None))
            if self._writer is not None:
                self._writer.flush()

    def _scalars(self, values: Mapping[str, Any], step: int) -> None:
        """``values`` (tag -> number) at ``step``, as one event (``add_scalar`` made one per
        value), handed to the writer with the others of the last second: its thread woke for
        each event, which cost more CPU than writing it (see docs/trainer.md, watchers)."""
        if not values:
            return
        summary = _summary_type()
        value = summary.Value
        made = [value(tag=tag, simple_value=float(v)) for tag, v in values.items()]
        self._held.append((summary(value=made), step))
        if monotonic() - self._handed >= _HOLD_SECONDS:
            self._hand_over()

    def _hand_over(self) -> None:
        """Give the writer the events held back."""
        if self._held:
            add = self._w().file_writer.add_summary
            for summary, step in self._held:
                add(summary, step)
            self._held.clear()
        self._handed = monotonic()

    def flush(self) -> None:
        """Write out what the writer holds: a checkpoint is about to cover its steps."""
        self._hand_over()
        if self._writer is not None:
            self._writer.flush()

    def _claim_folder(self) -> bool:
        """Claim ``log_dir`` for this run's writer until ``close()``; True when another run
        holds it now (one writing into it in parallel, which no file shows yet)."""
        if self._claim is not None:  # (this watcher's own, from an earlier event)
            return False
        made, d = [], os.path.abspath(self.log_dir)
        while not os.path.exists(d) and os.path.dirname(d) != d:  # (what makedirs will make)
            made.append(d)
            d = os.path.dirname(d)
        with contextlib.suppress(OSError):  # (else the writer says why it cannot write there)
            os.makedirs(self.log_dir, exist_ok=True)
        self._made = made
        self._claim, busy = claim(self.log_dir)
        return busy

    def close(self) -> None:
        try:
            self._hand_over()  # (a failed run's last steps too)
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        finally:
            self._fitting = False
            if self._claim is not None:
                self._claim.release()
                self._claim = None
            for d in getattr(self, "_made", ()):  # a run failed before its first event: no folder
                try:
                    os.rmdir(d)  # (only while empty)
                except OSError:
                    break
            self._made = []

    def __getstate__(self) -> dict[str, Any]:  # a copy in another process opens its own writer
        return {**self.__dict__, "_writer": None, "_claim": None, "_held": [], "_made": []}


def _tag(name: str) -> str:
    """The tag of the Trainer's evaluated metric ``name``: ``val_acc`` -> ``val/acc``."""
    return f"val/{name[4:]}" if name.startswith("val_") else name


@cache
def _summary_type() -> Any:
    """tensorboard's ``Summary`` message (imported once, not at each step)."""
    from tensorboard.compat.proto.summary_pb2 import Summary  # type: ignore[import-untyped]

    return Summary


def _posix(log_dir: str) -> str:
    """``log_dir`` as a path in an example: forward slashes, no trailing one."""
    return log_dir.replace(os.sep, "/").rstrip("/") or "/"


def _has_events(log_dir: str) -> bool:
    """Whether ``log_dir`` holds TensorBoard event files already."""
    try:
        return any(n.startswith("events.out.tfevents.") for n in os.listdir(log_dir))
    except OSError:  # not there yet
        return False


TensorBoard.__init__ = ported("TensorBoard")(TensorBoard.__init__)  # type: ignore[method-assign]
