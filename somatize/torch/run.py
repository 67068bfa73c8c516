"""What one ``fit`` works with: the module, its optimizer, device and state, bundled."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..watchers import Watcher
from .run_state import RunState
from .timelimit import Clock
from .timing import Timing

__all__ = ["ActiveRun"]


@dataclass(slots=True)
class ActiveRun:
    """What one ``fit`` works with (made by ``begin.begin``, gone when ``fit`` returns)."""

    id: str
    net: nn.Module  # the module trained
    wrapped: nn.Module  # the same, in DDP under torchrun
    params: list[nn.Parameter]
    opt: torch.optim.Optimizer
    sched: Any
    device: torch.device
    autocast: Callable[[], Any]
    scaler: Any  # a torch.amp.GradScaler under fp16, else None
    rank: int
    world: int
    watchers: list[Watcher] = field(default_factory=list)
    state: RunState = field(default_factory=RunState)
    checkpoint: Path | None = None  # the last checkpoint written, or resumed from
    plateau: bool = False  # the scheduler is stepped with the monitored metric (ReduceLROnPlateau)
    carries: list[Any] = field(default_factory=list)  # every Carry of the model
    average: Any = None  # Options(ema=): the weight average (ema.py)
    compiled: bool = False  # trained through torch.compile
    due: bool = False  # an evaluation ranked among the best: checkpoint it now
    tally: Any = None  # a CacheTally on the graph, when it remembers a node (tally.py)
    # whether reading the data may draw random numbers a resume must replay: checkpoints
    # are written and the data is not a plain list or tuple of batches (loop._batches)
    replay: bool = False
    held: list[Any] = field(default_factory=list)  # generators the data holds (held_rng.py)
    train: Any = None  # the training data (this rank's share): names an empty batch on error
    # Options(limit_train_batches=) resolved against the data (limits.py): batches an
    # epoch takes; None: all of them
    train_batches: int | None = None
    # batches an epoch takes on this rank, where the data's length says: a checkpoint due
    # at its last step is left to the epoch's end, at the same step (loop.train)
    epoch_batches: int | None = None
    val_sets: list[Any] | None = None  # the ValSets of val= (valsets.py), limits resolved
    clock: Clock = field(default_factory=Clock)  # seconds trained, across resumes
    deadline: float | None = None  # Options(max_time=): when it is spent (time.monotonic)
    timed_out: bool = False  # the run stopped because max_time was spent
    stop: Any = None  # Options(stop_on=): the signals' Stop (stopping.py), else None
    stopped: int = 0  # the signal that stopped the run at a step's end, else 0
    grad_norm: Any = None  # the last step's gradient norm for StepEnd (step._update), or None
    terms: dict[str, Any] = field(default_factory=dict)  # the last step's loss terms (step.py)
    # what the nodes reported of each of the last step's batches (micro-batches), with its
    # examples (this rank's): the epoch's node metric means (step.py, epoch_metrics.py)
    reported: list[tuple[Any, int]] = field(default_factory=list)
    # the names of the loss's terms, fixed by the fit's first loss call (term_names.py)
    term_names: tuple[str, ...] | None = None
    resave: bool = False  # the last checkpoint's step was evaluated after it was written
    timing: Timing = field(default_factory=Timing)  # where the fit's time went (timing.py)
