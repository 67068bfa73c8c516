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
import itertools
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from ..errors import CheckpointError
from ..graph import Graph
from ..watchers import EpochEnd, FitEnd, FitStart, Metrics, StepEnd, Watcher, notify
from . import ddp
from .batches import chunk, epoch_batches, loss_of, num_examples, split, to_device
from .checkpoint import Checkpointing, RunState, capture, load_checkpoint, restore
from .metrics import evaluate
from .module import GraphModule, module
from .result import TrainResult

__all__ = ["Options", "Trainer"]

Loss = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Options:
    """The Trainer's less common settings.

    Args:
        device: where to train (default: where the model's parameters are; under
            torchrun with CUDA, this rank's GPU).
        precision: ``"32"``, or ``"bf16"`` for bfloat16 autocast.
        clip_grad_norm: clip the gradients' total norm to this value before each step.
        shuffle: permute a sequence of batches every epoch (seeded by ``(seed, epoch)``).
        eval_every_steps: evaluate every N steps instead of at each epoch end.
        monitor: the metric ``TrainResult.best`` tracks (and pruners without a ``metric``).
        mode: ``"min"`` or ``"max"`` — which way ``monitor`` improves.
        progress: show a progress bar; None: when standard error is a terminal.
        scheduler_every: step the LR scheduler every ``"step"`` or every ``"epoch"``.
    """

    device: str | torch.device | None = None
    precision: Literal["32", "bf16"] = "32"
    clip_grad_norm: float | None = None
    shuffle: bool = True
    eval_every_steps: int | None = None
    monitor: str = "val_loss"
    mode: Literal["min", "max"] = "min"
    progress: bool | None = None
    scheduler_every: Literal["step", "epoch"] = "step"

    def __post_init__(self) -> None:
        if self.precision not in ("32", "bf16"):
            raise ValueError(f"precision must be '32' or 'bf16', not {self.precision!r}")
        if self.mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', not {self.mode!r}")
        if self.scheduler_every not in ("step", "epoch"):
            raise ValueError(
                f"scheduler_every must be 'step' or 'epoch', not {self.scheduler_every!r}"
            )


@dataclass(slots=True)
class _Run:
    """What one ``fit`` works with."""

    id: str
    net: nn.Module  # the module trained
    wrapped: nn.Module  # the same, in DDP under torchrun
    params: list[nn.Parameter]
    opt: torch.optim.Optimizer
    sched: Any
    device: torch.device
    autocast: Callable[[], Any]
    rank: int
    world: int
    watchers: list[Watcher] = field(default_factory=list)
    state: RunState = field(default_factory=RunState)
    checkpoint: Path | None = None  # the last checkpoint written, or resumed from


