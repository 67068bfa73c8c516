"""``Watch``: a Lightning callback telling somatize watchers what Lightning does.

Re-exported by ``somatize.torch.lightning``; needs the ``lightning`` extra.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import require
from ..watchers import EpochEnd, FitEnd, FitStart, Metrics, StepEnd, Watcher, notify
from .batches import num_examples, split
from .epoch_loss import EpochLoss
from .start import close
from .step import grad_norm

try:
    import lightning as L
except ImportError:
    require("lightning", "lightning")  # raises MissingExtraError naming the extra
    raise

__all__ = ["Watch"]


def _is_graph(pl_module: Any) -> bool:
    from .lightning import LightningGraph  # imported by then: it re-exports this module

    return isinstance(pl_module, LightningGraph)


def _pruned(trainer: L.Trainer) -> bool:
    return bool(trainer.should_stop)


def _batch_loss(
    trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any
) -> tuple[float, int, dict[str, float]]:
    """A training batch's own loss, examples and terms: a LightningGraph's as its step
    computed them (the terms of a loss function's dict); another module's
    ``outputs["loss"]``, which automatic optimisation has divided by
    ``accumulate_grad_batches``, multiplied back, and no terms."""
    if _is_graph(pl_module) and pl_module._last_batch is not None:
        loss, n, terms = pl_module._last_batch
        return float(loss), n, {k: float(v) for k, v in terms.items()}
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    k = trainer.accumulate_grad_batches if pl_module.automatic_optimization else 1
    return float(loss if loss is not None else 0.0) * k, num_examples(split(batch)[0]), {}


class Watch(L.Callback):
    """A Lightning callback telling somatize watchers what Lightning does.

    Lightning's lifecycle becomes somatize events, so the watchers of the somatize
    Trainer work unchanged: ``FitStart`` when training starts, ``StepEnd`` and node
    ``Metrics`` after each optimizer step, ``EpochEnd`` (with that epoch's validation)
    after each epoch, ``FitEnd`` when training ends. Only global rank 0 reports;
    watchers with ``close()`` are closed at the end of ``fit``.

    Under ``accumulate_grad_batches=k`` a ``StepEnd`` reports the optimizer step as the
    somatize Trainer's ``Options(accumulate=k)`` does: numbered as ``trainer.global_step``
    counts it (1, 2, ...), its loss the mean of its batches' losses weighed by their
    examples (not Lightning's ``loss / k`` that ``outputs["loss"]`` holds), its examples
    all its batches', its seconds from its first batch's start, its ``terms`` (a
    ``LightningGraph``'s loss function's dict) weighed as its loss.

    ``EpochEnd.loss`` (and ``.terms``) is the mean of the epoch's ``StepEnd`` losses weighed
    by their examples: rank 0's own under DDP, as its ``StepEnd`` (a ``LightningGraph`` logs
    ``train_loss_epoch`` over every rank's), and, in an epoch a fit resumed in the middle
    of, over the steps since it resumed.

    ``StepEnd.grad_norm`` is None unless ``log_grad_norm=True``: Lightning clips by norm
    without keeping the norm, so it takes a pass of its own over the gradients, in
    ``on_before_optimizer_step`` — where Lightning's ``grad_norm`` utility is called: after
    the scaler's unscale (fp16), before clipping, all-reduced under DDP.

    A fit resumed from a checkpoint (``ckpt_path=``) tells ``FitStart.start_step`` (its
    ``global_step``) and ``start_evaluated=True``: Lightning goes on after that step and does
    not evaluate there again, so ``JsonLines`` and ``CSVLog`` keep an evaluation logged
    there and drop what was logged after it. A fit killed before its first checkpoint and
    fitted again (``ckpt_path="last"`` finding none) starts as a fresh one (``resuming`` is
    False: Lightning does not say it was asked to resume), and a log keeps both.

    Args:
        watchers: ``TensorBoard``, ``Progress``, ``JsonLines``, ``Recorder``...
        log_grad_norm: tell each step's gradient norm (the L2 norm of every parameter's
            gradient together), as the somatize Trainer's ``Options(log_grad_norm=True)``.

    Example:
        >>> L.Trainer(callbacks=[Watch([st.TensorBoard("runs/x"), st.Progress()])])  # doctest: +SKIP
    """

    def __init__(self, watchers: Iterable[Watcher], *, log_grad_norm: bool = False) -> None:
        self.watchers = list(watchers)
        if not isinstance(log_grad_norm, bool):
            raise TypeError(
                f"Watch log_grad_norm must be True or False, not {log_grad_norm!r}; e.g. "
                "Watch([st.TensorBoard(dir)], log_grad_norm=True)"
            )
        self.log_grad_norm = log_grad_norm
        self._norm: Any = None  # the gradient norm of the step being taken (a tensor)
        bad = [
            type(w).__qualname__
            for w in self.watchers
            if not callable(getattr(w, "on_event", None))
        ]
        if bad:
            raise TypeError(
                f"Watch takes watchers (objects with on_event(event)); got {', '.join(bad)}"
            )
        self.run_id = ""
        self._started = self._tick = self._lr = 0.0
        self._lrs: tuple[float, ...] = ()
        self._on = False
        self._step = 0  # trainer.global_step after the last optimizer step reported
        self._window: list[tuple[float, int, dict[str, float]]] = []  # the step's batches
        self._epoch = EpochLoss()  # the sums of the epoch's steps told (epoch_loss.py)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.run_id = uuid.uuid4().hex[:12]
        self._started = time.perf_counter()
        self._on = trainer.is_global_zero
        self._step, self._window = trainer.global_step, []
        self._epoch = EpochLoss()  # (resumed in mid-epoch: its steps from here on)
        if self._on:
            epochs, steps, start = trainer.max_epochs or 0, trainer.max_steps, trainer.global_step
            # resumed (ckpt_path=): Lightning goes on after the step it checkpointed, and
            # neither evaluates nor ends that step's epoch again, so what a log holds there stays
            bounds = (max(epochs, 0), max(steps, 0), start)
            event = FitStart(self.run_id, *bounds, start_evaluated=start > 0)
            notify(self.watchers, event)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._window = []  # (Lightning steps on an epoch's last batch: nothing is left over)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._window:  # a batch accumulated into the step the window's first one began
            return
        self._tick = time.perf_counter()
        opt = trainer.optimizers[0] if trainer.optimizers else None
        self._lr = float(opt.param_groups[0]["lr"]) if opt is not None else 0.0  # the step's rate
        groups = opt.param_groups if opt is not None else ()
        self._lrs = tuple(float(g["lr"]) for g in groups) if len(groups) > 1 else ()

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any
    ) -> None:
        if self.log_grad_norm and self._on:
            self._norm = grad_norm(list(pl_module.parameters()))

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: Any,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if not self._on:
            return
        self._window.append(_batch_loss(trainer, pl_module, outputs, batch))
        step, epoch = trainer.global_step, trainer.current_epoch
        if step == self._step:  # accumulated: the optimizer steps on a later batch
            return
        self._step = step
        n = sum(examples for _, examples, _ in self._window)
        loss = sum(value * examples for value, examples, _ in self._window) / max(n, 1)
        terms: dict[str, float] = {}  # each weighed as the loss
        for _, examples, batch_terms in self._window:
            for name, value in batch_terms.items():
                terms[name] = terms.get(name, 0.0) + value * examples
        terms = {name: total / max(n, 1) for name, total in terms.items()}
        self._window = []
        self._epoch.add(loss, n)  # (EpochEnd.loss: rank 0's steps, as its StepEnd)
        self._epoch.add_terms(terms, n)
        seconds = time.perf_counter() - self._tick
        norm, self._norm = (None if self._norm is None else float(self._norm)), None
        told = (loss, self._lr, n, seconds, self._lrs, norm, terms)
        notify(self.watchers, StepEnd(self.run_id, step, epoch, *told))
        if _is_graph(pl_module):
            for node, values in pl_module.net.metrics.items():
                notify(self.watchers, Metrics(self.run_id, node, step, dict(values)))

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if not self._on:
            return
        epoch, step = trainer.current_epoch, trainer.global_step
        if _is_graph(pl_module):
            last = pl_module.history[-1] if pl_module.history else {}
            metrics = dict(last) if last.get("epoch") == epoch else {}
        else:  # any other LightningModule: what it logged under val_
            metrics = {
                k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val_")
            }
        evaluated = {k: v for k, v in metrics.items() if k.startswith("val_")}
        if evaluated:  # as the somatize Trainer reports its evaluations: node ''
            notify(self.watchers, Metrics(self.run_id, "", step, evaluated))
        cache = pl_module.epoch_cache() if _is_graph(pl_module) else {}
        loss, terms = self._epoch.take()
        notify(
            self.watchers,
            EpochEnd(self.run_id, epoch, step, metrics, cache, loss=loss, terms=terms),
        )

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._on:
            seconds = time.perf_counter() - self._started
            event = FitEnd(
                self.run_id, trainer.global_step, trainer.current_epoch, seconds, _pruned(trainer)
            )
            notify(self.watchers, event)
        close(self.watchers)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        close(self.watchers, exception)  # (a watcher's error: a note on the fit's own)
