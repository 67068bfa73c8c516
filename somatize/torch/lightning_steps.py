"""A ``LightningGraph``'s training history, as ``st.Trainer`` keeps it: each step's loss
and terms (``lg.losses``, ``lg.terms``), each finished epoch's means (``lg.epoch_losses``,
``lg.epoch_terms``) — what ``result(trainer, lg)`` returns.

A step's loss is the mean over its batches' examples (under ``accumulate_grad_batches``,
each batch weighed by its share of the step's examples, summed in float32 as the somatize
Trainer sums micro-batches), and so are a loss function's terms (``loss_terms.py``). The
steps are read back from the device when the history is read (one transfer). They are the
rank's own under DDP, as a checkpoint keeps them.

An epoch's mean is the somatize Trainer's (``epoch_loss.py``): ``sum(loss * examples) /
sum(examples)`` over the epoch's optimizer steps, summed in float64, a step after the
other; under DDP over every rank's steps (one all-reduce of the sums at the epoch's end,
so every rank holds the same list). It is the mean ``train_loss_epoch`` (and
``train_<term>_epoch``) logs, which Lightning computes on the device in float32 from the
batches (the two agree to float32's precision).

Lightning keeps no running sums in its checkpoints: in an epoch a fit resumed in the middle
of, ``train_loss_epoch`` is over the steps since the resume, and so is that epoch's entry
here (the somatize Trainer checkpoints its sums and reports the uninterrupted run's). An
epoch that took no step is NaN (``epoch_loss.recorded``), so that entry ``e`` is epoch ``e``'s.

Used by ``somatize.torch.lightning``; needs the ``lightning`` extra there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from .epoch_loss import recorded
from .loss_terms import Terms, add_weighed, record_terms, restored_terms

if TYPE_CHECKING:
    from .lightning import LightningGraph

__all__ = ["StepLog"]

Step = tuple[torch.Tensor, int, Terms]  # (the mean loss, its examples, its terms' means)


class StepLog:
    """The history of a ``LightningGraph``'s training (the module docstring)."""

    def __init__(self) -> None:
        self.group: list[Step] = []  # this step's batches
        self.epoch: list[Step] = []  # the epoch's steps
        self.pending: list[Step] = []  # steps not read back yet
        self.losses: list[float] = []
        self.terms: dict[str, list[float]] = {}
        self.epoch_losses: list[float] = []
        self.epoch_terms: dict[str, list[float]] = {}

    def step(self) -> None:
        """The batches since the last step make an optimizer step: its loss and terms, each
        the mean over its batches' examples, as the somatize Trainer records them."""
        group, self.group = self.group, []
        if len(group) == 1:
            step = group[0]
        elif group:  # (summed as st.Trainer sums them: the same floats, the same order)
            n = sum(size for _, size, _ in group)
            total = torch.zeros((), device=group[0][0].device)
            terms: Terms = {}
            for loss, size, part in group:
                total += loss.float() * (size / n)
                if part:
                    add_weighed(terms, part, size / n)
            step = (total, n, terms)
        else:
            return
        self.pending.append(step)
        self.epoch.append(step)

    def read(self) -> None:
        """The pending steps read back into ``losses`` and ``terms`` (one transfer)."""
        if not self.pending:
            return
        steps, self.pending = self.pending, []
        values = torch.stack([loss.float() for loss, _, _ in steps]).cpu().tolist()
        for value, (_, _, terms) in zip(values, steps, strict=True):
            self.losses.append(value)
            if terms or self.terms:
                record_terms(self.terms, terms, len(self.losses))

    def end_epoch(self, lg: LightningGraph) -> None:
        """The epoch's means of its steps, into ``epoch_losses`` and ``epoch_terms``; under DDP
        every rank's (collective: called on every rank at the epoch's end)."""
        steps, self.epoch = self.epoch, []
        names = sorted(lg._term_names or ())  # (the fit's, on every rank: term_names.fixed)
        total, examples, sums = 0.0, 0, dict.fromkeys(names, 0.0)
        if steps:
            values = torch.stack(
                [torch.stack([loss.float(), *(torch.as_tensor(t[k]).float().to(loss.device)
                                               for k in names)]) for loss, _, t in steps]
            ).cpu().tolist()  # fmt: skip
            for row, (_, n, _) in zip(values, steps, strict=True):
                total += row[0] * n  # (as EpochLoss.add: the same floats, the same order)
                for k, v in zip(names, row[1:], strict=True):
                    sums[k] += v * n
                examples += n
        if lg.trainer.world_size > 1:
            local = torch.tensor(
                [total, examples, *sums.values()], dtype=torch.float64, device=lg.device
            )
            total, summed, *term_sums = lg.trainer.strategy.reduce(local, reduce_op="sum").tolist()
            examples, sums = round(summed), dict(zip(names, term_sums, strict=True))
        self.epoch_losses.append(recorded(total / examples if examples else None))
        if names or self.epoch_terms:
            means = {k: v / examples for k, v in sums.items()} if examples else {}
            record_terms(self.epoch_terms, means, len(self.epoch_losses))

    def clear(self) -> None:
        """A run of its own begins: nothing of the last."""
        self.__init__()  # type: ignore[misc]

    def state(self) -> dict[str, Any]:
        """This rank's steps (read back) as a checkpoint keeps them: plain lists and dicts."""
        self.read()
        return {"losses": list(self.losses), "terms": {k: list(v) for k, v in self.terms.items()}}

    def restore(self, mine: Mapping[str, Any], every: Mapping[str, Any]) -> None:
        """A checkpoint's history: this rank's steps (``mine``), the epochs (``every``)."""
        self.group, self.epoch, self.pending = [], [], []
        self.losses = list(mine["losses"])
        self.terms = restored_terms(mine.get("terms"), len(self.losses))  # (None: an old one)
        self.epoch_losses = [float(v) for v in every.get("epoch_losses") or []]
        self.epoch_terms = restored_terms(every.get("epoch_terms"), len(self.epoch_losses))
