"""The Trainer's checkpoint policy: where to resume from, a fresh start, when and what to save."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError
from . import ddp
from .checkpoint import RunState, capture, finite, rng_state, scaler_state

if TYPE_CHECKING:
    from .run import ActiveRun
    from .trainer import Trainer

__all__ = ["check_fresh", "resume_path", "save"]


def resume_path(trainer: Trainer, resume: Any) -> Path | None:
    """The checkpoint ``fit(resume=...)`` names (None: a fresh start)."""
    if resume is None:
        return None
    if resume == "last":
        if trainer.checkpoint is None:
            raise CheckpointError(
                "resume='last' needs checkpoint=Checkpointing(dir) to know where to look"
            )
        return trainer.checkpoint.last()
    return Path(resume)


def check_fresh(trainer: Trainer) -> None:
    """Refuse to start afresh over an earlier run's checkpoints."""
    ckpt = trainer.checkpoint
    if ckpt is not None and (earlier := ckpt.last()) is not None:
        raise CheckpointError(
            f"{ckpt.path} already holds checkpoints of an earlier run (last: {earlier.name}); "
            "continue it with fit(..., resume='last'), or checkpoint into an empty directory"
        )


def save(trainer: Trainer, run: ActiveRun) -> None:
    """Checkpoint: rank 0 writes, every rank waits for it and records its path."""
    ckpt = trainer.checkpoint
    assert ckpt is not None
    s = run.state
    s.flush(run.world)
    run.due = False
    rngs = ddp.gather(rng_state()) if run.world > 1 else None  # every rank's, for its resume
    if run.rank == 0:
        if finite(run.net.state_dict()):
            s.last_finite = s.step
        payload = capture(s, run.net, run.opt, run.sched, trainer.pruner, trainer.seed)
        payload["scaler"] = scaler_state(run.scaler)
        if rngs is not None:
            payload["rngs"] = rngs
        protect = [int(r[1]) for r in s.ranked]
        if s.last_finite is not None:
            protect.append(s.last_finite)
        ckpt.save(payload, s.step, protect=protect, best=best_step(s))
    if run.world > 1:
        ddp.barrier()
    run.checkpoint = ckpt.file(s.step)


def best_step(s: RunState) -> int | None:
    """The step of the best checkpoint, or None when none is ranked."""
    return int(s.ranked[0][1]) if s.ranked else None
