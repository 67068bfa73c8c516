"""``RunState``: where a run stands — its counters, losses, evaluations and what a resume
needs besides modules, optimizer and RNG (``checkpoint.capture`` writes it down,
``checkpoint.restore`` reads it back)."""

from __future__ import annotations

from typing import Any

import torch

from . import ddp
from .epoch_loss import EpochLoss, recorded
from .epoch_metrics import EpochMetrics, flat
from .loss_terms import Terms, record_terms

__all__ = ["RunState"]


class RunState:
    """Where a run stands: what a checkpoint restores besides modules, optimizer and RNG."""

    def __init__(self) -> None:
        self.step = self.epoch = self.position = self.examples_seen = 0
        self.epoch_examples: int | None = None  # the first epoch's, all ranks (limits.one_epoch)
        self.val_examples: dict[str, int] = {}  # the last evaluation's examples, by set prefix
        self.losses: list[float] = []
        self.pending: list[torch.Tensor] = []  # step losses not yet read back from the device
        self.pending_examples: list[int] = []  # their steps' examples (this rank's)
        # a loss function's terms per step, as long as losses (loss_terms.record_terms)
        self.terms: dict[str, list[float]] = {}
        self.pending_terms: list[Terms] = []  # the pending steps' terms, not read back either
        self.epoch_losses: list[float] = []  # each finished epoch's mean (epoch_loss.py)
        self.epoch_terms: dict[str, list[float]] = {}  # ... and its terms', as long
        self.epoch_loss = EpochLoss()  # the running sums of the epoch in progress
        # each node metric's mean of every finished epoch, "<node>/<metric>" -> a list as
        # long as epoch_losses, and the sums of the epoch in progress (epoch_metrics.py)
        self.epoch_metrics: dict[str, list[float]] = {}
        self.metric_sums = EpochMetrics()
        self.saved_metric_sums: Any = None  # a checkpoint's, every rank's (loop.train)
        self.metrics: list[dict[str, float]] = []
        self.best: float | None = None
        # what best and ranked are values of: this run's Options(monitor=, mode=)
        self.monitor, self.mode = "val_loss", "min"
        self.pruned = False
        self.ranked: list[list[float]] = []  # [value, step] of the best checkpoints, best first
        self.last_finite: int | None = None  # the step of the newest checkpoint with finite weights
        self.skipped = 0  # steps skipped for a non-finite loss
        self.epoch_rng: Any = None  # every RNG state as the epoch began (rng.snapshot)
        self.epoch_rngs: list[Any] | None = None  # under DDP, every rank's (from a checkpoint)
        # the generators the data holds (held_rng.py) as the epoch began, and a checkpoint's
        # as it was written (to put back at a resume), with every rank's under DDP
        self.epoch_held: dict[str, Any] | None = None
        self.epoch_helds: list[Any] | None = None
        self.held: dict[str, Any] | None = None
        self.helds: list[Any] | None = None
        self.saved_world = 1  # the number of processes of the run a checkpoint came from
        # the run's checkpoints on disk, the only ones rotation deletes (None: a checkpoint
        # from before they were listed, whose directory rotation then treats as the run's)
        self.checkpoints: list[str] | None = []
        self.order: dict[str, Any] | None = None  # what a checkpoint's position depends on
        self.carried: list[Any] | None = None  # a checkpoint's st.Carry values, to put back
        self.cache: Any = None  # a checkpoint's cache counts, one per rank (tally.resumed)

    def add_terms(self, terms: Terms, examples: int) -> None:
        """A step's terms, its loss recorded (the ``len(losses)``-th): into the history and
        the epoch's sums, each weighed by the step's ``examples`` as its loss."""
        told = {k: float(v) for k, v in terms.items()}
        record_terms(self.terms, told, len(self.losses))
        self.epoch_loss.add_terms(told, examples)

    def end_epoch(self) -> tuple[float | None, dict[str, float]]:
        """The epoch's mean loss and terms (``EpochLoss.take``), recorded: ``epoch_losses``
        (NaN for an epoch without a step) and ``epoch_terms``."""
        loss, terms = self.epoch_loss.take()
        self.epoch_losses.append(recorded(loss))
        if terms or self.epoch_terms:
            record_terms(self.epoch_terms, terms, len(self.epoch_losses))
        return loss, terms

    def end_epoch_metrics(self, world: int) -> dict[str, dict[str, float]]:
        """The epoch's node metric means (``EpochMetrics.take``: collective under DDP),
        recorded in ``epoch_metrics``; after ``end_epoch``."""
        means = self.metric_sums.take(world)
        if means or self.epoch_metrics:
            record_terms(self.epoch_metrics, flat(means), len(self.epoch_losses))
        return means

    def histories(self) -> dict[str, Any]:
        """Copies of the run's per-step and per-epoch histories, as ``TrainResult`` has them."""
        return {
            "losses": list(self.losses),
            "epoch_losses": list(self.epoch_losses),
            "terms": {k: list(v) for k, v in self.terms.items()},
            "epoch_terms": {k: list(v) for k, v in self.epoch_terms.items()},
            "epoch_metrics": {k: list(v) for k, v in self.epoch_metrics.items()},
        }

    def flush(self, world: int) -> None:
        """Read the pending step losses back (one transfer), averaged over ranks, into the
        history and the epoch's sums, and their terms likewise. (Pending: under
        ``nonfinite="ignore"``, which reads no step's loss back. Under DDP, each rank's own:
        the epoch's sums of every rank's examples ride on the same all-reduce.) The node
        metrics' pending values too (this rank's; merged over ranks at the epoch's end)."""
        self.metric_sums.flush()
        if not self.pending:
            return
        values = torch.stack(self.pending).float()
        sizes, steps = self.pending_examples, len(self.pending)
        # (sorted: the same order on every rank, whatever order each rank's dict has)
        names = sorted({k for t in self.pending_terms for k in t})
        terms = _matrix(self.pending_terms, names, values.device)  # (steps x names, flat)
        base = len(self.losses)
        if world > 1:
            n = torch.tensor(sizes, dtype=values.dtype, device=values.device)
            weighed = (terms.reshape(steps, len(names)) * n[:, None]).sum(0)  # (epoch sums)
            summed = ddp.total(
                torch.cat([values, terms, weighed, (values * n).sum()[None], n.sum()[None]])
            )
            self.losses.extend((summed[:steps] / world).tolist())  # (as ddp.mean)
            end = steps + steps * len(names)
            terms = summed[steps:end] / world
            total, examples = summed[-2:].tolist()
            self.epoch_loss.total += total
            self.epoch_loss.examples += round(examples)
            if names:  # every rank's examples, as the loss's
                for k, v in zip(names, summed[end:-2].tolist(), strict=True):
                    self.epoch_loss.terms[k] = self.epoch_loss.terms.get(k, 0.0) + v
                self.epoch_loss.term_examples += round(examples)
        else:
            losses = values.tolist()
            self.losses.extend(losses)
            for loss, size in zip(losses, sizes, strict=True):  # (in order: as read at once)
                self.epoch_loss.add(loss, size)
        if names or self.terms:
            rows = terms.reshape(steps, len(names)).tolist()
            for j, row in enumerate(rows):
                record_terms(self.terms, dict(zip(names, row, strict=True)), base + j + 1)
                if world == 1 and names:  # (under DDP: the all-reduced sums above)
                    self.epoch_loss.add_terms(dict(zip(names, row, strict=True)), sizes[j])
        self.pending.clear()
        self.pending_terms.clear()
        sizes.clear()


def _matrix(pending: list[Terms], names: list[str], device: torch.device) -> torch.Tensor:
    """The pending steps' terms as one float32 tensor on ``device``, step after step, each
    step's in the order of ``names``: NaN where a step gave no such term."""
    f32, nan = torch.float32, float("nan")
    return torch.stack(
        [torch.as_tensor(t.get(k, nan), dtype=f32, device=device) for t in pending for k in names]
        or [torch.zeros((), device=device)]
    )[: len(pending) * len(names)]
