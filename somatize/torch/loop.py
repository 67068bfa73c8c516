"""The Trainer's loop: epochs of steps, with evaluations and checkpoints between them."""

from __future__ import annotations

import contextlib
import itertools
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any

import torch

from ..stack import outside
from ..watchers import EpochEnd, Metrics, StepEnd, notify
from . import ddp
from .batches import epoch_batches
from .carry import start_epoch
from .epoch_metrics import EpochMetrics
from .evaluation import evaluate_into
from .fastpath import fast_epoch
from .held_rng import find_held, held_states, put_held, restore_held, warn_unkept
from .limits import limited, share
from .metrics import node_scalars
from .module import GraphModule
from .module_reads import fit_metrics
from .policy import save
from .rng import put_back, snapshot
from .schedule import evaluates_at_epoch_end
from .step import step
from .stopping import step_end
from .timelimit import seconds_of, spent_before

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from .run import ActiveRun
    from .trainer import Trainer

__all__ = ["train"]


def train(trainer: Trainer, run: ActiveRun, data: Iterable[Any], val: Iterable[Any] | None) -> None:
    """The epochs: steps, evaluations, checkpoints, until done, pruned or out of steps."""
    s, net, watchers = run.state, run.net, run.watchers
    graph_net = net if isinstance(net, GraphModule) else None
    if graph_net is not None:  # (resumed: an evaluation before any step sees where it stood)
        graph_net.step = s.step
    if s.saved_metric_sums is not None:  # resumed: this rank's node metric sums
        s.metric_sums = EpochMetrics.restored(s.saved_metric_sums, run.rank, run.world)
        s.saved_metric_sums = None
    epochs = trainer.epochs if trainer.epochs is not None else sys.maxsize
    max_steps = trainer.max_steps if trainer.max_steps is not None else sys.maxsize
    per_step = trainer.options.scheduler_every == "step"
    sched = None if run.plateau else run.sched  # a plateau scheduler is stepped by evaluations
    step_sched, epoch_sched = (sched, None) if per_step else (None, sched)
    accumulate = trainer.options.accumulate
    # the common case takes a loop with every call it does not need inlined (issue 16)
    fast = (
        not watchers
        and accumulate == 1
        and trainer.micro_batches == 1
        and run.scaler is None
        and run.world == 1
        and run.autocast is contextlib.nullcontext
        and trainer.options.nonfinite != "ignore"
    )
    if run.checkpoint is not None and (s.epoch or s.position) and _persistent_workers(data):
        warnings.warn(
            "resuming with a DataLoader that keeps persistent_workers=True: its worker "
            "processes' random streams (augmentation in workers) ran on from earlier epochs and "
            "are in no checkpoint, so this run will not be bitwise identical to an "
            "uninterrupted one; use persistent_workers=False for an exact resume",
            UserWarning,
            stacklevel=outside(),
        )
    # generators the data holds for itself, checkpointed and put back (held_rng.py)
    run.held = find_held(data) if trainer.checkpoint is not None or run.checkpoint else []
    if run.held:
        warn_unkept(run.held)
        if run.checkpoint is not None:  # resumed: as the checkpoint left them
            helds = s.helds
            mine = helds[run.rank] if helds is not None and len(helds) == run.world else s.held
            restore_held(run.held, mine)
    s.held = s.helds = None
    run.replay = trainer.checkpoint is not None and type(data) not in (list, tuple)
    run.epoch_batches = (
        run.train_batches
        if run.train_batches is not None
        else share(data, run.rank, run.world, even=True)
    )
    net.train()
    run.clock.start()
    budget = seconds_of(trainer.options.max_time)
    run.deadline = run.clock.deadline(budget)
    run.timed_out = spent_before(run.clock, budget)  # (the clock is read after each step)
    first, timing, perf = s.step, run.timing, time.perf_counter
    while (  # (stopped: by a signal of Options(stop_on=), stopping.py)
        s.epoch < epochs and s.step < max_steps and not (s.pruned or run.timed_out or run.stopped)
    ):
        data0, steps0, tick = timing.data, timing.steps, perf()
        batches = _batches(trainer, run, data)
        timing.data += perf() - tick  # (a resumed epoch reads its front again)
        # carried state starts afresh each epoch, or as a mid-epoch checkpoint left it
        start_epoch(run.carries, s.carried, s.position, run.device, run.rank)
        s.carried = None
        counted, tick = timing.total(), perf()
        if fast:
            i, ended = fast_epoch(trainer, run, batches, val, step_sched, max_steps, graph_net)
        else:
            i, ended = _epoch(
                trainer, run, batches, val, step_sched, max_steps, graph_net, accumulate
            )
        # the steps: the epoch's loop less its waits for data, evaluations and checkpoints
        timing.steps += perf() - tick - (timing.total() - counted)
        if ended:  # the epoch ran to its end
            if i < 0 and s.position == 0:
                raise ValueError(
                    f"the training data yielded no batches in epoch {s.epoch}"
                    + (f" for rank {run.rank} of {run.world}" if run.world > 1 else "")
                    + "; pass a non-empty sequence of batches or a DataLoader (a generator"
                    " is used up after one epoch)"
                )
            if s.epoch == 0:
                s.epoch_examples = _over_ranks(trainer, run, s.examples_seen)
            cache = run.tally.end_epoch(s.epoch, warn=run.rank == 0) if run.tally else {}
            record = (
                evaluate_into(trainer, run, epoch_end=True)
                if val is not None and evaluates_at_epoch_end(trainer.options, s.epoch)
                else None
            )
            if epoch_sched is not None:  # after the epoch's evaluation, as torch documents
                epoch_sched.step()
            tick = perf()
            s.flush(run.world)  # (the steps' losses, read back: the device's queued work)
            timing.steps += perf() - tick
            loss, terms = s.end_epoch()  # the epoch's mean (epoch_loss.py)
            means = s.end_epoch_metrics(run.world)  # its node metrics' (epoch_metrics.py)
            if watchers:
                spent = (timing.data - data0, timing.steps - steps0)
                ended_with = (record or {}, cache, *spent, loss, terms, means)
                notify(watchers, EpochEnd(run.id, s.epoch, s.step, *ended_with))
            s.epoch, s.position = s.epoch + 1, 0
            if trainer.checkpoint is not None:
                save(trainer, run)
            continue
        break
    if run.timed_out and not run.stopped and s.position and s.step > first and val is not None:
        _evaluate_at_time_out(trainer, run)