class Trainer:
    """One training run of a graph (or of the module ``module(g)``, or any ``nn.Module``).

    Args:
        loss: ``loss(output, target) -> scalar``; None when the graph's output is the loss.
        optimizer: a factory ``params -> torch.optim.Optimizer``.
        scheduler: a factory ``optimizer -> LR scheduler``, stepped per ``Options.scheduler_every``.
        epochs: passes over the training data (default 1, or unbounded with ``max_steps``).
        max_steps: stop after this many optimizer steps.
        micro_batches: split each batch into this many chunks (``torch.chunk``) and
            accumulate; the gradient equals the full batch's for a mean-reduced loss.
        metrics: name → ``fn(output, target)`` evaluated on ``val`` (logged as ``val_<name>``).
        checkpoint: a ``Checkpointing`` (directory, frequency, how many to keep).
        watchers: told of every step, epoch and node metric (``TensorBoard``, ``Progress``...).
        pruner: asked after each evaluation (``Patience``, ``Threshold``, an Optuna ``Trial``).
        seed: seeds python, numpy and torch at the start of a fresh run, and the batch order.
        options: the less common settings (device, precision, clipping...).
    """

    def __init__(
        self,
        *,
        loss: Loss | None = None,
        optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
        scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
        epochs: int | None = None,
        max_steps: int | None = None,
        micro_batches: int = 1,
        metrics: Mapping[str, Callable[[Any, Any], Any]] | None = None,
        checkpoint: Checkpointing | None = None,
        watchers: Iterable[Watcher] = (),
        pruner: Any = None,
        seed: int = 0,
        options: Options = Options(),  # frozen, so one shared default is safe
    ) -> None:
        if not callable(optimizer):
            raise TypeError(
                "optimizer must be a factory over parameters, e.g. "
                "optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3)"
            )
        if micro_batches < 1:
            raise ValueError(f"micro_batches must be at least 1, not {micro_batches}")
        if epochs is not None and epochs < 1:
            raise ValueError(f"epochs must be at least 1, not {epochs}")
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, not {max_steps}")
        if pruner is not None and not (
            hasattr(pruner, "report") and hasattr(pruner, "should_prune")
        ):
            raise TypeError(
                "pruner must have report(value, step) and should_prune() (e.g. st.Patience)"
            )
        self.loss, self.optimizer, self.scheduler = loss, optimizer, scheduler
        self.epochs = epochs if epochs is not None else (None if max_steps else 1)
        self.max_steps, self.micro_batches = max_steps, micro_batches
        self.metrics = dict(metrics or {})
        self.checkpoint, self.pruner, self.seed, self.options = checkpoint, pruner, seed, options
        self.watchers = list(watchers)
        # a fresh fit starts the pruner from this state, so one Trainer can run many fits
        snapshot = getattr(pruner, "state_dict", None)
        self._pruner_start = snapshot() if snapshot is not None else None

    # -- one run ----------------------------------------------------------------------

    def fit(
        self,
        model: Graph | nn.Module,
        train: Iterable[Any],
        val: Iterable[Any] | None = None,
        *,
        resume: str | os.PathLike[str] | None = None,
    ) -> TrainResult:
        """Train ``model`` on ``train`` (re-iterable batches), evaluating on ``val``.

        Args:
            model: a ``Graph``, ``module(g)``, or any ``nn.Module``.
            train: a sequence of batches (the Trainer shuffles it) or a DataLoader.
            val: batches to evaluate on, at each epoch end or every ``eval_every_steps``.
            resume: ``"last"`` (the latest checkpoint, or a fresh start when there is none)
                or a checkpoint path; the run continues bitwise identically.

        Raises:
            CheckpointError: the checkpoint to resume from is missing, torn or foreign.
        """
        started = time.perf_counter()
        if self.pruner is not None and val is None:
            raise ValueError(
                "a pruner is asked after each evaluation, but fit() got no val= data; "
                "pass val=batches (or drop the pruner)"
            )
        run_id = uuid.uuid4().hex[:12]
        rank, world, own_group = ddp.setup()
        try:
            return self._fit(model, train, val, resume, run_id, rank, world, started)
        finally:
            if own_group:
                ddp.teardown()

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
    ) -> TrainResult:
        run = self._start(model, resume, run_id, rank, world)
        s = run.state
        n_train = _count_examples(train, world)
        try:
            notify(run.watchers, FitStart(run.id, self.epochs or 0, self.max_steps or 0, s.step))
            self._train(run, train, val)
            s.flush(world)
            if (
                self.checkpoint is not None
                and s.step
                and run.checkpoint != self.checkpoint.file(s.step)
            ):
                self._save(run)
            seconds = time.perf_counter() - started
            notify(run.watchers, FitEnd(run.id, s.step, s.epoch, seconds, s.pruned))
        finally:
            _close(run.watchers)  # also when training fails: event files are flushed
        return TrainResult(
            state={k: v.detach().to("cpu", copy=True) for k, v in run.net.state_dict().items()},
            num_examples=n_train if n_train is not None else s.examples_seen,
            steps=s.step,
            epochs=s.epoch,
            losses=list(s.losses),
            metrics=[dict(m) for m in s.metrics],
            monitor=self.options.monitor,
            best=s.best,
            pruned=s.pruned,
            checkpoint=str(run.checkpoint) if run.checkpoint is not None else None,
            seconds=seconds,
            seed=self.seed,
        )

    def _start(
        self, model: Graph | nn.Module, resume: Any, run_id: str, rank: int, world: int
    ) -> _Run:
        """Module, device, optimizer, scheduler; then restore a checkpoint or seed afresh."""
        net = _as_module(model)
        default = next((p.device for p in net.parameters()), torch.device("cpu"))
        device = ddp.device(self.options.device, world, default)
        tensors = itertools.chain(net.parameters(), net.buffers())
        if any(t.device != device for t in tensors):  # .to() walks every module even when idle
            net.to(device)
        params = _trainable(net)
        opt = self.optimizer(params)
        run = _Run(
            id=run_id,
            net=net,
            wrapped=ddp.wrap(net, device) if world > 1 else net,
            params=params,
            opt=opt,
            sched=self.scheduler(opt) if self.scheduler is not None else None,
            device=device,
            autocast=_autocast(self.options.precision, device),
            rank=rank,
            world=world,
        )
        path = self._resume_path(resume)
        if path is not None:
            payload = load_checkpoint(path)
            restore(payload, run.state, net, opt, run.sched, self.pruner, self.seed)
            run.checkpoint = path
        else:
            self._fresh_start()
        run.watchers = self._watchers() if rank == 0 else []
        return run

    def _train(self, run: _Run, train: Iterable[Any], val: Iterable[Any] | None) -> None:
        """The epochs: steps, evaluations, checkpoints, until done, pruned or out of steps."""
        s, net, watchers = run.state, run.net, run.watchers
        graph_net = net if isinstance(net, GraphModule) else None
        epochs = self.epochs if self.epochs is not None else sys.maxsize
        step_sched = run.sched if self.options.scheduler_every == "step" else None
        every = self.options.eval_every_steps
        ckpt_every = self.checkpoint.every_steps if self.checkpoint is not None else None
        net.train()
        while s.epoch < epochs and not s.pruned and not self._done(s):
            batches = epoch_batches(
                train, s.epoch, self.seed, self.options.shuffle, run.rank, run.world
            )
            i = -1
            for i, batch in enumerate(batches):
                if i < s.position:  # resuming mid-epoch: these batches were already trained on
                    continue
                if s.pruned or self._done(s):
                    break
                tick = time.perf_counter() if watchers else 0.0
                if graph_net is not None:
                    graph_net.step = s.step + 1  # nodes see the number of the step they compute
                lr = run.opt.param_groups[0]["lr"] if watchers else 0.0  # the rate this step uses
                loss, n = self._step(run, batch)
                if step_sched is not None:
                    step_sched.step()
                s.step += 1
                s.position = i + 1
                s.examples_seen += n
                s.pending.append(loss)
                if watchers:
                    self._report_step(run, loss, lr, n, tick)
                if val is not None and every and s.step % every == 0:
                    self._evaluate_into(run, val)
                if ckpt_every and s.step % ckpt_every == 0:
                    self._save(run)
            else:  # the epoch ran to its end
                if i < 0:
                    raise ValueError(
                        f"the training data yielded no batches in epoch {s.epoch}"
                        + (f" for rank {run.rank} of {run.world}" if run.world > 1 else "")
                        + "; pass a non-empty sequence of batches or a DataLoader (a generator"
                        " is used up after one epoch)"
                    )
                if run.sched is not None and step_sched is None:
                    run.sched.step()
                record = self._evaluate_into(run, val) if val is not None and not every else None
                s.flush(run.world)
                notify(watchers, EpochEnd(run.id, s.epoch, s.step, record or {}))
                s.epoch, s.position = s.epoch + 1, 0
                if self.checkpoint is not None:
                    self._save(run)
                continue
            break

    def _done(self, s: RunState) -> bool:
        return self.max_steps is not None and s.step >= self.max_steps

    def _step(self, run: _Run, batch: Any) -> tuple[torch.Tensor, int]:
        """One optimizer step over a batch (in micro-batches); returns its loss and size."""
        wrapped, opt, device, autocast = run.wrapped, run.opt, run.device, run.autocast
        x, y = self._split(batch)
        x, y = to_device(x, device), to_device(y, device)
        n = num_examples(x)
        opt.zero_grad(set_to_none=True)
        if self.micro_batches == 1:
            if autocast is contextlib.nullcontext:  # full precision: no context to enter
                loss = self._loss(wrapped(x), y)
            else:
                with autocast():
                    loss = self._loss(wrapped(x), y)
            loss.backward()
            total = loss.detach()  # the history is made float32 when it is read back
        else:
            xs = chunk(x, self.micro_batches)
            ys = chunk(y, self.micro_batches) if y is not None else [None] * len(xs)
            total = torch.zeros((), device=device)
            for i, (xc, yc) in enumerate(zip(xs, ys, strict=True)):
                share = num_examples(xc) / n  # each chunk weighs by its size: exact for mean losses
                sync = run.world == 1 or i == len(xs) - 1  # all-reduce gradients once, at the end
                with contextlib.nullcontext() if sync else wrapped.no_sync():  # type: ignore[operator]
                    with autocast():
                        loss = self._loss(wrapped(xc), yc)
                    (loss * share).backward()
                total += loss.detach().float() * share
        if self.options.clip_grad_norm is not None:
            nn.utils.clip_grad_norm_(run.params, self.options.clip_grad_norm)
        opt.step()
        return total, n

    def _split(self, batch: Any) -> tuple[Any, Any]:
        # without a loss function the graph computes the loss, so it gets the whole batch
        return split(batch) if self.loss is not None else (batch, None)

    def _loss(self, output: Any, target: Any) -> torch.Tensor:
        return loss_of(self.loss, output, target)

    # -- evaluation ---------------------------------------------------------------------

    def evaluate(self, model: Graph | nn.Module, data: Iterable[Any]) -> dict[str, float]:
        """The loss and metrics of ``model`` on ``data``, averaged over examples.

        Example:
            >>> trainer.evaluate(g, val)  # doctest: +SKIP
            {'loss': 0.31, 'acc': 0.92}
        """
        net = _as_module(model)
        rank, world = ddp.rank_world()
        device = next((p.device for p in net.parameters()), torch.device("cpu"))
        return self._evaluate(
            net, data, device, _autocast(self.options.precision, device), rank, world
        )

    def _evaluate(
        self,
        net: nn.Module,
        data: Iterable[Any],
        device: torch.device,
        autocast: Callable[[], Any],
        rank: int,
        world: int,
    ) -> dict[str, float]:
        fns = {"loss": self._loss, **self.metrics}
        return evaluate(
            net,
            data,
            fns,
            split=self._split,
            device=device,
            autocast=autocast,
            rank=rank,
            world=world,
        )

    def _evaluate_into(self, run: _Run, val: Iterable[Any]) -> dict[str, float]:
        """Evaluate, record, tell the watchers, and ask the pruner."""
        s = run.state
        evaluated = self._evaluate(run.net, val, run.device, run.autocast, run.rank, run.world)
        values = {f"val_{k}": v for k, v in evaluated.items()}
        record: dict[str, float] = {"step": s.step, "epoch": s.epoch, **values}
        s.metrics.append(record)
        monitor, mode = self.options.monitor, self.options.mode
        if monitor in record:
            v = record[monitor]
            if s.best is None or (v < s.best if mode == "min" else v > s.best):
                s.best = v
        notify(run.watchers, Metrics(run.id, "", s.step, values))  # node '': the Trainer's own
        if self.pruner is not None:
            name = getattr(self.pruner, "metric", monitor)
            if name not in record:
                raise KeyError(
                    f"the pruner watches {name!r}, which evaluation does not produce; "
                    f"evaluated: {', '.join(values)} (name a metric from Trainer(metrics=...))"
                )
            self.pruner.report(record[name], s.step)
            s.pruned = bool(self.pruner.should_prune())
        return record

    # -- reporting --------------------------------------------------------------------

    def _watchers(self) -> list[Watcher]:
        from .progress import Progress

        watchers = list(self.watchers)
        show = self.options.progress
        if show is None:
            show = sys.stderr.isatty()
        if show and not any(isinstance(w, Progress) for w in watchers):
            watchers.append(Progress())
        return watchers

    def _report_step(self, run: _Run, loss: torch.Tensor, lr: Any, n: int, tick: float) -> None:
        s, seconds = run.state, time.perf_counter() - tick
        notify(run.watchers, StepEnd(run.id, s.step, s.epoch, float(loss), float(lr), n, seconds))
        node_metrics = getattr(run.net, "metrics", None)
        if node_metrics:
            for node, values in node_metrics.items():
                notify(run.watchers, Metrics(run.id, node, s.step, values))

    # -- checkpoints --------------------------------------------------------------------

    def _resume_path(self, resume: Any) -> Path | None:
        if resume is None:
            return None
        if resume == "last":
            if self.checkpoint is None:
                raise CheckpointError(
                    "resume='last' needs checkpoint=Checkpointing(dir) to know where to look"
                )
            return self.checkpoint.last()
        return Path(resume)

    def _fresh_start(self) -> None:
        ckpt = self.checkpoint
        if ckpt is not None and (earlier := ckpt.last()) is not None:
            raise CheckpointError(
                f"{ckpt.path} already holds checkpoints of an earlier run (last: {earlier.name}); "
                "continue it with fit(..., resume='last'), or checkpoint into an empty directory"
            )
        if self._pruner_start is not None:
            self.pruner.load_state_dict(self._pruner_start)
        _seed_everything(self.seed)

    def _save(self, run: _Run) -> None:
        """Checkpoint: rank 0 writes, every rank waits for it and records its path."""
        assert self.checkpoint is not None
        s = run.state
        s.flush(run.world)
        if run.rank == 0:
            payload = capture(s, run.net, run.opt, run.sched, self.pruner, self.seed)
            self.checkpoint.save(payload, s.step)
        if run.world > 1:
            ddp.barrier()
        run.checkpoint = self.checkpoint.file(s.step)


