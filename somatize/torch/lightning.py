"""Lightning: a graph trained by ``lightning.Trainer``, every callback and logger working.

``LightningGraph`` is a real ``LightningModule`` over ``module(g)``; ``result(trainer, lg)``
turns a finished Lightning run into a ``TrainResult`` (so it feeds ``fedavg`` and
``summarize``); ``Watch(watchers)`` is a Lightning ``Callback`` that tells somatize
watchers (``TensorBoard``, ``Progress``, ``JsonLines``...) what Lightning is doing.

Needs the ``lightning`` extra (``pip install 'somatize[lightning]'``); importing
``somatize`` or ``somatize.torch`` never imports lightning.

Example::

    import lightning as L
    from somatize.torch.lightning import LightningGraph, result

    lg = LightningGraph(g, loss=nn.functional.cross_entropy,
                        optimizer=lambda ps: torch.optim.Adam(ps, 1e-3))
    trainer = L.Trainer(max_epochs=10, callbacks=[ModelCheckpoint(monitor="val_loss")])
    trainer.fit(lg, train_loader, val_loader)
    r = result(trainer, lg)                    # a TrainResult: feeds fedavg / summarize
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ..errors import SettingError, add_note, require
from ..graph import Graph
from .batches import checked_split, is_text, num_examples, split
from .carry import carries, reset
from .epoch_loss import weighed
from .first_step import batch_note, loss_note
from .lightning_history import Evaluation
from .lightning_settings import check, configured, hyperparameters
from .lightning_steps import StepLog
from .loss_terms import loss_terms
from .metrics import members
from .module import GraphModule, module
from .term_names import fixed as fixed_terms

try:
    import lightning as L
except ImportError:
    require("lightning", "lightning")  # raises MissingExtraError naming the extra
    raise

from . import (
    lightning_cache,
    lightning_carry,
    lightning_evaluate,
    lightning_frozen,
    lightning_state,
    tally,
)

__all__ = ["LightningGraph", "Watch", "result"]

Loss = Callable[..., Any]  # a scalar tensor, or a dict {"loss": scalar, "<term>": value...}


class LightningGraph(L.LightningModule):
    """A ``LightningModule`` over a graph: train it with ``lightning.Trainer``.

    The graph's module (``module(g)``) is registered as the submodule ``net``, so
    Lightning's checkpoints hold its weights (under ``net.<node>...``), ``.to()`` and
    precision plugins reach it, frozen nodes stay frozen (no gradients, eval mode even
    after ``.train()``) and cached nodes keep caching.

    Batches are ``(x, y)`` or a dict with ``"x"`` (and ``"y"``), as for the somatize
    Trainer, or any other form ``split=`` turns into ``(inputs, target)``. Logged with ``self.log`` (so ``ModelCheckpoint(monitor=...)``,
    ``EarlyStopping(monitor=...)`` and every logger see them):

    * ``train_loss`` every step (and ``train_<term>`` for each term of a loss function's
      dict, ``{"loss": ..., "recon": ...}``); ``train_loss_epoch`` (and
      ``train_<term>_epoch``) at each epoch's end, its mean over its examples (every
      rank's), as ``self.log(..., on_epoch=True)`` makes it; ``<node>/<name>`` for each
      metric a node returns in ``Done(..., metrics=...)`` during training;
    * ``val_loss``, ``val_<term>``, ``val_<metric>`` and ``val_<node>/<name>`` per
      validation epoch (averaged over examples); the same with ``test_`` under
      ``trainer.test``. With several loaders each is its own set, named as Lightning
      names it (``val_loss/dataloader_idx_1``), in ``history`` too;
    * ``cache/<node>/hit_rate`` per training epoch for each node the graph remembers,
      over every rank's lookups (``result(trainer, lg).cache`` has the run's counts,
      every rank's summed; a cold epoch warns, as under the somatize Trainer).

    Args:
        g: the graph.
        loss: ``loss(output, target) -> scalar``, or a dict ``{"loss": scalar, "recon":
            r, ...}`` whose other entries (0-d tensors or numbers) are logged, not trained
            on; None when the graph's output is the loss (it is then given the whole
            batch, and its output is logged as the loss — ``val_loss``, ``test_loss`` —
            as under ``st.Trainer``).
        optimizer: a factory ``params -> torch.optim.Optimizer`` (given ``parameters(g)``:
            trainable, deduplicated, frozen nodes excluded). Needed only to train: a
            ``LightningGraph`` without one predicts, validates and tests, and ``fit``
            raises a ``SettingError`` naming ``optimizer=``.
        scheduler: a factory ``optimizer -> LR scheduler``, stepped once per epoch as
            Lightning steps a plain scheduler (a ``ReduceLROnPlateau`` with
            ``monitor="val_loss"``); or returning Lightning's ``lr_scheduler`` dict
            (``{"scheduler": s, "interval": "step", ...}``) to choose. Called in
            ``configure_optimizers``, so it may read ``trainer.estimated_stepping_batches``.
        metrics: name → ``fn(output, target)`` evaluated on validation and test data. A
            torchmetrics ``MetricCollection`` gives each member, as in ``st.Trainer``.
        split: how a batch becomes ``(inputs, target)``, for batches of another form than
            ``(x, y)`` or ``{"x": ..., "y": ...}``: ``split=lambda b: (b["input_ids"],
            b["labels"])``, as ``st.Trainer(split=)``. Used in training, validation, test
            and predict; needs ``loss=``.

    Attributes:
        graph: the graph; ``net``: ``module(g)``.
        losses: the training loss of every step (checkpointed: a resumed run keeps it).
        epoch_losses: the mean training loss of every finished epoch, over its examples (every
            rank's under DDP), as ``st.Trainer``'s ``result.epoch_losses`` and the number
            ``train_loss_epoch`` logs; an epoch resumed in its middle: over the steps since.
        terms, epoch_terms: a loss function's terms at every step, and their epochs' means,
            as ``st.Trainer``'s ``result.terms`` and ``result.epoch_terms`` (``lightning_steps``).
        history: one dict per validation ``fit`` made (the run's), ``{"step", "epoch",
            "val_loss", "val_<metric>"..., "val_<node>/<name>"...}`` (as ``st.Trainer``'s
            ``result.metrics``).
        validated: one such dict per ``trainer.validate(lg, ...)``: evaluations outside
            the run, kept apart from ``history`` (and from ``result()``'s metrics, ``best``
            and ``val_examples``).
        seconds: wall-clock time of the last ``fit``.

    Example:
        >>> lg = LightningGraph(g, loss=nn.functional.cross_entropy,
        ...                     optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        ...                     metrics={"acc": st.accuracy})  # doctest: +SKIP
        >>> L.Trainer(max_epochs=3).fit(lg, train_loader, val_loader)  # doctest: +SKIP
    """

    def __init__(
        self,
        g: Graph,
        *,
        loss: Loss | None,
        optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None,
        scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
        metrics: Mapping[str, Callable[[Any, Any], Any]] | Any | None = None,
        split: Callable[[Any], tuple[Any, Any]] | None = None,
    ) -> None:
        super().__init__()
        metrics = members(metrics)  # a MetricCollection's members, each a metric (metrics.py)
        check(g, loss, optimizer, scheduler, metrics)
        self.split = checked_split(split, loss, "LightningGraph")
        self.graph = g
        self.net: GraphModule = module(g)
        self._loss, self._optimizer, self._scheduler = loss, optimizer, scheduler
        self._metrics = dict(metrics or {})
        self.history: list[dict[str, float]] = []
        self.seconds = 0.0
        self._log = StepLog()  # the steps' losses and terms, the epochs' means
        # the last training batch's (loss, examples, terms)
        self._last_batch: tuple[torch.Tensor, int, dict[str, Any]] | None = None
        self._epoch_batches: list[tuple[torch.Tensor, int, dict[str, Any]]] = []  # the epoch's
        self._term_names: tuple[str, ...] | None = None  # fixed by a fit's first step
        self._examples: dict[int, int] = {}  # epoch → training examples seen in it
        self._val_examples: dict[str, int] = {}  # the last validation's, over every rank
        self.validated: list[dict[str, float]] = []  # trainer.validate()'s, not the run's
        self._evaluations: dict[str, Evaluation] = {}  # prefix → its sets' sums (…history.py)
        self._split_ok: set[str] = set()  # stages a batch went through: its form is not at fault
        self._carried: list[tuple[Any, Any]] = []  # training's st.Carry values, during a validation
        self._started = 0.0
        self._tally: tally.CacheTally | None = None  # on the graph during fit (tally.py)
        self._restored = False  # a checkpoint was restored into the fit starting now
        self._epoch_counts: tuple[int, dict[str, dict[str, int]]] = (-1, {})
        self._cache_since: Any = None  # a checkpoint's counts, for the fit resuming it
        self._cache_run: Any = None  # the fit's counts over every rank, once it ends
        self._frozen_seen: frozenset[str] = frozenset()  # frozen at the last check (…_frozen)
        self._frozen_written: Any = None  # a resumed checkpoint's frozen nodes (lightning_state)
        self.save_hyperparameters(hyperparameters(g, loss, optimizer, scheduler, self._metrics))
        self._factory_lr = self.hparams.get("lr")  # (what hparams["lr"] set later changes)

    # -- the steps ------------------------------------------------------------------------

    def forward(self, x: Any) -> Any:
        return self.net(x)

    def _loss_terms(self, output: Any, target: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        return loss_terms(self._loss, output, target)

    def _split(self, batch: Any) -> tuple[Any, Any]:
        # as st.Trainer: without a loss function the graph computes the loss from the batch
        if self._loss is None:
            return batch, None
        return self.split(batch) if self.split is not None else split(batch)

    def _explain(self, e: BaseException, batch: Any, stage: str) -> None:
        """The Trainer's notes: on a failure in the loss function, how it was called
        (first_step.loss_note); on a batch it does not split (first_step.batch_note), on a
        failure before any batch of ``stage`` went through (after one, its form is fine)."""
        said = loss_note(e, self._loss, "LightningGraph")
        if said is not None:
            add_note(e, said)
        if self.split is None and stage not in self._split_ok:
            note = batch_note(batch, self._loss is not None, "LightningGraph")
            if note:
                add_note(e, note)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        try:
            x, y = self._split(batch)
            n = num_examples(x)
            self.net.step = self.global_step + 1  # the number of the step it computes
            loss, terms = self._loss_terms(self.net(x), y)
        except (TypeError, ValueError) as e:
            self._explain(e, batch, "train")
            raise
        self._split_ok.add("train")
        step, world = self.global_step + 1, self.trainer.world_size  # (term_names.py)
        self._term_names = fixed_terms(self._term_names, terms, self.global_rank, world, step)
        self.log(
            "train_loss", loss.detach(), on_step=True, on_epoch=False, prog_bar=True, batch_size=n
        )
        for name, value in terms.items():  # a loss function's dict: each term beside the loss
            self.log(f"train_{name}", value, on_step=True, on_epoch=False, batch_size=n)
        lightning_evaluate.log_nodes(self, on_step=True, on_epoch=False, batch_size=n)
        self._log.group.append((loss.detach(), n, terms))  # (a step's: on_before_optimizer_step)
        self._last_batch = (loss.detach(), n, terms)  # (Watch's: outputs hold loss / k)
        self._epoch_batches.append(self._last_batch)  # (train_loss_epoch, at the epoch's end)
        epoch = self.current_epoch
        self._examples[epoch] = self._examples.get(epoch, 0) + n
        return loss

    # dataloader_idx: only with several loaders (val_loss/dataloader_idx_1); None: one
    def validation_step(
        self, batch: Any, batch_idx: int, dataloader_idx: int | None = None
    ) -> None:
        lightning_carry.start_set(self, batch_idx)
        lightning_evaluate.step(self, batch, "val_", dataloader_idx)

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int | None = None) -> None:
        lightning_carry.start_set(self, batch_idx)
        lightning_evaluate.step(self, batch, "test_", dataloader_idx)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        lightning_carry.start_set(self, batch_idx)
        try:
            one = self.split is None and type(batch) in (list, tuple) and len(batch) == 1
            if one and not is_text(batch):  # TensorDataset(x)'s [x] (one string: raw text)
                return self.net(batch[0])
            return self.net((self.split or split)(batch)[0])
        except (TypeError, ValueError) as e:
            self._explain(e, batch, "predict")
            raise

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        self._log.step()  # the step's loss and terms, as st.Trainer records them

    def configure_optimizers(self) -> Any:
        if self._optimizer is None:  # (Lightning configures only to fit)
            raise SettingError(
                "LightningGraph was made without optimizer=, so it predicts, validates and "
                "tests but cannot be fitted: pass an optimizer factory to train it, e.g. "
                "LightningGraph(g, loss=..., optimizer=lambda ps: torch.optim.AdamW(ps, "
                "lr=1e-3)) or LightningGraph.load_from_checkpoint(path, g=g, loss=..., "
                "optimizer=...)"
            )
        wanted = self.hparams.get("lr")  # set since by Lightning's lr_find (update_attr)
        changed = wanted is not None and wanted != self._factory_lr
        config, names = configured(
            self.graph,
            self._optimizer,
            self._scheduler,
            wanted if changed else None,
            epochs=getattr(self._trainer, "max_epochs", None),  # (None: no trainer)
        )
        self._frozen_seen = frozenset(self.graph.memory.frozen)
        # named from the objects the run uses: in every checkpoint (hparams) and, as Lightning
        # logs them after configuring, in every logger (which logs hparams_initial)
        self.hparams.update(names)
        initial: Any = getattr(self, "_hparams_initial", None)  # (save_hyperparameters' own)
        if initial is not None:
            initial.update(names)
        return config

    # -- bookkeeping ----------------------------------------------------------------------

    @property
    def losses(self) -> list[float]:
        self._log.read()  # (the steps' losses, read back from the device)
        return self._log.losses

    @property
    def terms(self) -> dict[str, list[float]]:
        self._log.read()
        return self._log.terms

    @property
    def epoch_losses(self) -> list[float]:
        return self._log.epoch_losses

    @property
    def epoch_terms(self) -> dict[str, list[float]]:
        return self._log.epoch_terms

    @property
    def num_examples(self) -> int:
        """Training examples in one epoch (the most seen in any epoch; a run shorter
        than one epoch counts what it saw)."""
        return max(self._examples.values(), default=0)

    def on_fit_start(self) -> None:
        lightning_state.check_resumed(self)  # (after the callbacks': one may unfreeze again)
        lightning_frozen.check_backbone(self)
        self._started, self._term_names = time.perf_counter(), None
        restored, self._restored = self._restored, False
        since, self._cache_since = self._cache_since, None  # (a resumed run's counts)
        if not restored:
            if self.trainer.global_step == 0:  # a run of its own: the last fit's is not its
                self._log.clear()
                self.history, self._examples, self._val_examples = [], {}, {}
                since = None
            elif self._tally is not None:  # the same Trainer going on (max_epochs raised)
                since = tally.state(self._tally)
        tally.detach(self.net, self._tally)  # (one a failed fit left behind)
        self._tally, self._epoch_counts = tally.attach(self.net, since), (-1, {})
        self._cache_run = None

    def on_fit_end(self) -> None:
        self.seconds = time.perf_counter() - self._started
        _ = self.losses  # flush
        tally.detach(self.net, self._tally)  # (kept here: result() reads its totals)

    def epoch_cache(self) -> dict[str, dict[str, int]]:
        """What each remembered node found in the training epoch ending now (``EpochEnd.cache``):
        taken once per epoch, whichever asks first (this module's hook, or ``Watch``'s)."""
        return lightning_cache.epoch_counts(self)

    def on_train_epoch_end(self) -> None:
        self._log.end_epoch(self)  # the epoch's means (collective: every rank)
        batches, self._epoch_batches = self._epoch_batches, []
        if batches:  # the epoch's mean, as self.log(..., on_epoch=True) makes it: synced once
            # (logged here, not by on_epoch=True on train_loss: that one would be train_loss_step)
            loss, terms, n = weighed(batches)
            log = functools.partial(self.log, on_epoch=True, sync_dist=True, batch_size=n)
            log("train_loss_epoch", loss, prog_bar=True)
            for name, value in terms.items():
                log(f"train_{name}_epoch", value)
        lightning_cache.log_hit_rates(self, self.epoch_cache())  # (every rank counts its share)

    def on_train_end(self) -> None:
        if self._tally is not None:  # the run's counts, every rank's summed: result().cache
            totals = tally.totals(self._tally)
            self._cache_run = tally.over_ranks(totals, self.trainer.world_size)

    def on_train_start(self) -> None:
        lightning_carry.check(self)  # st.Carry with a shuffled DataLoader or DDP: warn

    def on_train_epoch_start(self) -> None:
        lightning_frozen.check_added(self)  # (after the callbacks': BaseFinetuning unfreezes)
        reset(carries(self.net))  # carried state (st.Carry) starts afresh each epoch
        self._epoch_batches, self._log.epoch = [], []

    def on_validation_epoch_start(self) -> None:
        lightning_evaluate.start(self, "val_")

    def on_validation_epoch_end(self) -> None:
        lightning_evaluate.end(self, "val_")

    def on_test_epoch_start(self) -> None:
        lightning_evaluate.start(self, "test_")

    def on_test_epoch_end(self) -> None:
        lightning_evaluate.end(self, "test_")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["somatize"] = lightning_state.saved(self, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        lightning_state.restore(self, checkpoint)

    @classmethod
    def load_from_checkpoint(  # type: ignore[override]
        cls, checkpoint_path: Any, map_location: Any = None, *, weights_only: bool = True, **kw: Any
    ) -> Any:
        """Lightning's, with ``weights_only=True`` unless told otherwise: a checkpoint's
        pickles run no code, whatever ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` says.

        ``optimizer=`` is needed only to go on training: without it the loaded module
        predicts, validates and tests (``fit`` then names ``optimizer=``).

        Raises:
            SettingError: ``g=`` or ``loss=`` not given (the checkpoint holds weights,
                not code), naming the graph's nodes and the call to write.
        """
        lightning_state.check_loading(checkpoint_path, kw)
        load = super().load_from_checkpoint
        return load(checkpoint_path, map_location, weights_only=weights_only, **kw)


from .lightning_result import result  # noqa: E402 -- beside, re-exported
from .lightning_watch import Watch  # noqa: E402 -- the callback lives beside, re-exported
