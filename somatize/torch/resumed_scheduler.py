"""The LR scheduler a run resumes with: the checkpoint's, or none when it had none.

A checkpoint names its scheduler's class (``payload["scheduler_class"]``, None without
one). Resuming with a scheduler where the checkpoint has none would start its schedule
afresh in the middle of the run; resuming without one where it has one would hold the
rate where the checkpoint left it; and a scheduler of another class would take the
other's state (torch's ``load_state_dict`` copies whatever keys it is given). Each is
refused, naming both, before any state is loaded; so is a scheduler stepped per epoch
where it was stepped per step, or the other way round (``payload["scheduler_every"]``):
its state counts the other unit, and the rate would jump. How long the restored schedule runs
is ``horizon.check_restored``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import CheckpointError

__all__ = ["check_every", "check_scheduler", "scheduler_class"]


def scheduler_class(sched: Any) -> str | None:
    """The scheduler's class, ``module.qualname`` (None: no scheduler)."""
    if sched is None:
        return None
    t = type(sched)
    return f"{t.__module__}.{t.__qualname__}"


def check_scheduler(payload: Mapping[str, Any], sched: Any) -> None:
    """The checkpoint's scheduler is this run's: both none, or of one class.

    Raises:
        CheckpointError: one has a scheduler and the other none, or (where the checkpoint
            names its class) they are of other classes; both named, with the fix.
    """
    ours = scheduler_class(sched)
    had = payload.get("scheduler") is not None
    theirs = payload.get("scheduler_class") if had else None
    fresh = "st.load_state(g, st.load_checkpoint(path)['model'])"
    if had and sched is None:
        named = f" ({theirs})" if theirs else ""
        raise CheckpointError(
            f"the checkpoint was written by a run with an LR scheduler{named}, and this "
            "Trainer has none: the learning rate would stay where the checkpoint left it. "
            "Resume with the scheduler= it was written with, or start a fresh run from its "
            f"weights: {fresh}"
        )
    if not had and sched is not None:
        raise CheckpointError(
            f"the checkpoint was written by a run without an LR scheduler, and this Trainer "
            f"has {ours}: its schedule would start afresh in the middle of the run. Resume "
            "without scheduler=, or start a fresh run from its weights: " + fresh
        )
    if isinstance(theirs, str) and theirs != ours:
        raise CheckpointError(
            f"the checkpoint was written with LR scheduler {theirs}, this run uses {ours}; "
            "resume with the scheduler it was written with, or start a fresh run from its "
            f"weights: {fresh}"
        )


def check_every(payload: Mapping[str, Any], sched: Any, every: str) -> None:
    """The checkpoint's scheduler was stepped as this run steps it (``scheduler_every``).

    Raises:
        CheckpointError: the checkpoint's scheduler was stepped per step and this run's is
            per epoch, or the other way round.
    """
    then = payload.get("scheduler_every")  # (None: a checkpoint from before it was kept)
    if sched is None or payload.get("scheduler") is None or then in (None, every):
        return
    raise CheckpointError(
        f"the checkpoint's LR scheduler was stepped every {then} "
        f"(Options(scheduler_every={then!r})), and this run steps it every {every}: its "
        f"state counts {then}s, so the rate would jump to where {every}s that many would "
        f"put it. Resume with Options(scheduler_every={then!r}), or start a fresh run from "
        "its weights: st.load_state(g, st.load_checkpoint(path)['model'])"
    )
