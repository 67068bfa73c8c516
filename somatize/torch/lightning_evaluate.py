"""What a ``LightningGraph`` logs of its metrics: a training step's node metrics, as they
come (``log_nodes``); and its validations and tests — each batch's loss (and the terms of
a loss function's dict, ``loss_terms.py``), metrics and node metrics summed (``lightning_history.Evaluation``), and each validation's record, which
``lg.history`` (or ``lg.validated``, for a ``trainer.validate``) keeps.

Nothing is logged per batch: the loss, the ``metrics=`` functions and the metrics nodes
report are summed, and logged once, at the evaluation's end, from its record — their
names agreed over the ranks and their sums reduced (``Evaluation.record``), so every rank
logs the same names with the same values, the history's. Under DDP a node may report a
metric on some ranks' batches only (``Done(x, metrics={"outliers": n} if n else {})``):
logged per batch with ``sync_dist=True``, each rank would wait at the epoch's end in
another all-reduce, for ever. A node metric is averaged over all the examples, as under
``st.Trainer`` (a batch that did not report it counts as 0). And the ranks may evaluate
different numbers of examples (``UnrepeatedDistributedSampler``): Lightning's own reduction
of a per-batch mean divides by the ranks' mean batch size made an integer under gloo.

Used by ``somatize.torch.lightning``; needs the ``lightning`` extra there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning.pytorch.trainer.states import TrainerFn

from ..errors import SettingError
from . import lightning_carry, lightning_history
from .batches import num_examples
from .lightning_history import Evaluation, Sums, scalar, suffix
from .loss_terms import check_clash
from .metrics import _check_clash
from .term_names import changed_in_evaluation

if TYPE_CHECKING:
    from .lightning import LightningGraph

__all__ = ["end", "start", "step"]


def start(lg: LightningGraph, prefix: str) -> None:
    """``on_validation_epoch_start`` (``prefix`` ``"val_"``), ``on_test_epoch_start``
    (``"test_"``): fresh sums; a validation counts no cache lookups and keeps training's
    carried state to give back after."""
    if prefix == "val_":
        if lg._tally is not None:  # evaluations are not counted
            lg._tally.pause(True)
        lg._carried = lightning_carry.keep(lg)  # given back after; each loader afresh
    lg._evaluations[prefix] = Evaluation(lg._metrics, lg.device)


def log_nodes(lg: LightningGraph, **how: Any) -> None:
    """Log the metrics the nodes reported in the training batch just run (``lg.net.metrics``)."""
    for node, values in lg.net.metrics.items():
        for name, value in values.items():
            lg.log(f"{node}/{name}", scalar(value, f"node {node!r} metric {name!r}"), **how)


def _sum_nodes(lg: LightningGraph, sums: Sums, n: int) -> None:
    """Add the metrics the nodes reported in the evaluated batch just run to ``sums``."""
    names = lightning_history.node_keys(lg.net.metrics)  # (as st.Trainer: a metric named
    _check_clash(lg._metrics, names, "LightningGraph")  # as a node's metric is refused)
    for node, values in lg.net.metrics.items():
        for name, value in values.items():
            v = scalar(value, f"node {node!r} metric {name!r}")
            sums.add(f"{node}/{name}", v, n, node=True)


def step(lg: LightningGraph, batch: Any, prefix: str, idx: int | None) -> None:
    """A validation or test batch of loader ``idx`` (None: the only one)."""
    evaluation = lg._evaluations[prefix]
    sums, objects = evaluation.of(idx)  # loader idx's own (idx: several)
    try:
        x, y = lg._split(batch)
        n = num_examples(x)
        out = lg.net(x)
        loss, terms = lg._loss_terms(out, y)  # (the output, without loss=)
        if terms:  # a loss function's dict: its terms after the loss, as st.Trainer's
            check_clash(terms, lg._metrics, "LightningGraph")
        values: dict[str, Any] = {"loss": loss, **terms}
        values.update({k: fn(out, y) for k, fn in lg._metrics.items() if k not in objects})
    except (TypeError, ValueError) as e:
        lg._explain(e, batch, prefix)
        raise
    names = evaluation.terms.setdefault(idx, list(terms))  # (the loader's first batch's)
    if len(terms) != len(names) or any(k not in terms for k in names):
        raise SettingError(changed_in_evaluation(names, terms))  # as st.Trainer's evaluate
    lg._split_ok.add(prefix)
    m: Any
    for m in objects.values():
        m.update(out, y)
    for name, value in values.items():
        sums.add(name, scalar(value, f"metric {name!r}", lightning_history.metric_fix(name)), n)
    sums.examples += n
    _sum_nodes(lg, sums, n)


def _sets(lg: LightningGraph, prefix: str) -> list[int | None]:
    """The loaders the evaluation read, in order: ``[None]`` for one (its names bare)."""
    trainer = lg.trainer
    n = len(trainer.num_val_batches if prefix == "val_" else trainer.num_test_batches)
    return list(range(n)) if n > 1 else [None]


def end(lg: LightningGraph, prefix: str) -> None:
    """``on_validation_epoch_end``, ``on_test_epoch_end``: the metric objects computed and
    logged; the rest of the evaluation's record logged; a validation's record kept. (The
    sanity check's is neither: Lightning drops what it logs.)"""
    if prefix == "val_":
        if lg._tally is not None:
            lg._tally.pause(False)
        lightning_carry.give_back(lg._carried)
        lg._carried = []
    evaluation, sets = lg._evaluations.pop(prefix), _sets(lg, prefix)
    computed = lightning_history.log_objects(lg, prefix, evaluation, sets)
    if lg.trainer.sanity_checking:
        return
    reduce = lg.trainer.strategy.reduce if lg.trainer.world_size > 1 else None
    values, examples = evaluation.record(prefix, sets, lg.device, reduce, computed)
    objects = {f"{prefix}{k}{suffix(idx)}" for idx, done in computed.items() for k in done}
    for name, value in values.items():  # the same names, in one order, on every rank
        if name in objects:
            continue  # (logged by log_objects)
        # the same value on every rank: synced by "max", it stays as it is (and Lightning
        # does not advise sync_dist=True for an epoch-level value, as it does without it)
        bar = name == f"{prefix}loss" or name.startswith(f"{prefix}loss/")
        lg.log(
            name,
            value,
            prog_bar=bar,
            on_epoch=True,
            sync_dist=True,
            reduce_fx="max",
            add_dataloader_idx=False,
        )
    if prefix != "val_" or not values:
        return
    record: dict[str, float] = {"step": lg.global_step, "epoch": lg.current_epoch}
    record.update(values)
    if lg.trainer.state.fn != TrainerFn.FITTING:  # trainer.validate(): not the run's
        lg.validated.append(record)
        return
    lg._val_examples = examples  # (TrainResult.val_examples)
    lg.history.append(record)
