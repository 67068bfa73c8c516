"""The Trainer's checkpoint policy: where to resume from, a fresh start, when and what to save."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError, SettingError
from ..stack import outside
from . import ddp, tally
from .carry import stored
from .checkpoint import RunState, capture, finite, rng_state, scaler_state
from .ckptdir import writer
from .held_rng import held_states
from .horizon import check_restored, scheduler_steps
from .limits import batches_per_epoch, share
from .rng import as_state
from .timing import timed

if TYPE_CHECKING:
    from .run import ActiveRun
    from .trainer import Trainer

__all__ = ["check_fresh", "resume_path", "save", "writing"]


def resume_path(trainer: Trainer, resume: Any) -> Path | None:
    """The checkpoint ``fit(resume=...)`` names (None: a fresh start)."""
    if resume is None:
        return None
    check_resume(resume)
    if resume == "last":
        if trainer.checkpoint is None:
            raise CheckpointError(
                "resume='last' needs checkpoint=Checkpointing(dir) to know where to look"
            )
        return trainer.checkpoint.last()
    if Path(resume).is_dir():
        raise CheckpointError(
            f"resume={str(resume)!r} is a directory, not a checkpoint; to continue from its "
            f"newest checkpoint pass resume='last' with checkpoint=st.Checkpointing("
            f"{str(resume)!r}), or pass the path of one of its step-NNNNNNNNN.ckpt files"
        )
    return Path(resume)


def check_resume(resume: Any) -> None:
    """``fit(resume=...)`` is None, ``"last"`` or a path (before anything is written).

    Raises:
        SettingError: it is none of them, naming it and what to pass.
    """
    if resume is None:
        return
    if isinstance(resume, bool) or not isinstance(resume, (str, os.PathLike)):
        raise SettingError(
            f"resume must be 'last' or a checkpoint's path, not {resume!r}; pass "
            "resume='last' to continue from the newest checkpoint of Checkpointing(dir), "
            "a path to continue from that checkpoint, or None for a fresh start"
        )
    if isinstance(resume, str) and resume != "last" and _word(resume):
        raise SettingError(
            f"resume={resume!r} is neither 'last' nor a checkpoint's path (there is no "
            f"file {resume!r}); pass resume='last' for the newest checkpoint of "
            "Checkpointing(dir), or the path of a checkpoint file"
        )


@contextlib.contextmanager
def writing(trainer: Trainer, rank: int, resume: Any) -> Iterator[None]:
    """Hold the checkpoint directory's lock for a fit (rank 0, which writes; ``ckptdir``),
    once ``resume`` is known to be a value ``fit`` takes (``check_resume``)."""
    check_resume(resume)
    if trainer.checkpoint is None or rank != 0:
        yield
        return
    with writer(trainer.checkpoint.path):
        yield


def _word(resume: str) -> bool:
    """Whether ``resume`` reads as a keyword ('latest', 'best', 'True') rather than a path."""
    return resume.isidentifier() and not Path(resume).exists()


def check_fresh(trainer: Trainer) -> None:
    """Refuse to start afresh over an earlier run's checkpoints."""
    ckpt = trainer.checkpoint
    if ckpt is not None and (earlier := ckpt.last()) is not None:
        raise CheckpointError(
            f"{ckpt.path} already holds checkpoints of an earlier run (last: {earlier.name}); "
            "continue it with fit(..., resume='last'), or checkpoint into an empty directory"
        )


def check_writable(trainer: Trainer, step: int, total: int | None) -> None:
    """Refuse, before its first step, a run with steps left whose checkpoint directory
    cannot be made or written (a read-only disk, no write permission, a file in its path):
    it would train until its first checkpoint and fail there. A finished run resumed
    read-only writes nothing."""
    ckpt = trainer.checkpoint
    if ckpt is None or (total is not None and step >= total):
        return
    if not ckpt.path.is_dir():  # (the lock's mkdir failed: say why now, not at step N)
        try:
            ckpt.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CheckpointError(
                f"the checkpoint directory {ckpt.path} cannot be made ({e.strerror or e}), "
                "and this run has steps left to train: it would train until its first "
                "checkpoint and fail there. Give it a Checkpointing directory it can make"
            ) from e
    if not os.access(ckpt.path, os.W_OK):
        raise CheckpointError(
            f"the checkpoint directory {ckpt.path} cannot be written (a read-only disk, or "
            f"no write permission), and this run has steps left to train (at step {step}"
            f"{f' of {total}' if total is not None else ''}): it would train until its "
            "first checkpoint and fail there. Give it a Checkpointing directory it can "
            "write; a finished run's result is read from a read-only one"
        )