def _evaluate_at_time_out(trainer: Trainer, run: ActiveRun) -> None:
    """Out of time mid-epoch, in an epoch whose end (or a step of which) evaluates: the
    model trained so far is evaluated once more, as Lightning's ``Timer`` asks for a
    validation when it stops a run (not at ``max_steps``, as Lightning neither)."""
    s, o = run.state, trainer.options
    if s.metrics and s.metrics[-1]["step"] == s.step:  # (evaluated at this very step)
        return
    if o.eval_every_steps is not None or evaluates_at_epoch_end(o, s.epoch):
        # Recorded (result.metrics, result.best), and nothing else: no pruner asked, no
        # plateau stepped, the RNG put back, so a run resumed with a larger budget goes on
        # as if never stopped. The checkpoint written at this step, if any, is written
        # again: the record is in the one a resume reads.
        kept = snapshot()
        try:
            evaluate_into(trainer, run, final=True)
        finally:
            put_back(kept)
        if run.checkpoint is not None and trainer.checkpoint is not None:
            run.resave = run.checkpoint == trainer.checkpoint.file(s.step)


def _over_ranks(trainer: Trainer, run: ActiveRun, examples: int) -> int:
    """``examples`` over all ranks. The steps count every rank's examples already (their
    non-finite check reduces them), except under ``Options(nonfinite="ignore")``, which
    skips that check: then they are this rank's, and are summed here, once a run."""
    if run.world == 1 or trainer.options.nonfinite != "ignore":
        return examples
    return int(ddp.total(torch.tensor([examples]))[0])


def _persistent_workers(data: Any) -> bool:
    return bool(getattr(data, "persistent_workers", False) and getattr(data, "num_workers", 0))


def _batches(trainer: Trainer, run: ActiveRun, data: Iterable[Any]) -> Iterator[Any]:
    """The epoch's batches. Loading them may draw from the global RNG (augmentation in a
    dataset, a sampler without a generator), so the RNG state the epoch begins with is
    kept (``RunState.epoch_rng``, in every checkpoint). A run resumed mid-epoch draws the
    batches it skips from that state, as the interrupted run drew them, and then goes on
    from the checkpoint's own state; the loops skip the positions in front unread. (Only
    when checkpoints are written and the data is not a plain list or tuple of batches,
    whose reading draws nothing: ``run.replay``.)"""
    s, held = run.state, run.held
    if s.epoch_rngs is not None and len(s.epoch_rngs) == run.world:  # DDP: this rank's own
        s.epoch_rng = s.epoch_rngs[run.rank]
    if s.epoch_helds is not None and len(s.epoch_helds) == run.world:
        s.epoch_held = s.epoch_helds[run.rank]
    s.epoch_rngs = s.epoch_helds = None
    resuming = run.replay and s.position > 0 and s.epoch_rng is not None
    now = snapshot() if run.replay else None
    now_held = held_states(held) if run.replay and held else None  # (held_rng.py)
    if resuming:
        put_back(s.epoch_rng)
        if held and s.epoch_held is not None:
            put_held(held, s.epoch_held)
    else:
        s.epoch_rng, s.epoch_held = now, now_held
    batches = limited(
        epoch_batches(data, s.epoch, trainer.seed, trainer.options.shuffle, run.rank, run.world),
        run.train_batches,
    )
    if not resuming:
        return batches
    for _ in itertools.islice(batches, s.position):  # (read as the interrupted run read them)
        pass
    put_back(now)
    if now_held:
        put_held(held, now_held)
    return itertools.chain(itertools.repeat(None, s.position), batches)


