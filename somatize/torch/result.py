"""TrainResult: what one training run returns — small, picklable, plain data and CPU tensors.

Level 3 of the design is a list of these: ``fedavg(results)`` averages their
states, ``summarize(results, "val_acc")`` their metrics.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["TrainResult", "state_copy"]


@dataclass(frozen=True)
class TrainResult:
    """The outcome of ``Trainer.fit``.

    Attributes:
        state: the final state, name-keyed as ``module(g).state_dict()``, detached, on CPU.
        num_examples: training examples in one epoch, over all ranks (the weight ``fedavg``
            uses): a DataLoader's are what its sampler draws (a ``SubsetRandomSampler``'s
            indices, not the whole dataset), less an incomplete last batch under
            ``drop_last``. When the data has no length: the examples its first epoch
            trained on (over all ranks), whatever the number of epochs; a run that stopped
            within its first epoch, the examples it trained on.
        steps: optimizer steps taken in total.
        epochs: epochs completed.
        losses: the training loss of every step.
        epoch_losses: the training loss of every finished epoch (Lightning's
            ``train_loss_epoch``): the mean over its training examples, each step's loss
            weighed by its examples (a short last batch weighs what it holds) — under DDP,
            over every rank's — its skipped steps (``Options(nonfinite="skip")``) left out;
            NaN for an epoch whose every step was skipped. Like ``losses``, the whole run's
            (a resumed run's checkpointed epochs included; a run resumed in mid-epoch
            reports that epoch as an uninterrupted run does). From a ``LightningGraph``,
            the same mean, the number its ``train_loss_epoch`` logs; there an epoch resumed
            in its middle holds the steps since the resume (``lightning_steps.py``).
        terms: a loss function's terms (``loss=fn`` returning ``{"loss": ..., "recon": r,
            "kl": k}``), each a list as long as ``losses``: its value at every step, weighed
            as the loss is (over micro-batches, accumulated batches and ranks). Like
            ``losses``, the whole run's (NaN at the steps before a resume from a checkpoint
            written before it was kept). Empty for a loss alone. From a ``LightningGraph``,
            this rank's steps, as its ``losses``.
        epoch_terms: the same terms' means over every finished epoch, as ``epoch_losses``
            holds the loss's (Lightning's ``train_<term>_epoch``), each list as long as
            ``epoch_losses``. Empty for a loss alone.
        epoch_metrics: each node metric's mean over every finished epoch (a node returning
            ``Done(value, metrics={"acc": ...})`` in training steps: Lightning's
            ``self.log(..., on_epoch=True)``), ``"<node>/<metric>"`` -> a list as long as
            ``epoch_losses``: the mean over the examples of the batches that reported it,
            each batch's value weighed by its examples (under DDP, every rank's batches;
            skipped steps left out; a run resumed in mid-epoch as if never interrupted); NaN
            for an epoch that did not report it. Empty when no node reports metrics, and
            from a ``LightningGraph`` (which logs them per step, ``<node>/<name>``).
        metrics: one dict per evaluation (``{"step": ..., "epoch": ..., "val_loss": ...}``).
        monitor: the metric ``best`` refers to.
        best: the best value of ``monitor`` seen, or None without evaluation.
        pruned: whether a pruner stopped the run.
        pruned_reason: why, in words, when the pruner says (``Patience``: a NaN or infinite
            monitor, or its patience run out; ``Threshold``: the bound crossed) — else the
            pruner's class; under Lightning, ``EarlyStopping``'s message. None if not pruned.
        timed_out: whether ``Options(max_time=...)`` stopped it (the budget was spent).
        checkpoint: the last checkpoint written, if any.
        best_checkpoint: the checkpoint of the best evaluation by ``monitor``, with
            ``Checkpointing(..., best=k)``; load the weights its evaluation judged with
            ``st.load_state(g, st.load_checkpoint(result.best_checkpoint))`` — the whole
            checkpoint: under ``Options(ema=)`` its average, which ``["model"]`` (the raw
            trained weights) is not. ``best_record`` is that evaluation's record.
        skipped: steps skipped for a non-finite loss (``Options(nonfinite="skip")``).
        seconds: wall-clock time of the ``fit`` call.
        timing: where ``seconds`` went, in seconds: ``{"data": ..., "steps": ...,
            "evaluation": ..., "checkpoints": ..., "other": ...}`` — waiting for batches
            (the DataLoader), the training steps (forward, backward, optimizer, the move to
            the device), validation (the sanity check's too), writing checkpoints, and the
            rest (set-up, tear-down); they add up to ``seconds``. Like ``seconds``, this
            ``fit`` call's own (a resumed run's earlier fits are not in it) and, under DDP,
            this rank's. Empty from a ``LightningGraph`` (Lightning has its profiler).
        seed: the seed the run used.
        cache: what the graph's remembered nodes found during the training steps (not
            the evaluations), by node: ``{"enc": {"hits": 9000, "misses": 1000}}`` —
            rows for a node cached per example, items for a cached ``.mapped()`` node,
            calls for a node cached whole; under DDP, over every rank's share. Empty when
            the graph remembers nothing.
        val_examples: the examples each validation set's last evaluation averaged over
            (over all ranks), by the prefix of that set's metrics — ``{"val_": 200}``, or
            ``{"val_clean_": 100, "val_noisy_": 100}`` for ``val={"clean": ..., "noisy":
            ...}``: the weight ``fl.weighted_metrics`` gives each client's metrics.
    """

    state: Mapping[str, torch.Tensor]
    num_examples: int
    steps: int
    epochs: int
    losses: list[float] = field(default_factory=list)
    metrics: list[dict[str, float]] = field(default_factory=list)
    monitor: str = "val_loss"
    best: float | None = None
    pruned: bool = False
    checkpoint: str | None = None
    best_checkpoint: str | None = None
    skipped: int = 0
    seconds: float = 0.0
    seed: int | None = None
    cache: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    pruned_reason: str | None = None
    timed_out: bool = False
    val_examples: Mapping[str, int] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)
    epoch_losses: list[float] = field(default_factory=list)
    terms: dict[str, list[float]] = field(default_factory=dict)
    epoch_terms: dict[str, list[float]] = field(default_factory=dict)
    epoch_metrics: dict[str, list[float]] = field(default_factory=dict)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled: a result pickled before a field was added gets its default."""
        for f in dataclasses.fields(self):
            if f.name not in state and f.default_factory is not dataclasses.MISSING:
                state[f.name] = f.default_factory()
        self.__dict__.update(state)

    @property
    def best_record(self) -> dict[str, float] | None:
        """The record of the evaluation that gave ``best`` (the first, where several tie):
        its ``step``, ``epoch`` and every value evaluated then — which epoch was best, and
        the other metrics of the model selected by ``monitor``. None without evaluation.

        Example:
            >>> r = TrainResult({}, 1, 4, 2, monitor="val_acc", best=0.9,
            ...                 metrics=[{"step": 2, "epoch": 0, "val_acc": 0.9},
            ...                          {"step": 4, "epoch": 1, "val_acc": 0.8}])
            >>> r.best_record["epoch"], r.metric("val_acc")
            (0, 0.8)
        """
        if self.best is None:
            return None
        return next((m for m in self.metrics if m.get(self.monitor) == self.best), None)

    def metric(self, name: str) -> float:
        """The last evaluated value of ``name`` (``"val_acc"``...)."""
        for record in reversed(self.metrics):
            if name in record:
                return float(record[name])
        known = sorted({k for r in self.metrics for k in r} - {"step", "epoch"})
        term = name.removeprefix("train_")
        training = (
            f"; the training loss is no evaluated metric: summarize it as numbers, "
            f"st.summarize([r.epoch_losses[-1] for r in results], {name!r}) (the last epoch's "
            "mean; r.losses[-1]: the last step's)"
            if term in ("loss", "final_loss", "epoch_loss")
            else f"; a loss term: [r.epoch_terms[{term!r}][-1] for r in results] (numbers)"
            if term in self.epoch_terms
            else f"; a node metric of the training steps: [r.epoch_metrics[{term!r}][-1] for r "
            "in results] (the last epoch's mean)"
            if term in self.epoch_metrics
            else " (pass val= data and metrics= to the Trainer)"
        )
        raise KeyError(
            f"no metric {name!r} in this result; evaluated metrics: {', '.join(known) or 'none'}"
            f"{training}"
        )

    def __repr__(self) -> str:
        best = f", best {self.monitor}={self.best:.4g}" if self.best is not None else ""
        last = f", last loss={self.losses[-1]:.4g}" if self.losses else ""
        return (
            f"TrainResult({self.steps} steps, {self.epochs} epochs, "
            f"{self.num_examples} examples{last}{best}{', pruned' if self.pruned else ''})"
        )

    def summary(self) -> dict[str, Any]:
        """The run's figures as plain data, for logs and tables: its counts, the final loss
        (and terms: ``{"recon": ..., "kl": ...}``, empty for a loss alone), the last evaluation, the best value, whether it was pruned or timed out, its time
        (and where it went) and cache counts (not the state, nor the per-step losses and
        every evaluation)."""
        return {
            "num_examples": self.num_examples,
            "steps": self.steps,
            "epochs": self.epochs,
            "final_loss": self.losses[-1] if self.losses else None,
            "final_terms": {k: v[-1] for k, v in self.terms.items() if v},
            "metrics": self.metrics[-1] if self.metrics else {},
            "best": self.best,
            "pruned": self.pruned,
            "pruned_reason": self.pruned_reason,
            "timed_out": self.timed_out,
            "seconds": self.seconds,
            "timing": dict(self.timing),
            "cache": {node: dict(c) for node, c in self.cache.items()},
        }


def state_copy(state: Mapping[str, Any]) -> dict[str, Any]:
    """A result's copy of ``state_dict()``: each tensor on the CPU, cut from autograd
    (``state_dict()`` gave it detached, unless a hook gave it otherwise: no detached view
    made for nothing), a CPU tensor's by ``clone`` (what ``.to("cpu", copy=True)`` makes, a
    little cheaper); a module's extra state that is no tensor (``get_extra_state``: a dict,
    a number) deep-copied, so the result holds no live object of the model."""
    return {k: _copied(v) for k, v in state.items()}


def _copied(t: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        return copy.deepcopy(t)
    if t.requires_grad:
        t = t.detach()
    return t.clone() if t.is_cpu else t.to("cpu", copy=True)
