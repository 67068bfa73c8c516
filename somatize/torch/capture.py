"""What a checkpoint holds: ``capture`` a run into a payload, ``restore`` it back.

The payload is tensors, numbers, strings, lists and dicts only — the model, optimizer
and scheduler states, the ``RunState`` (step, epoch, position inside the epoch,
history — each step's loss and each epoch's, with the running sums of the epoch in
progress — the best and the monitor it is of), the pruner's state and every RNG state
stored as tensors and ints — so ``torch.load(..., weights_only=True)`` reads it back.
Writing and reading the file is ``checkpoint.py``'s.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError
from ..stack import outside
from .epoch_loss import EpochLoss
from .loss_terms import restored_terms
from .resumed_monitor import check_monitor
from .resumed_optimizer import check_frozen, check_optimizer, frozen_nodes, optimizer_class
from .resumed_scheduler import check_scheduler, scheduler_class
from .rng import as_state, rng_state, set_rng_state
from .run_state import RunState

__all__ = ["capture", "finite", "restore", "restore_scaler", "scaler_state"]


def finite(state: Mapping[str, torch.Tensor]) -> bool:
    """Whether every floating-point tensor of a state dict is finite (no NaN, no inf)."""
    return all(bool(torch.isfinite(t).all()) for t in state.values() if torch.is_floating_point(t))


def capture(
    s: RunState, net: nn.Module, opt: torch.optim.Optimizer, sched: Any, pruner: Any, seed: int
) -> dict[str, Any]:
    """Everything a checkpoint holds, as tensors, numbers, strings, lists and dicts."""
    pruner_state = getattr(pruner, "state_dict", None)
    return {
        "model": net.state_dict(),
        "optimizer": opt.state_dict(),
        "optimizer_class": optimizer_class(opt),
        "frozen": frozen_nodes(net),  # (the nodes the optimizer's state leaves out)
        "scheduler": sched.state_dict() if sched is not None else None,
        "scheduler_class": scheduler_class(sched),
        "step": s.step,
        "epoch": s.epoch,
        "position": s.position,
        "examples_seen": s.examples_seen,
        "epoch_examples": s.epoch_examples,
        "val_examples": s.val_examples,
        "losses": s.losses,
        "terms": s.terms,  # a loss function's terms per step (loss_terms.record_terms)
        "epoch_losses": s.epoch_losses,
        "epoch_terms": s.epoch_terms,
        "epoch_loss": s.epoch_loss.state(),  # the epoch's running sums (epoch_loss.py)
        "epoch_metrics": s.epoch_metrics,  # node metrics' epoch means (epoch_metrics.py)
        "metrics": s.metrics,
        "best": s.best,
        "monitor": s.monitor,  # what best and ranked are values of (resumed_monitor.py)
        "mode": s.mode,
        "pruned": s.pruned,
        "ranked": s.ranked,
        "last_finite": s.last_finite,
        "skipped": s.skipped,
        "pruner": pruner_state() if pruner_state is not None else None,
        "rng": rng_state(),
        "epoch_rng": as_state(s.epoch_rng),
        "epoch_held_rng": s.epoch_held,  # the data's own generators (held_rng.py)
        "seed": seed,
    }


def restore(
    payload: dict[str, Any],
    s: RunState,
    net: nn.Module,
    opt: torch.optim.Optimizer,
    sched: Any,
    pruner: Any,
    seed: int,
) -> None:
    """Put a run back where ``capture`` found it (RNG states included). ``s.monitor`` and
    ``s.mode`` are this run's ``Options(monitor=, mode=)``, compared with the checkpoint's.

    Raises:
        CheckpointError: it was written with another seed, model or optimizer class, other
            frozen nodes, with a scheduler where this run has none (or the other way round,
            or of another class), or its best (or its pruner's) is of another monitored
            metric or mode.

    Warns:
        UserWarning: an optimizer hyper-parameter differs (the checkpoint's is kept).
    """
    if payload["seed"] != seed:
        raise CheckpointError(
            f"the checkpoint was written by a run with seed={payload['seed']}, this Trainer has "
            f"seed={seed}; resume with the same seed (it fixes the batch order)"
        )
    fresh = "st.load_state(g, st.load_checkpoint(path)['model']), in another checkpoint directory"
    check_frozen(payload.get("frozen"), frozen_nodes(net), fresh)
    check_optimizer(payload, opt)
    check_scheduler(payload, sched)
    check_monitor(payload, s.monitor, s.mode, pruner)
    try:
        net.load_state_dict(payload["model"])
        opt.load_state_dict(payload["optimizer"])
        if sched is not None and payload["scheduler"] is not None:
            sched.load_state_dict(payload["scheduler"])
    except (RuntimeError, KeyError, ValueError) as e:
        raise CheckpointError(
            f"the checkpoint does not fit this model or optimizer ({e}); "
            "resume with the same graph and optimizer it was written by (a changed model "
            "is a fresh run, in another checkpoint directory)"
        ) from e
    s.step, s.epoch, s.position = payload["step"], payload["epoch"], payload["position"]
    s.examples_seen = payload["examples_seen"]
    s.epoch_examples = payload.get("epoch_examples")  # (None in a checkpoint from before)
    s.val_examples = dict(payload.get("val_examples") or {})
    s.losses, s.metrics = list(payload["losses"]), list(payload["metrics"])
    s.terms = restored_terms(payload.get("terms"), len(s.losses))
    # (a checkpoint from before they were kept: none, and sums from the resumed step on)
    s.epoch_losses = [float(v) for v in payload.get("epoch_losses") or []]
    s.epoch_terms = restored_terms(payload.get("epoch_terms"), len(s.epoch_losses))
    s.epoch_loss = EpochLoss.restored(payload.get("epoch_loss"))
    s.epoch_metrics = restored_terms(payload.get("epoch_metrics"), len(s.epoch_losses))
    s.saved_metric_sums = payload.get("epoch_metric_sums")  # every rank's (loop.train)
    s.best, s.pruned = payload["best"], payload["pruned"]
    s.ranked = [list(r) for r in payload.get("ranked", [])]
    s.last_finite, s.skipped = payload.get("last_finite"), payload.get("skipped", 0)
    s.epoch_rng = payload.get("epoch_rng")  # (None in a checkpoint from before it was kept)
    s.epoch_rngs = payload.get("epoch_rngs")
    s.held, s.helds = payload.get("held_rng"), payload.get("held_rngs")  # (held_rng.py)
    s.epoch_held, s.epoch_helds = payload.get("epoch_held_rng"), payload.get("epoch_held_rngs")
    # (a checkpoint from before "world" was kept says it by its ranks' RNG states)
    s.saved_world = payload.get("world", len(payload.get("rngs") or [None]))
    chain = payload.get("checkpoints")
    s.checkpoints = [str(n) for n in chain] if isinstance(chain, list) else None
    s.order = payload.get("order") if isinstance(payload.get("order"), dict) else None
    s.carried = payload.get("carry") if isinstance(payload.get("carry"), list) else None
    s.cache = payload.get("cache")  # (None in a checkpoint from before the counts were kept)
    loader = getattr(pruner, "load_state_dict", None)
    if loader is not None and payload["pruner"] is not None:
        loader(payload["pruner"])
    set_rng_state(payload["rng"])


def scaler_state(scaler: Any) -> dict[str, Any] | None:
    """A gradient scaler's state (scale, growth tracker...) for a checkpoint; None without one."""
    return dict(scaler.state_dict()) if scaler is not None else None


def restore_scaler(payload: dict[str, Any], scaler: Any) -> None:
    """Put a gradient scaler back as ``scaler_state`` found it.

    Raises:
        CheckpointError: the run uses a scaler (fp16) and the checkpoint holds none.

    Warns:
        UserWarning: the checkpoint holds one (fp16) and the run uses none: its state is
            dropped, and the run goes on in its own precision.
    """
    if scaler is None:
        if payload.get("scaler") is not None:
            warnings.warn(
                "the checkpoint was written in fp16 with a gradient scaler, and this run trains "
                "without one (another Options(precision=)): the scaler's state is dropped and "
                "the run goes on in its own precision, not as the run that wrote it would have",
                stacklevel=outside(),
            )
        return
    state = payload.get("scaler")
    if state is None:
        raise CheckpointError(
            "this run trains in fp16 with a gradient scaler, but the checkpoint was written "
            "without one (another precision); resume with the precision it was written with"
        )
    scaler.load_state_dict(state)
