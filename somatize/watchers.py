"""Watchers: being told what happened.

A watcher is any object with ``on_event(event)``; it receives narrow, frozen,
read-only events and nothing it returns is used. Reporting only goes up: a
node reports metrics by returning ``Done(value, metrics=...)``, never by calling
a watcher. Stock watchers: ``Recorder`` (in memory) and ``JsonLines`` (a run log: ``run_log.py``).
``somatize.torch`` adds ``TensorBoard`` and ``Progress``.

Events of one graph execution: ``RunStart``, ``NodeStart``/``NodeEnd``,
``CacheHit``/``CacheMiss``, ``CacheRows`` (per-example memory), ``Metrics``, ``RunEnd``. Events of a training run
(emitted by the Trainer): ``FitStart``, ``StepEnd``, ``EpochEnd``, ``FitEnd``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from .callback_hints import instead_of_callback

__all__ = [
    "CacheHit",
    "CacheMiss",
    "CacheRows",
    "EpochEnd",
    "Event",
    "FitEnd",
    "FitStart",
    "JsonLines",
    "Metrics",
    "NodeEnd",
    "NodeStart",
    "Recorder",
    "RunEnd",
    "RunStart",
    "StepEnd",
    "Watcher",
    "notify",
]


@runtime_checkable
class Watcher(Protocol):
    """The shape of a watcher: one method, told every event."""

    def on_event(self, event: Event) -> None: ...


@dataclass(frozen=True, slots=True)
class Event:
    """The base of all events: the run it belongs to."""

    run_id: str


@dataclass(frozen=True, slots=True)
class RunStart(Event):
    """A graph execution began (``nodes``: how many steps its plan has)."""

    nodes: int


@dataclass(frozen=True, slots=True)
class RunEnd(Event):
    """A graph execution ended after ``seconds``."""

    seconds: float


@dataclass(frozen=True, slots=True)
class NodeStart(Event):
    node: str
    step: int


@dataclass(frozen=True, slots=True)
class NodeEnd(Event):
    """A node finished computing (not sent on a cache hit) after ``seconds``."""

    node: str
    step: int
    seconds: float


@dataclass(frozen=True, slots=True)
class CacheHit(Event):
    """A cached node's output was read from the keeper under ``key``; its code did not run."""

    node: str
    key: str


@dataclass(frozen=True, slots=True)
class CacheMiss(Event):
    """A cached node had no entry under ``key`` and ran."""

    node: str
    key: str


@dataclass(frozen=True, slots=True)
class CacheRows(Event):
    """A node cached per example met a batch: ``hits`` rows were read from the keeper,
    ``misses`` rows were computed (in one call of the node) and stored; ``keys`` are the
    rows' keys, in batch order. ``layout``: how one input row is laid out — the batch's
    structure (``"leaf"``, ``"tuple"``, ``"list"`` or ``"dict"``), its field names, and each
    leaf's codec tag and row layout (a tensor's: dtype and shape without the batch dim) —
    ``("leaf", (), (("torch.tensor", ("int64", (17,))),))``; rows padded to each batch's longest
    sequence come in a layout per length."""

    node: str
    step: int
    hits: int
    misses: int
    keys: tuple[str, ...] = ()
    layout: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Metrics(Event):
    """Scalars a node returned in ``Done(..., metrics=...)`` (``node`` is '' for the Trainer's
    evaluations); during a Trainer's training steps, floats."""

    node: str
    step: int
    values: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class FitStart(Event):
    """A training run began: planned epochs and steps (``max_steps`` 0 when unbounded), and
    the steps it will take in all, when the data's length says (``total_steps``, else 0).
    Resumed (``start_step`` > 0): ``start_position``, the batches of its epoch the
    checkpoint had taken (0: it was written at an epoch's end), and ``start_evaluated``,
    whether it holds an evaluation at ``start_step`` — else one logged there before the
    interruption is made again (a log keeps one of each). ``resuming``: ``fit`` was asked to
    resume (``resume="last"`` or a path); with ``start_step`` 0 no checkpoint was there yet,
    so what an earlier attempt of this run logged (killed before its first checkpoint) is
    replaced, as a resumed run replaces what was logged after its checkpoint."""

    epochs: int
    max_steps: int
    start_step: int
    total_steps: int = 0
    start_position: int = 0
    start_evaluated: bool = False
    resuming: bool = False


