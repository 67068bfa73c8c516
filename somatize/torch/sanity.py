"""The sanity check: ``Options(sanity_val_batches=2)``, Lightning's ``num_sanity_val_steps``.

Before the first step of a fresh run, the first batches of ``val`` are evaluated once, so a
validation that fails (a metric's bug, a shape a node does not take) fails in seconds rather
than after the first epoch's training. It changes nothing the run computes: every RNG state
(python, numpy, torch, CUDA) is put back after it, the module's mode is restored, carried
state is reset, and its values are not recorded, not told to watchers, not ranked for
``best`` or checkpoints and not reported to a pruner or a plateau scheduler.

It is skipped where it could change what the run computes, or where it cannot help:

* a resumed run (as Lightning skips it when restarting), or a smoke run;
* a ``val`` that is a one-shot iterator (a generator), which it would use up, or a
  DataLoader with ``persistent_workers=True``, whose workers' random streams would run on;
* a model with lazy parameters (``nn.LazyLinear``), which a first forward would
  initialise from the RNG at another moment than training would;
* a graph that remembers a node (cached, per example or whole): what it would store in the
  keeper could be found by the first epoch's steps, changing their counts in
  ``TrainResult.cache`` (and, through batch-dependent kernels, their bits).

It also checks ``Options(monitor=)`` against what it evaluated: a loss function's terms
(``val_recon``) are known only once it runs, so ``fit`` leaves such a name to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torch import nn

from .carry import reset
from .rng import put_back, snapshot
from .settings import count
from .timing import timed

if TYPE_CHECKING:
    from .run import ActiveRun
    from .trainer import Trainer

__all__ = ["check_sanity", "sanity_check"]


def check_sanity(value: Any) -> None:
    """``Options(sanity_val_batches=...)``: a whole number >= 0 (0 turns the check off)."""
    count(
        "Options sanity_val_batches",
        value,
        0,
        hint="it is how many val batches are evaluated before training; 0 turns it off",
    )


def _lazy(net: nn.Module) -> bool:
    return any(nn.parameter.is_lazy(p) for p in net.parameters())


def sanity_check(trainer: Trainer, run: ActiveRun) -> bool:
    """Evaluate the first ``Options.sanity_val_batches`` batches of each validation set
    and forget it; whether it ran. Raises what an evaluation raises, noting where."""
    n = trainer.options.sanity_val_batches
    fresh = run.checkpoint is None and run.state.step == 0
    if not n or not run.val_sets or not fresh or run.tally is not None or _lazy(run.net):
        return False
    return _evaluate(trainer, run, n)


@timed("evaluation")  # TrainResult.timing
def _evaluate(trainer: Trainer, run: ActiveRun, n: int) -> bool:
    sets = [vs for vs in run.val_sets or () if _reusable(vs.data)]
    kept = snapshot()
    names: list[str] = []
    try:
        for vs in sets:
            reset(run.carries)
            limit = n if vs.limit is None else min(n, vs.limit)
            try:
                values = trainer._evaluate(
                    run.net, vs.data, run.device, run.autocast, run.rank, run.world, limit
                )
                names += [f"{vs.prefix}{k}" for k in values]
            except Exception as e:
                if hasattr(e, "add_note"):  # Python >= 3.11
                    where = f" of val set {vs.name!r}" if vs.name else ""
                    e.add_note(
                        f"(raised by the sanity check before training, which evaluates {limit} "
                        f"batch{'es' if limit != 1 else ''}{where}: fix the validation, or turn "
                        "the check off with Options(sanity_val_batches=0))"
                    )
                raise
    finally:
        put_back(kept)
        reset(run.carries)
    monitor = run.state.monitor
    if len(sets) == len(run.val_sets or ()) and "/" not in monitor and monitor not in names:
        # a monitor fit() could not check when it started: a loss function's term may be
        # evaluated (loss_terms.py), and this evaluation would have shown it
        raise KeyError(
            f"Options(monitor={monitor!r}) names a metric evaluation does not produce; the "
            f"sanity check before training evaluated {', '.join(names)} (set "
            "Options(monitor=...) to one of them)"
        )
    return bool(sets)


def _reusable(data: Any) -> bool:
    """Whether reading ``data`` once more leaves later reads as they were."""
    if isinstance(data, Iterator):
        return False  # a one-shot iterator: used up
    # persistent workers' random streams run on from one pass to the next
    return not (getattr(data, "persistent_workers", False) and getattr(data, "num_workers", 0))
