"""A ``LightningGraph``'s validations and tests: each batch's loss, metrics and node metrics
logged and summed (``lightning_history.Evaluation``), and each validation's record, which
``lg.history`` (or ``lg.validated``, for a ``trainer.validate``) keeps.

Used by ``somatize.torch.lightning``; needs the ``lightning`` extra there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning.pytorch.trainer.states import TrainerFn

from . import lightning_carry, lightning_history
from .batches import num_examples
from .lightning_history import Evaluation, Sums, scalar
from .metrics import _check_clash

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


def log_nodes(lg: LightningGraph, prefix: str, sums: Sums | None = None, **how: Any) -> None:
    """Log the metrics the nodes reported in the batch just run (``lg.net.metrics``)."""
    if sums is not None:  # (as st.Trainer: a metric named as a node's metric is refused)
        names = lightning_history.node_keys(lg.net.metrics)
        _check_clash(lg._metrics, names, "LightningGraph")
    for node, values in lg.net.metrics.items():
        for name, value in values.items():
            v = scalar(value, f"node {node!r} metric {name!r}")
            lg.log(f"{prefix}{node}/{name}", v, **how)
            if sums is not None:  # evaluated: in the history too, as under st.Trainer
                sums.add(f"{node}/{name}", v, how["batch_size"], node=True)


def step(lg: LightningGraph, batch: Any, prefix: str, idx: int | None) -> None:
    """A validation or test batch of loader ``idx`` (None: the only one)."""
    sums, objects = lg._evaluations[prefix].of(idx)  # loader idx's own (idx: several)
    try:
        x, y = lg._split(batch)
        n = num_examples(x)
        out = lg.net(x)
        values: dict[str, Any] = {"loss": lg._loss_of(out, y)}  # the output, without loss
        values.update({k: fn(out, y) for k, fn in lg._metrics.items() if k not in objects})
    except (TypeError, ValueError) as e:
        lg._explain(e, batch, prefix)
        raise
    lg._split_ok.add(prefix)
    m: Any
    for m in objects.values():
        m.update(out, y)
    how: dict[str, Any] = {
        "on_step": False,
        "on_epoch": True,
        "batch_size": n,
        "sync_dist": True,
    }
    for name, value in values.items():
        v = scalar(value, f"metric {name!r}", lightning_history.metric_fix(name))
        lg.log(f"{prefix}{name}", v, prog_bar=name == "loss", **how)
        sums.add(name, v, n)
    sums.examples += n
    log_nodes(lg, prefix, sums, **how)


def _sets(lg: LightningGraph, prefix: str) -> list[int | None]:
    """The loaders the evaluation read, in order: ``[None]`` for one (its names bare)."""
    trainer = lg.trainer
    n = len(trainer.num_val_batches if prefix == "val_" else trainer.num_test_batches)
    return list(range(n)) if n > 1 else [None]


def end(lg: LightningGraph, prefix: str) -> None:
    """``on_validation_epoch_end``, ``on_test_epoch_end``: the metric objects computed and
    logged; a validation's record (not the sanity check's) kept."""
    if prefix == "val_":
        if lg._tally is not None:
            lg._tally.pause(False)
        lightning_carry.give_back(lg._carried)
        lg._carried = []
    evaluation, sets = lg._evaluations.pop(prefix), _sets(lg, prefix)
    computed = lightning_history.log_objects(lg, prefix, evaluation, sets)
    if prefix != "val_" or lg.trainer.sanity_checking:
        return
    reduce = lg.trainer.strategy.reduce if lg.trainer.world_size > 1 else None
    values, examples = evaluation.record(prefix, sets, lg.device, reduce, computed)
    if not values:
        return
    record: dict[str, float] = {"step": lg.global_step, "epoch": lg.current_epoch}
    record.update(values)
    if lg.trainer.state.fn != TrainerFn.FITTING:  # trainer.validate(): not the run's
        lg.validated.append(record)
        return
    lg._val_examples = examples  # (TrainResult.val_examples)
    lg.history.append(record)