@dataclass(frozen=True, slots=True)
class StepEnd(Event):
    """An optimizer step finished: its loss, learning rate, examples and duration.

    Under DDP (told on rank 0 only) ``loss`` is the mean over all ranks' examples and
    ``examples`` all ranks' together, unless ``Options(nonfinite="ignore")`` (then rank 0's own);
    ``lr`` and ``seconds`` are rank 0's. ``lr`` is the first parameter group's rate;
    ``lrs`` each group's, in order, when the optimizer has several (else empty).
    ``grad_norm``: the total L2 norm of the gradients the step used, before any clipping
    (after every micro-batch and accumulated batch, all-reduced under DDP, unscaled under
    fp16: inf or NaN on a step the scaler skips) — told under ``Options(clip_grad_norm=)``
    or ``Options(log_grad_norm=True)``, else None. ``terms``: the other entries of a loss
    function's dict ``{"loss": ..., "recon": ..., "kl": ...}``, weighed as ``loss`` is (over
    micro-batches, accumulated batches and ranks; unscaled); empty for a loss alone."""

    step: int
    epoch: int
    loss: float
    lr: float
    examples: int
    seconds: float
    lrs: tuple[float, ...] = ()
    grad_norm: float | None = None
    terms: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EpochEnd(Event):
    """An epoch (and its evaluation, if any) finished; ``metrics`` holds the evaluation (with
    its ``step`` and ``epoch``, as ``TrainResult.metrics`` rows), ``cache`` what the graph's
    remembered nodes found in the epoch's training steps (node -> ``{"hits": ...,
    "misses": ...}``: rows, items or calls; see ``TrainResult.cache``). ``data`` and
    ``steps``: the seconds the epoch waited for its batches and spent in its steps (as
    ``TrainResult.timing``'s; rank 0's under DDP; 0.0 from a ``LightningGraph``).

    ``loss``: the epoch's training loss (Lightning's ``train_loss_epoch``), the mean over
    its examples of its steps' ``StepEnd.loss``, each weighed by its ``examples`` (over
    every rank's under DDP; skipped steps left out; a run resumed in mid-epoch as if never
    interrupted): ``TrainResult.epoch_losses``. None for an epoch without a step.
    ``terms``: a loss function's terms, weighed alike (its steps' ``StepEnd.terms``).
    From Lightning's ``Watch``: over the steps it told (rank 0's, since the fit began).
    ``node_metrics``: node -> metric -> the epoch's mean of what the node returned in
    ``Done(..., metrics=...)`` in its training steps (Lightning's ``on_epoch=True``): over
    the examples of the batches that reported it, each batch's value weighed by its
    examples (micro-batches and accumulated batches each their own; under DDP every
    rank's; skipped steps left out; resumed in mid-epoch as if never interrupted):
    ``TrainResult.epoch_metrics``. Empty when no node reported one."""

    epoch: int
    step: int
    metrics: Mapping[str, float]
    cache: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    data: float = 0.0
    steps: float = 0.0
    loss: float | None = None
    terms: Mapping[str, float] = field(default_factory=dict)
    node_metrics: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FitEnd(Event):
    """A training run ended (``pruned`` if a pruner stopped it). ``final``: the run's last
    values — ``loss`` (its last step's) and its last evaluation's (``val_loss``...) — over
    the whole run, a resumed one's checkpointed part included. ``epoch``: the epochs
    finished (a count; ``EpochEnd.epoch`` numbers them from 0)."""

    step: int
    epoch: int
    seconds: float
    pruned: bool
    final: Mapping[str, float] = field(default_factory=dict)


def check_watchers(watchers: Any, where: str) -> list[Watcher]:
    """``watchers`` as a list, each checked to have ``on_event``.

    Raises:
        TypeError: naming ``where`` and the one that is not a watcher.
    """
    if callable(getattr(watchers, "on_event", None)) or not isinstance(watchers, Iterable):
        raise TypeError(
            f"{where}: watchers is a list of watchers, not a {type(watchers).__qualname__}; "
            "write watchers=[w]"
        )
    out = list(watchers)
    for w in out:
        if isinstance(w, type):  # (its on_event unbound: a TypeError at the first event)
            raise TypeError(
                f"{where}: {w.__qualname__} is a watcher class, not a watcher; pass an "
                f"instance, {w.__qualname__}(...)"
            )
        if not callable(getattr(w, "on_event", None)):
            callback = instead_of_callback(w)  # (EarlyStopping, ModelCheckpoint: ported)
            raise TypeError(
                f"{where}: {w!r} is not a watcher: a watcher has a method on_event(event)"
                + (
                    f"; {callback}"
                    if callback
                    else " (e.g. Recorder(), JsonLines(path)); wrap a function f in a class "
                    "whose on_event calls f"
                )
            )
    return out


def notify(watchers: Iterable[Watcher], event: Event) -> None:
    """Tell every watcher about ``event``."""
    for w in watchers:
        w.on_event(event)


E = TypeVar("E", bound=Event)


class Recorder:
    """Keeps every event in memory, in order.

    Example:
        >>> r = Recorder(); r.on_event(RunEnd("r1", 0.5)); r.of(RunEnd)[0].seconds
        0.5
    """

    def __init__(self) -> None:
        self.events: list[Event] = []

    def on_event(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type[E]) -> list[E]:
        """The recorded events of one type."""
        return [e for e in self.events if isinstance(e, kind)]

    def clear(self) -> None:
        self.events.clear()


# (at the end: run_log.py imports the events above)
from .run_log import JsonLines  # noqa: E402 -- the run log lives beside, re-exported