def _as_module(model: Graph | nn.Module) -> nn.Module:
    if isinstance(model, Graph):
        return module(model)
    if isinstance(model, nn.Module):
        return model
    raise TypeError(f"Trainer.fit takes a Graph or an nn.Module, got {type(model).__qualname__}")


def _trainable(net: nn.Module) -> list[nn.Parameter]:
    if isinstance(net, GraphModule) and net.graph.program() is not net._program:
        net._sync()  # the graph changed since the module was made
    params = [p for p in net.parameters() if p.requires_grad]
    if not params:
        raise ValueError(
            "nothing to train: every node is frozen or holds no parameters "
            "(unfreeze a node with g.freeze(id, False), or give a node an nn.Module)"
        )
    return params


def _seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    if accelerator is not None and not accelerator.is_available():
        # torch.manual_seed also queues a lazy seed for each absent accelerator backend,
        # formatting a stack trace for each: 0.3 ms, half the Trainer's setup
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)
    with contextlib.suppress(ImportError):
        import numpy as np

        np.random.seed(seed % 2**32)


def _autocast(precision: str, device: torch.device) -> Callable[[], Any]:
    if precision == "bf16":
        return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext


def _count_examples(train: Iterable[Any], world: int) -> int | None:
    """Examples one epoch trains on, over all ranks (None when the data cannot say)."""
    if isinstance(train, Sequence):
        return sum(num_examples(train[i]) for i in range(len(train) - len(train) % world))
    dataset = getattr(train, "dataset", None)
    if dataset is not None and hasattr(dataset, "__len__"):
        return len(dataset)
    return None


def _close(watchers: list[Watcher]) -> None:
    for w in watchers:
        close = getattr(w, "close", None)
        if close is not None:
            close()