@timed("checkpoints")  # TrainResult.timing
def save(trainer: Trainer, run: ActiveRun) -> None:
    """Checkpoint: rank 0 writes, every rank waits for it and records its path."""
    ckpt = trainer.checkpoint
    assert ckpt is not None
    s = run.state
    s.flush(run.world)
    run.due = False
    held = held_states(run.held)  # the data's own generators (held_rng.py)
    counts = tally.state(run.tally)  # what cached nodes found so far: TrainResult.cache
    sums = s.metric_sums.state()  # node metrics' sums of the epoch so far (epoch_metrics.py)
    # every rank's, in one collective: its RNG states (global, its data's own) for its
    # resume, its cache counts and its node metrics' sums
    mine = [counts, sums, rng_state(), as_state(s.epoch_rng), held, s.epoch_held]
    ranks = [list(c) for c in zip(*ddp.gather(mine))] if run.world > 1 else None
    caches, metric_sums = (ranks[0], ranks[1]) if ranks is not None else ([counts], [sums])
    carry = None  # every rank's st.Carry values, to go on from in mid-epoch
    if s.position and run.carries:
        carry = ddp.gather(stored(run.carries)) if run.world > 1 else [stored(run.carries)]
    if run.rank == 0:
        for w in run.watchers:  # what they hold back (a CSV row) goes to disk before the
            flush = getattr(w, "flush", None)  # checkpoint that covers it
            if callable(flush):
                flush()
        if finite(run.net.state_dict()):
            s.last_finite = s.step
        payload = capture(s, run.net, run.opt, run.sched, trainer.pruner, trainer.seed)
        payload["scaler"] = scaler_state(run.scaler)
        payload["scheduler_every"] = trainer.options.scheduler_every  # (resumed_scheduler.py)
        payload["clip_grad_norm"] = trainer.options.clip_grad_norm  # (resumed_optimizer.py)
        payload["clip_grad_value"] = trainer.options.clip_grad_value  # (resumed_optimizer.py)
        payload["world"] = run.world  # a mid-epoch position is one of this world's shares
        payload["held_rng"] = held
        payload["elapsed"] = run.clock.spent()  # seconds trained: Options(max_time=) resumes
        if run.average is not None:
            payload["ema"] = run.average.state()
        payload["order"] = order(trainer, run.train, run.rank, run.world)
        payload["cache"] = caches
        payload["epoch_metric_sums"] = metric_sums  # (every rank's: each resumes its own)
        if carry is not None:
            payload["carry"] = carry
        if ranks is not None:
            names = ("rngs", "epoch_rngs", "held_rngs", "epoch_held_rngs")
            for name, states in zip(names, ranks[2:], strict=True):
                payload[name] = states
        protect = [int(r[1]) for r in s.ranked]
        if s.last_finite is not None:
            protect.append(s.last_finite)
        s.checkpoints = ckpt.save_chain(
            payload, s.step, protect=protect, best=best_step(s), known=s.checkpoints
        )
    if run.world > 1:
        ddp.barrier()
    run.checkpoint = ckpt.file(s.step)


def check_extension(
    trainer: Trainer, run: ActiveRun, path: Path, fresh: dict[str, int], train: Iterable[Any]
) -> None:
    """Warn when a resumed run cannot go on as asked: stopped early by its pruner, already
    past this Trainer's ``max_steps`` or ``epochs``, or a restored scheduler built for fewer
    steps than this run plans.

    Raises:
        CheckpointError: the checkpoint was written in mid-epoch by a run of another
            number of processes (``check_world``).
    """
    s = run.state
    if s.pruned:
        warnings.warn(
            f"the run resumed from {path} was stopped early by its pruner at step {s.step} "
            f"(epoch {s.epoch}); nothing more is trained. To train further, resume from a "
            "checkpoint before it stopped, or start a fresh run in another directory",
            UserWarning,
            stacklevel=outside(),
        )
        return
    past = [
        f"{name}={limit}"
        for name, limit, reached in (
            ("max_steps", trainer.max_steps, s.step),
            ("epochs", trainer.epochs, s.epoch),
        )
        if limit is not None and reached > limit
    ]
    if past:
        warnings.warn(
            f"the run resumed from {path} is already at step {s.step} (epoch {s.epoch}), past "
            f"this Trainer's {' and '.join(past)}; nothing is trained and the checkpoint's "
            "result is returned. Resume with the limits it was trained with, or start a fresh "
            "run in another directory for a shorter one",
            UserWarning,
            stacklevel=outside(),
        )
        return
    if trainer.max_steps is None or s.step < trainer.max_steps:  # (at it: nothing to train)
        check_world(run, path)
        check_order(trainer, run, path, train)
    check_restored(trainer, run, path, fresh, scheduler_steps(trainer, train, run.rank, run.world))


