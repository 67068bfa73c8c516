"""The Trainer: one training run, returned as a ``TrainResult``.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from somatize import Graph, Node, Done, Opaque
    >>> import somatize.torch as st
    >>> class Linear(Node):
    ...     def __init__(self, i, o): self.lin = nn.Linear(i, o)
    ...     def forward(self, x, ctx): return Done(Opaque(self.lin(x)))
    >>> g = Graph.somatize(Linear(4, 1))
    >>> data = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(4)]
    >>> trainer = st.Trainer(loss=nn.functional.mse_loss,
    ...                      optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), epochs=2)
    >>> result = trainer.fit(g, data)
    >>> result.steps, result.num_examples
    (8, 32)
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from ..errors import SettingError
from ..graph import Graph
from ..watchers import FitEnd, FitStart, Watcher, notify
from . import ddp, tally
from .batches import checked_split, loss_of, num_examples, split
from .begin import begin
from .carry import check_last_batch, named_carries
from .checkpoint import Checkpointing
from .data_checks import check_data, check_rereadable
from .ddp_cache import warn_private_rows
from .determinism import deterministic
from .final_weights import warn_nonfinite
from .first_step import first_step
from .horizon import total_steps
from .limits import batches_per_epoch, epoch_examples, one_epoch
from .loop import train as train_loop
from .metrics import Metric, check_ranks, members
from .options import Options
from .policy import best_step, check_writable, save, writing
from .ported import lightning_methods, ported, warn_lightning_module
from .pruning import pruned_reason
from .rank_lengths import agree, warn_dropped
from .result import TrainResult, state_copy
from .rng import own_generators
from .sanity import sanity_check
from .schedule import check_steps_fit
from .seed_sweep import DEFAULT_SEED, check_global_seed
from .settings import check_arguments, check_fit, check_measured, check_parts
from .smoke import smoke_fit
from .start import close, dynamic_step
from .stopping import exit_if_stopped, stopping
from .trainer_tools import TrainerTools
from .valsets import monitored, val_sets

__all__ = ["Options", "Trainer"]

Loss = Callable[..., Any]  # a scalar tensor, or a dict {"loss": scalar, "<term>": value...}


@lightning_methods  # trainer.validate, .global_step: the AttributeError names what to use
class Trainer(TrainerTools):
    """One training run of a graph (or of the module ``module(g)``, or any ``nn.Module``).

    Args:
        loss: ``loss(output, target) -> scalar``, or a dict ``{"loss": scalar, "kl": kl}``
            whose other entries are logged (``StepEnd.terms``, ``val_kl``), not trained on;
            None when the graph's output is the loss.
        optimizer: a factory ``params -> torch.optim.Optimizer``; ``fit`` needs it,
            ``evaluate`` and ``predict`` do not.
        scheduler: a factory ``optimizer -> LR scheduler``, stepped per ``Options.scheduler_every``.
        epochs: passes over the training data (default 1, or unbounded with ``max_steps``).
        max_steps: stop after this many optimizer steps.
        micro_batches: split each batch into this many chunks (``torch.chunk``) and
            accumulate; for a mean-reduced loss the gradient is the full batch's up to
            rounding (not with BatchNorm: each chunk is normalised by its own statistics).
        metrics: name → ``fn(output, target)`` (a batch mean, averaged over examples) or a
            metric object with ``reset``/``update``/``compute`` (a ``torchmetrics.Metric``;
            one of your own also needs ``merge`` under DDP), evaluated on ``val`` and
            logged as ``val_<name>``. A torchmetrics ``MetricCollection`` gives each member:
            ``metrics=collection`` as ``val_<member>``, ``{"cls": collection}`` as
            ``val_cls_<member>``.
        checkpoint: a ``Checkpointing`` (directory, frequency, how many to keep).
        watchers: told of every step, epoch and node metric (``TensorBoard``, ``Progress``...).
        pruner: asked after each evaluation (``Patience``, ``Threshold``, an Optuna ``Trial``).
        seed: seeds python, numpy and torch at the start of a fresh run (the caller's
            generators are given back when fit ends), and the batch order — not the
            global seed: a sweep seeding ``torch.manual_seed(s)`` passes ``seed=s`` too.
        options: the less common settings (device, precision, clipping...).
        split: how a batch becomes ``(inputs, target)`` — the model gets the inputs, the
            loss and metrics ``(output, target)`` — for batches of another form than
            ``(x, y)`` or ``{"x": ..., "y": ...}``: ``split=lambda b: (b["input_ids"],
            b["labels"])``. Used in training, ``evaluate`` and ``predict``; needs ``loss=``.
    """

    @ported("Trainer")
    def __init__(
        self,
        *,
        loss: Loss | None = None,
        optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None,
        scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
        epochs: int | None = None,
        max_steps: int | None = None,
        micro_batches: int = 1,
        metrics: Mapping[str, Callable[[Any, Any], Any] | Metric] | Metric | None = None,
        checkpoint: Checkpointing | None = None,
        watchers: Iterable[Watcher] | None = (),
        pruner: Any = None,
        seed: int = DEFAULT_SEED,  # 0, marked as not given (seed_sweep.py)
        options: Options = Options(),  # frozen, so one shared default is safe
        split: Callable[[Any], tuple[Any, Any]] | None = None,
    ) -> None:
        watchers = () if watchers is None else watchers  # (as metrics=None: none)
        named = members(metrics)  # a MetricCollection's members, each a metric (metrics.py)
        check_arguments(optimizer, scheduler, epochs, max_steps, micro_batches, named, pruner, seed)
        check_parts(loss, checkpoint, watchers, options)
        check_measured(named, loss)
        self.split = checked_split(split, loss)
        self.loss, self.optimizer, self.scheduler = loss, optimizer, scheduler
        self.epochs = epochs if epochs is not None else (None if max_steps else 1)
        self.max_steps, self.micro_batches = max_steps, micro_batches
        self.metrics = dict(named or {})
        self.checkpoint, self.pruner, self.options = checkpoint, pruner, options
        self.seed, self._seed_given = int(seed), seed is not DEFAULT_SEED  # (seed_sweep.py)
        self.watchers = list(watchers)
        # a fresh fit starts the pruner from this state, so one Trainer can run many fits
        snapshot = getattr(pruner, "state_dict", None)
        self._pruner_start = snapshot() if snapshot is not None else None

    # -- one run ----------------------------------------------------------------------

    @ported("fit")
    def fit(
        self,
        model: Graph | nn.Module,
        train: Iterable[Any],
        val: Iterable[Any] | Mapping[str, Iterable[Any]] | None = None,
        *,
        resume: str | os.PathLike[str] | None = None,
    ) -> TrainResult:
        """Train ``model`` on ``train`` (re-iterable batches), evaluating on ``val``.

        Args:
            model: a ``Graph``, ``module(g)``, or any ``nn.Module``.
            train: a sequence of batches (the Trainer shuffles it) or a DataLoader — not a
                ``Dataset`` of examples: wrap it, ``DataLoader(dataset, batch_size=32)``.
            val: batches to evaluate on: at each epoch end, every ``eval_every_steps`` or at
                the end of every ``eval_every_epochs``-th epoch. A dict name → batches
                evaluates each set, its metrics named ``val_<name>_loss``...
            resume: ``"last"`` (the latest checkpoint, or a fresh start when there is none)
                or a checkpoint path; the run continues bitwise identically.

        Raises:
            CheckpointError: the checkpoint to resume from is missing, torn or foreign.
            KeyError: ``Options(monitor=...)`` names a metric evaluation does not produce.
            SettingError: a pruner or ``Checkpointing(best=...)`` without ``val=`` data; a
                torch ``Dataset`` of examples, or a list of DataLoaders, as ``train`` or ``val``.
        """
        started = time.perf_counter()
        if self.optimizer is None:
            raise SettingError(
                "fit() trains, so the Trainer needs an optimizer factory: "
                "st.Trainer(..., optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3)) "
                "(evaluate() and predict() do without one)"
            )
        check_data(train, "fit()'s train", self._split, train=True)  # not a Dataset of examples
        check_global_seed(self)  # torch.manual_seed(s) varying, Trainer(seed=) not given
        warn_lightning_module(model)  # its training_step would not run (ported.py)
        with deterministic(self.options.deterministic), own_generators():  # (rng.py)
            if self.options.smoke:  # one epoch of N batches, nothing kept (smoke.py)
                return smoke_fit(self, model, train, val, resume)
            check_rereadable(train, self.epochs, self.max_steps)  # not a generator, for 2 epochs
            check_fit(self, val)
            run_id = os.urandom(6).hex()  # (uuid4().hex[:12]: the same 48 random bits)
            with stopping(self.options.stop_on, self.checkpoint) as stop:  # (stopping.py)
                rank, world, own_group = ddp.setup()
                try:
                    with writing(self, rank, resume):  # one fit writes a checkpoint dir at a time
                        args = (resume, run_id, rank, world, started, stop)
                        result = self._fit(model, train, val, *args)
                except BaseException as e:
                    if world > 1:
                        ddp.explain(e)  # DDP's advice, as an Option of the Trainer that wraps
                    if own_group:
                        ddp.finish(failed=True)  # the group goes: peers waiting on it fail now
                    raise
                if own_group:
                    ddp.finish(failed=False)  # every rank leaves fit together; the group stays
            exit_if_stopped(stop)  # a signal stopped it: SystemExit(128 + signum)
            return result

    def _fit(
        self,
        model: Graph | nn.Module,
        train: Iterable[Any],
        val: Iterable[Any] | None,
        resume: Any,
        run_id: str,
        rank: int,
        world: int,
        started: float,
        stop: Any = None,
    ) -> TrainResult:
        train = ddp.shard(train, rank, world, self.seed)  # each rank reads only its share
        agree(train, val, world, seed=self.seed)  # one length and seed on every rank
        if rank == 0:
            warn_dropped(train, world, self.seed, self.options.shuffle, self._examples)
            warn_private_rows(model, world)  # per-example memory needs a shared keeper
        o = self.options  # limits resolved against the data before any step (limits.py)
        train_n = batches_per_epoch(
            "limit_train_batches", o.limit_train_batches, train, rank, world, even=True
        )
        sets = val_sets(val, o.limit_val_batches, rank, world)  # one or several (valsets.py)
        if sets:
            check_ranks(self.metrics, world)  # before any step: objects must merge under DDP
        total = total_steps(self, train, world)
        check_steps_fit(o.eval_every_steps if sets and not resume else None, total)
        run = begin(self, model, resume, run_id, rank, world, train, monitored(o.monitor, val))
        if rank == 0:  # (a run with steps left: it will write checkpoints)
            check_writable(self, run.state.step, total)
        run.train, run.train_batches, run.val_sets, run.stop = train, train_n, sets, stop
        if run.carries and val is not None:  # (a short last batch breaks the carried state)
            for name, data in val.items() if isinstance(val, Mapping) else [("", val)]:
                what = f"val set {name!r}" if name else "fit()'s val"
                check_last_batch(named_carries(run.net), data, what)
        if run.plateau and val is None:
            raise ValueError(
                "ReduceLROnPlateau is stepped with the monitored metric after each evaluation, "
                "but fit() got no val= data; pass val=batches (and Options(monitor=...))"
            )
        s = run.state
        n_train = epoch_examples(  # (each batch's examples as the steps count them)
            train, train_n, self.seed, self.options.shuffle, world, self._examples
        )
        # counts what remembered nodes find, on from a resumed checkpoint's counts (tally.py)
        run.tally = tally.attach(run.net, tally.resumed(s.cache, rank, world))
        failing: BaseException | None = None
        try:
            sanity_check(self, run)  # a few val batches first; changes nothing (sanity.py)
            if run.watchers:  # (no event is made for no one)
                evaluated = bool(s.metrics) and s.metrics[-1]["step"] == s.step
                steps = (self.epochs or 0, self.max_steps or 0, s.step, total, s.position)
                notify(run.watchers, FitStart(run.id, *steps, evaluated, resume is not None))
            compiling = dynamic_step() if run.compiled else contextlib.nullcontext()
            with compiling, first_step(self, run, train):  # checks made once (first_step.py)
                train_loop(self, run, train, val)
            s.flush(world)
            if (
                self.checkpoint is not None
                and s.step
                and (run.checkpoint != self.checkpoint.file(s.step) or run.resave)
            ):
                save(self, run)
            if run.average is not None and run.average.updates:
                run.average.exchange()  # the model keeps the average (checkpoints: both)
            if world > 1:  # every rank returns rank 0's model: the one checkpointed
                ddp.broadcast_buffers(run.net)
            seconds = time.perf_counter() - started
            if run.watchers:
                last = s.metrics[-1] if s.metrics else {}
                final = {k: v for k, v in last.items() if k not in ("step", "epoch")}
                if s.losses:
                    final["loss"] = s.losses[-1]
                notify(run.watchers, FitEnd(run.id, s.step, s.epoch, seconds, s.pruned, final))
        except BaseException as e:
            failing = e
            raise
        finally:
            if run.average is not None:
                run.average.detach()
            tally.detach(run.net, run.tally)
            close(run.watchers, failing)  # also when training fails: event files are flushed
            failing = None  # (this frame holding its own exception was a reference cycle)
        state = state_copy(run.net.state_dict())
        warn_nonfinite(state, self.options.nonfinite)  # a NaN no loss showed (final_weights.py)
        return TrainResult(
            state=state,
            num_examples=one_epoch(n_train, s),
            steps=s.step,
            epochs=s.epoch,
            **s.histories(),  # losses, epoch_losses, terms, epoch_terms, epoch_metrics
            metrics=[dict(m) for m in s.metrics],
            monitor=s.monitor,
            best=s.best,
            pruned=s.pruned,
            pruned_reason=pruned_reason(self.pruner) if s.pruned else None,
            checkpoint=str(run.checkpoint) if run.checkpoint is not None else None,
            best_checkpoint=(
                str(self.checkpoint.file(b))
                if self.checkpoint is not None and (b := best_step(s)) is not None
                else None
            ),
            skipped=s.skipped,
            seconds=seconds,
            timing=run.timing.parts(seconds),
            seed=self.seed,
            cache=tally.over_ranks(tally.totals(run.tally), world),
            timed_out=run.timed_out,
            val_examples=dict(s.val_examples),
        )

    def _examples(self, batch: Any) -> int:
        return num_examples(self._split(batch)[0])

    def _split(self, batch: Any) -> tuple[Any, Any]:
        # without a loss function the graph computes the loss, so it gets the whole batch
        if self.loss is None:
            return batch, None
        return self.split(batch) if self.split is not None else split(batch)

    def _loss(self, output: Any, target: Any) -> torch.Tensor:
        return loss_of(self.loss, output, target)
