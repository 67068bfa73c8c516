"""A scheduler sized in epochs but stepped every optimizer step: its decay is over early.

Lightning steps a bare scheduler once an epoch, so a ``StepLR(opt, 3, 0.1)``,
``MultiStepLR(opt, [5, 8])`` or ``ExponentialLR(opt, 0.8)`` copied from a LightningModule
is sized in epochs. The Trainer steps a scheduler after every optimizer step (unless
``Options(scheduler_every="epoch")``), and such a schedule then plays out within the first
epoch: the rate falls to nothing (1e-54 after 10 epochs of 16 steps for the StepLR) and the
rest of the run trains at it. These schedulers name no length the run could be compared
with (``horizon.py`` checks those that do), so the rate the run would follow is replayed on
a throwaway copy of the scheduler — over an optimizer whose parameters are empty tensors —
for at most ``_REPLAYED`` steps (about 8 µs each).

The rule, chosen for few false positives: the rate falls by at least half over the
replayed steps, and within their first quarter it reaches its floor — the last rate, or 1%
of its peak if that is higher — and stays there. A schedule sized in optimizer steps
decays over the run (ImageNet's StepLR reaches its last rate two thirds in; a cosine or a
linear decay at the end); a warm-up rises; a cyclic one (``CyclicLR``, warm restarts)
climbs back. Runs of one epoch are not checked: there is no epoch to have sized it by.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch

from ..stack import outside

__all__ = ["check_decay", "decayed_at", "rates"]

_REPLAYED = 1000  # scheduler steps replayed at most: the check costs a few ms at worst
_lr = torch.optim.lr_scheduler


def rates(sched: Any, opt: torch.optim.Optimizer, n: int) -> list[float] | None:
    """The first parameter group's rate for each of the first ``n`` optimizer steps, as
    ``sched`` (over ``opt``) stepped after each would give them; both are left as they
    are. None when the scheduler cannot be copied (it holds what deepcopy refuses)."""
    empty = {id(p): torch.empty(0) for g in opt.param_groups for p in g["params"]}
    try:
        twin = copy.deepcopy(sched, empty)  # (the parameters are not copied: memo)
    except Exception:  # a scheduler holding a lock, a generator...: not checked
        return None
    group = twin.optimizer.param_groups[0]
    out = [float(group["lr"])]
    with warnings.catch_warnings():  # torch warns of a scheduler stepped without opt.step()
        warnings.simplefilter("ignore")
        try:
            for _ in range(n - 1):
                twin.step()
                out.append(float(group["lr"]))
        except Exception:  # (a OneCycleLR stepped past total_steps: horizon.py's concern)
            return None
    return out


def decayed_at(lrs: list[float]) -> int | None:
    """The index of the step from which ``lrs`` sit at their floor, when that is early
    (see the module's docstring); None when the rates do not decay so."""
    if len(lrs) < 8:  # too few steps to tell a quarter from the rest
        return None
    peak = max(lrs)
    top = lrs.index(peak)
    if peak <= 0 or lrs[-1] > peak / 2:
        return None
    floor = max(lrs[-1], peak / 100) * (1 + 1e-3)  # (x0.1 three times is 1.0000000000000002e-3)
    at = next(i for i in range(top, len(lrs)) if lrs[i] <= floor)
    if at >= len(lrs) / 4 or max(lrs[at:]) > floor * 1.5:
        return None
    return at


def check_decay(
    sched: Any, opt: torch.optim.Optimizer, planned: int, per_epoch: int | None
) -> None:
    """Warn when ``sched`` (over ``opt``), stepped after each of the ``planned`` optimizer steps of a run
    of ``per_epoch`` steps an epoch, decays early as one sized in epochs would."""
    if per_epoch is None or planned <= per_epoch or per_epoch < 2:  # one epoch, or unknown
        return
    lrs = rates(sched, opt, min(planned, _REPLAYED))
    at = decayed_at(lrs) if lrs is not None else None
    if lrs is None or at is None:
        return
    name = type(sched).__name__
    end = f"; it ends at {lrs[-1]:.3g}" if len(lrs) == planned else ""
    warnings.warn(
        f"the {name} brings the learning rate from {max(lrs):.3g} down to {lrs[at]:.3g} by "
        f"step {at + 1} of the {planned} this run plans, and keeps it there{end}. An epoch is "
        f"{per_epoch} optimizer steps here, and the Trainer steps a scheduler after each of "
        f"them, so one sized in epochs (as Lightning steps a bare one once an epoch) runs "
        f"{per_epoch} times too fast. Step it once an epoch with "
        f"Options(scheduler_every='epoch'), or size it in optimizer steps"
        f"{_in_steps(sched, per_epoch)} (trainer.planned_steps(train) gives the run's steps)",
        UserWarning,
        stacklevel=outside(),
    )


def _in_steps(sched: Any, per_epoch: int) -> str:
    """The scheduler's lengths in optimizer steps, for the torch decays Lightning modules use."""
    if isinstance(sched, _lr.StepLR):
        return f": {type(sched).__name__}(opt, step_size={sched.step_size * per_epoch}, ...)"
    if isinstance(sched, _lr.MultiStepLR):
        steps = [m * per_epoch for m in sorted(sched.milestones.elements())]
        return f": {type(sched).__name__}(opt, milestones={steps}, ...)"
    if isinstance(sched, _lr.ExponentialLR):
        return f": {type(sched).__name__}(opt, gamma={sched.gamma ** (1 / per_epoch):.6g})"
    return ""