def check_world(run: ActiveRun, path: Path) -> None:
    """Refuse to go on in mid-epoch from a checkpoint of another number of processes: its
    position counts batches of its own ranks' shares, which another world size orders and
    splits otherwise, so no position here resumes it exactly (an epoch's end does).

    Raises:
        CheckpointError: ``path`` is in mid-epoch and was written by another world size.
    """
    s, saved = run.state, run.state.saved_world
    if s.position == 0 or saved == run.world:
        return

    def processes(n: int) -> str:
        return f"{n} process{'es' if n > 1 else ''}"

    how = (
        "in one process (without torchrun)"
        if saved == 1
        else f"with {processes(saved)} in all (torchrun --nproc_per_node={saved} on one machine)"
    )
    raise CheckpointError(
        f"{path} was written mid-epoch (epoch {s.epoch}, batch {s.position} of its share) by a "
        f"run of {processes(saved)}; this run has {run.world}, whose ranks split the epoch's "
        f"batches otherwise, so it cannot go on from that batch. Resume {how}, or from a "
        "checkpoint written at an epoch's end (fit(..., resume=PATH); one is written after "
        "every epoch), which resumes on any number of processes"
    )


def order(trainer: Trainer, train: Iterable[Any], rank: int, world: int) -> dict[str, Any]:
    """What a mid-epoch position means: the batches an epoch takes (None when the data has
    no length), and the settings that order and group them."""
    o = trainer.options
    size = share(train, rank, world, even=True) if train is not None else None
    limit = batches_per_epoch(
        "limit_train_batches", o.limit_train_batches, train, rank, world, even=True
    )
    batches = size if limit is None else limit if size is None else min(size, limit)
    return {
        "batches": batches,
        "accumulate": o.accumulate,
        "micro_batches": trainer.micro_batches,
        "shuffle": o.shuffle,
        "limit_train_batches": o.limit_train_batches,
    }


_ORDER_FIX = {
    "batches": "resume with the data it was trained on",
    "accumulate": "resume with Options(accumulate={})",
    "shuffle": "resume with Options(shuffle={})",
    "limit_train_batches": "resume with Options(limit_train_batches={})",
}


def check_order(trainer: Trainer, run: ActiveRun, path: Path, train: Iterable[Any]) -> None:
    """Refuse to go on in mid-epoch when the checkpoint's position means another batch here:
    the epoch has another number of batches (other data, another limit), or its batches are
    ordered (``shuffle``) or grouped (``accumulate``) otherwise. A checkpoint from before
    this was recorded is not checked. Another ``micro_batches`` only warns: the position is
    the same batch, but the sums round otherwise.

    Raises:
        CheckpointError: naming each setting, its value then and now, and the fix.
    """
    s = run.state
    if s.position == 0 or s.order is None:
        return
    now = order(trainer, train, run.rank, run.world)
    then = s.order
    differ = [
        k
        for k in _ORDER_FIX
        if k in then and then[k] != now[k] and not (k == "batches" and None in (then[k], now[k]))
    ]
    where = f"{path} was written mid-epoch (epoch {s.epoch}, batch {s.position})"
    if differ:
        said = "; ".join(
            f"its epoch had {then[k]} batches, this run's has {now[k]}"
            if k == "batches"
            else f"it was written with {k}={then[k]!r}, this run has {k}={now[k]!r}"
            for k in differ
        )
        fixes = ", ".join(_ORDER_FIX[k].format(repr(then[k])) for k in differ)
        raise CheckpointError(
            f"{where}, and its position means another batch here: {said}. To go on from "
            f"it, {fixes}; or resume from a checkpoint written at an epoch's end (one is "
            "written after every epoch), which goes on with any data and settings"
        )
    if "micro_batches" in then and then["micro_batches"] != now["micro_batches"]:
        warnings.warn(
            f"{where} by a run with micro_batches={then['micro_batches']}, this run has "
            f"micro_batches={now['micro_batches']}: it goes on from the same batch, but its "
            "gradients sum otherwise, so it is not bitwise identical to an uninterrupted run; "
            f"resume with micro_batches={then['micro_batches']} for an exact resume",
            UserWarning,
            stacklevel=outside(),
        )


def best_step(s: RunState) -> int | None:
    """The step of the best checkpoint, or None when none is ranked."""
    return int(s.ranked[0][1]) if s.ranked else None
