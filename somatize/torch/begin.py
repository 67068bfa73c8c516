"""The start of one ``fit``: ``begin(trainer, ...)`` makes its ``ActiveRun`` — the module,
device, optimizer and scheduler, then a checkpoint restored or the run seeded afresh, and
the watchers told of it."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..errors import CheckpointError, SettingError
from ..graph import Graph
from ..watchers import Watcher
from .carry import check_carried, check_last_batch, named_carries
from .checkpoint import load_checkpoint, restore, restore_rank_rng, restore_scaler
from .ckptdir import left_behind
from .ema import averaged, restore_average
from .factories import check_no_closure, check_optimizer, check_scheduler
from .horizon import check_horizon, horizon
from .loss_terms import gives_terms
from .policy import check_extension, check_fresh, resume_path
from .reduction import check_loss_reduction
from .resumed_optimizer import check_clip
from .resumed_scheduler import check_every
from .run import ActiveRun
from .start import as_module, autocast_for, compiled, place, seed_everything, trainable, wrap
from .term_names import NO_TERMS
from .timelimit import restored

if TYPE_CHECKING:
    from .trainer import Trainer

__all__ = ["begin"]


def begin(
    trainer: Trainer,
    model: Graph | nn.Module,
    resume: Any,
    run_id: str,
    rank: int,
    world: int,
    train: Iterable[Any],
    monitor: str,
) -> ActiveRun:
    """Module, device, optimizer, scheduler; then restore a checkpoint or seed afresh.
    ``monitor``: what ``Options.monitor`` watches in this fit (``valsets.monitored``)."""
    o = trainer.options
    net, user_compiled = as_module(model), compiled(model)
    carried = named_carries(net)
    check_carried(carried, trainer.micro_batches, train, o.shuffle, world)
    check_loss_reduction(trainer.loss, trainer.micro_batches)  # a sum under micro-batches
    check_last_batch(carried, train, "fit()'s train")
    device = place(net, o.device, world)
    params = trainable(net, fresh=isinstance(model, Graph))  # (module(g) refreshed it)
    assert trainer.optimizer is not None  # fit() checked
    opt = trainer.optimizer(params)
    check_optimizer(opt, params)
    check_no_closure(opt)
    sched = trainer.scheduler(opt) if trainer.scheduler is not None else None
    if trainer.scheduler is not None:
        check_scheduler(sched, o)
    run = ActiveRun(
        id=run_id,
        net=net,
        wrapped=wrap(net, user_compiled, device, world, o.compile, o.find_unused_parameters),
        params=params,
        opt=opt,
        sched=sched,
        device=device,
        autocast=autocast_for(o.precision, device),
        scaler=torch.amp.GradScaler(device.type) if o.precision == "fp16" else None,
        rank=rank,
        world=world,
    )
    run.carries = list(carried.values())
    if not gives_terms(trainer.loss):  # torch's losses: no terms to compare (term_names.py)
        run.term_names = NO_TERMS
    run.average = averaged(net, opt, o.ema)
    run.compiled = bool(o.compile) or user_compiled is not None
    run.plateau = isinstance(run.sched, torch.optim.lr_scheduler.ReduceLROnPlateau)
    if run.plateau and monitor != o.monitor:  # (defaulted to the first of several val sets)
        raise SettingError(
            f"ReduceLROnPlateau is stepped with Options.monitor, and with several validation "
            f"sets its default 'val_loss' names none of them; name the one it watches, "
            f"e.g. Options(monitor={monitor!r})"
        )
    run.state.monitor, run.state.mode = monitor, o.mode
    path = resume_path(trainer, resume)
    if path is not None:
        payload = load_checkpoint(path)
        fresh = horizon(run.sched)
        try:
            check_every(payload, run.sched, o.scheduler_every)
            restore(payload, run.state, net, opt, run.sched, trainer.pruner, trainer.seed)
        except CheckpointError as e:  # say which file: resume="last" picked it
            raise CheckpointError(f"resuming from {path}: {e}") from e
        if trainer.checkpoint is not None and run.state.checkpoints is not None:
            # rotation deletes what the killed save of `path` was to delete (ckptdir.py)
            gone = left_behind(path, payload, trainer.checkpoint.path)
            run.state.checkpoints = gone + run.state.checkpoints
        check_extension(trainer, run, path, fresh, train)
        restore_scaler(payload, run.scaler)
        check_clip(
            payload, {"clip_grad_norm": o.clip_grad_norm, "clip_grad_value": o.clip_grad_value}
        )
        restore_average(payload, run.average, path)
        restore_rank_rng(payload, rank, world)
        run.clock = restored(payload)  # the seconds trained before (Options.max_time)
        run.checkpoint = path
    else:
        check_fresh(trainer)
        check_horizon(trainer, run, train)  # a scheduler built for fewer steps than planned
        if trainer._pruner_start is not None:
            trainer.pruner.load_state_dict(trainer._pruner_start)
        seed_everything(trainer.seed)
    run.watchers = watchers(trainer) if rank == 0 else []
    return run


def watchers(trainer: Trainer) -> list[Watcher]:
    """The trainer's watchers, and a progress bar where ``Options(progress)`` asks for one
    (by default, when stderr is a terminal or a notebook's output, as Lightning's bar)."""
    out = list(trainer.watchers)
    show = trainer.options.progress
    if show is None:  # (a Jupyter kernel's stderr is no terminal: plain lines there)
        show = sys.stderr.isatty() or type(sys.stderr).__module__.startswith("ipykernel")
    if show:
        from .progress import Progress

        if not any(isinstance(w, Progress) for w in out):
            out.append(Progress())
    return out