def _epoch(
    trainer: Trainer,
    run: ActiveRun,
    batches: Iterator[Any],
    val: Iterable[Any] | None,
    step_sched: Any,
    max_steps: int,
    graph_net: GraphModule | None,
    accumulate: int,
) -> tuple[int, bool]:
    """One epoch's steps, any setting: (index of the last batch, whether it ran to its end)."""
    s, watchers = run.state, run.watchers
    every = trainer.options.eval_every_steps
    ckpt_every = trainer.checkpoint.every_steps if trainer.checkpoint is not None else None
    i = -1
    stopped = None  # the RNG states as the last step left them (see fast_epoch)
    # carried state a skipped step must not pass on (a NaN state would skip every step after)
    carried = run.carries if trainer.options.nonfinite == "skip" else []
    # TrainResult.timing's "data": the waits for batches, between a step's end and the next
    perf, waited = time.perf_counter, 0.0
    done = perf()
    for i, group in _groups(batches, s.position, accumulate):
        tick = perf()  # (StepEnd.seconds counts from here)
        waited += tick - done
        if s.pruned or s.step >= max_steps or run.timed_out or run.stopped:
            if stopped is not None:
                put_back(stopped[0])
                put_held(run.held, stopped[1])
            run.timing.data += waited
            return i, False
        if graph_net is not None:
            graph_net.step = s.step + 1  # nodes see the number of the step they compute
        # the rates this step uses: the first group's, and every group's when there are several
        groups = run.opt.param_groups if watchers else ()
        lr = groups[0]["lr"] if groups else 0.0
        lrs = tuple([float(g["lr"]) for g in groups]) if len(groups) > 1 else ()
        kept = [c.value for c in carried]
        loss, n, stepped = step(trainer, run, group, i)
        if not stepped:  # a non-finite loss, skipped: no step taken, the batch consumed
            for c, v in zip(carried, kept):  # the state as the step before left it
                c.value = v
            s.skipped += 1
            s.position = i + 1
            done = perf()
            continue
        if step_sched is not None:
            step_sched.step()
        s.step += 1
        s.position = i + 1
        s.examples_seen += n
        for reported, size in run.reported:  # each batch's node metrics (epoch_metrics.py)
            if reported:
                s.metric_sums.add(reported, size)
        if isinstance(loss, float):  # already read back (the non-finite check)
            s.losses.append(loss)
            s.epoch_loss.add(loss, n)
            if run.terms or s.terms:
                s.add_terms(run.terms, n)
        else:
            s.pending.append(loss)
            s.pending_examples.append(n)
            s.pending_terms.append(run.terms)
        if watchers:
            _report_step(run, loss, lr, n, tick, lrs)
        if val is not None and every and s.step % every == 0:
            evaluate_into(trainer, run)
        if (run.due or (ckpt_every and s.step % ckpt_every == 0)) and i + 1 != run.epoch_batches:
            save(trainer, run)  # (at the epoch's last batch: its end saves, at this step)
        if run.deadline is not None or run.stop is not None:
            step_end(run)  # max_time spent, or a signal: under DDP, on any rank
        if run.replay and (s.pruned or s.step >= max_steps or run.timed_out or run.stopped):
            stopped = snapshot(), held_states(run.held)
        done = perf()
    run.timing.data += waited + perf() - done  # (the epoch's end: a DataLoader's workers)
    return i, True


def _groups(batches: Iterator[Any], start: int, k: int) -> Iterator[tuple[int, list[Any]]]:
    """(index of the last batch, the batches) of each optimizer step, from batch ``start``.

    Groups of ``k`` batches counted from the epoch's first, so a resumed epoch (``start``
    a multiple of ``k``) groups as the uninterrupted one did; the last may be smaller.
    """
    group: list[Any] = []
    i = -1
    for i, batch in enumerate(batches):
        if i < start:  # resuming mid-epoch: these batches were already trained on
            continue
        group.append(batch)
        if len(group) == k:
            yield i, group
            group = []
    if group:
        yield i, group


def _report_step(
    run: ActiveRun, loss: torch.Tensor | float, lr: Any, n: int, tick: float, lrs: tuple[float, ...]
) -> None:
    s, seconds = run.state, time.perf_counter() - tick
    norm = None if run.grad_norm is None else float(run.grad_norm)  # (step._update's)
    terms = {k: float(v) for k, v in run.terms.items()}  # (a loss function's dict: step.py)
    notify(
        run.watchers,
        StepEnd(run.id, s.step, s.epoch, float(loss), float(lr), n, seconds, lrs, norm, terms),
    )
    reported = fit_metrics(run.net)
    if reported:  # (checked as an evaluation checks them; numbers, as Metrics says)
        for node, values in reported.items():
            checked = {k: float(v) for k, v in node_scalars(node, values).items()}
            notify(run.watchers, Metrics(run.id, node, s.step, checked))
