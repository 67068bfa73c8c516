"""A Trainer's work outside a run: ``evaluate`` and ``predict`` (no optimizer needed).

Both run what the caller passed: a module compiled (``torch.compile(m)``, ``m.compile()``)
runs compiled, its own forward in eval mode and without grad (a compile of its own, once).
Both run where ``fit`` would: ``Options(device=...)`` (the model is moved there, as ``fit``
moves it), else this rank's GPU under torchrun with CUDA, else where the parameters are;
batches are moved to it. Outputs of ``predict`` stay on that device.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..graph import Graph
from ..stack import outside
from . import ddp
from .batches import is_text, num_examples, split, to_device
from .carry import carries, check_last_batch, named_carries, reset
from .data_checks import check_data
from .first_step import evaluate_note, keywords_note
from .limits import limited
from .loss_terms import KeptTerms, gives_terms
from .metrics import evaluate as evaluate_batches
from .rank_lengths import agree
from .smoke import smoke_batches
from .start import as_module, autocast_for, compiled, place
from .valsets import refuse_sets, warn_dropped

if TYPE_CHECKING:
    from .trainer import Trainer

__all__ = ["evaluate", "evaluated", "predict"]


def evaluate(trainer: Trainer, model: Graph | nn.Module, data: Iterable[Any]) -> dict[str, float]:
    """``Trainer.evaluate``: the loss and metrics over ``data``, averaged over examples."""
    refuse_sets(data, "evaluate")
    check_data(data, "evaluate()'s data", trainer._split)
    net = as_module(model, "Trainer.evaluate")
    held = named_carries(net)
    reset(list(held.values()))
    rank, world = ddp.rank_world()
    agree(None, data, world, val_label="evaluate()'s data")  # one length on every rank
    check_last_batch(held, data, "evaluate()'s data")
    if held and world > 1:  # (fit() warns of its own, training and evaluating)
        warnings.warn(
            f"the model carries state from batch to batch (st.Carry in "
            f"{', '.join(sorted(held))}), but under DDP evaluate() deals the batches out to "
            f"the {world} ranks, so each rank's state skips the others' batches: not what one "
            "process computes. Evaluate it in one process (rank 0 alone, outside torchrun)",
            UserWarning,
            stacklevel=outside(),
        )
    device = place(net, trainer.options.device, world)  # where fit() would run it
    autocast = autocast_for(trainer.options.precision, device)
    limit = smoke_batches(trainer.options)
    if rank == 0 and not held:  # (carried state: drop_last=True is check_last_batch's fix)
        warn_dropped(data, "evaluate()'s data", limit)
    runs = _runs(model, net)
    return trainer._evaluate(runs, data, device, autocast, rank, world, limit)


def predict(trainer: Trainer, model: Graph | nn.Module, data: Iterable[Any]) -> list[Any]:
    """``Trainer.predict``: the output of each batch, in order, in eval mode, without grad."""
    refuse_sets(data, "predict")
    check_data(data, "predict()'s data", trainer._split)
    net = as_module(model, "Trainer.predict")
    device = place(net, trainer.options.device, ddp.rank_world()[1])
    autocast = autocast_for(trainer.options.precision, device)
    reset(carries(net))  # carried state starts afresh, as for an evaluation
    runs = _runs(model, net)
    was_training, out = net.training, []
    net.eval()
    batch = None
    try:
        with torch.no_grad():
            for batch in limited(iter(data), smoke_batches(trainer.options)):
                x = to_device(_inputs(trainer, batch), device)
                with autocast():
                    out.append(runs(x))
    except (TypeError, ValueError, AttributeError) as e:
        keywords_note(e, trainer, net, batch)  # (forward(input_ids, ...) given one dict)
        raise
    finally:
        net.train(was_training)
    return out


def _inputs(trainer: Trainer, batch: Any) -> Any:
    """What ``predict`` gives the model of a batch: ``split``'s inputs — and the one tensor
    of a one-item batch, as ``DataLoader(TensorDataset(x))`` yields (``[x]``); a batch of
    raw text, one string or more (``is_text``), is the input whole."""
    if (
        trainer.split is None
        and type(batch) in (list, tuple)
        and len(batch) == 1
        and not is_text(batch)
    ):
        return batch[0]
    return (trainer.split or split)(batch)[0]


def _runs(model: Any, net: nn.Module) -> nn.Module:
    """What ``evaluate`` and ``predict`` call: the module the caller compiled (an
    ``OptimizedModule`` holding ``net``, or ``net`` compiled in place), else ``net``."""
    wrapper = compiled(model)
    return wrapper if wrapper is not None else net


def evaluated(
    trainer: Trainer,
    net: nn.Module,
    data: Iterable[Any],
    device: torch.device,
    autocast: Callable[[], Any],
    rank: int,
    world: int,
    limit: int | None = None,
    counted: list[int] | None = None,
) -> dict[str, float]:
    """One evaluation of ``net`` over ``data`` with the trainer's loss and metrics (fit's,
    its sanity check's, ``evaluate``'s); ``counted[-1]`` adds up the examples it reads.
    A loss function's terms (``loss_terms.py``) are averaged as the loss, named after it:
    ``{"loss": ..., "recon": ..., "kl": ..., <metrics>...}``."""
    loss = trainer.loss
    kept = KeptTerms(loss, trainer.metrics, "Trainer") if gives_terms(loss) else None
    fns = {"loss": kept or trainer._loss, **trainer.metrics}
    split_ = trainer._split if counted is None else _counting(trainer._split, counted)
    try:
        values = evaluate_batches(
            net,
            data,
            fns,
            split=split_,
            device=device,
            autocast=autocast,
            rank=rank,
            world=world,
            limit=limit,
            aside=kept.take if kept is not None else None,
        )
    except (TypeError, ValueError) as e:
        evaluate_note(e, trainer, data)  # the batch rule, as fit() explains it (first_step.py)
        keywords_note(e, trainer, net)
        raise
    if kept is None:
        return values
    # the terms after the loss, in the order it gives them (a rank that saw no batch: sorted)
    terms = [*kept.names, *sorted(k for k in values if k not in fns and "/" not in k)]
    return {"loss": values["loss"], **{k: values[k] for k in terms}, **values}


def _counting(split_: Callable[[Any], tuple[Any, Any]], counted: list[int]) -> Callable[..., Any]:
    """``split_``, adding each batch's examples to ``counted[-1]`` as evaluation counts them."""

    def counting(batch: Any) -> tuple[Any, Any]:
        x, y = split_(batch)
        counted[-1] += num_examples(x)
        return x, y

    return counting
