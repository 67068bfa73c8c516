"""``RunState``: where a run stands — its counters, losses, evaluations and what a resume
needs besides modules, optimizer and RNG (``checkpoint.capture`` writes it down,
``checkpoint.restore`` reads it back)."""

from __future__ import annotations

from typing import Any

import torch

from . import ddp

__all__ = ["RunState"]


class RunState:
    """Where a run stands: what a checkpoint restores besides modules, optimizer and RNG."""

    def __init__(self) -> None:
        self.step = self.epoch = self.position = self.examples_seen = 0
        self.epoch_examples: int | None = None  # the first epoch's, all ranks (limits.one_epoch)
        self.val_examples: dict[str, int] = {}  # the last evaluation's examples, by set prefix
        self.losses: list[float] = []
        self.pending: list[torch.Tensor] = []  # step losses not yet read back from the device
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
        self.saved_world = 1  # the number of processes of the run a checkpoint came from
        # the run's checkpoints on disk, the only ones rotation deletes (None: a checkpoint
        # from before they were listed, whose directory rotation then treats as the run's)
        self.checkpoints: list[str] | None = []
        self.order: dict[str, Any] | None = None  # what a checkpoint's position depends on
        self.carried: list[Any] | None = None  # a checkpoint's st.Carry values, to put back
        self.cache: Any = None  # a checkpoint's cache counts, one per rank (tally.resumed)

    def flush(self, world: int) -> None:
        """Read the pending step losses back (one transfer), averaged over ranks."""
        if self.pending:
            values = torch.stack(self.pending).float()
            if world > 1:
                values = ddp.mean(values)
            self.losses.extend(values.tolist())
            self.pending.clear()
