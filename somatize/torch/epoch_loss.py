"""The epoch's training loss, Lightning's ``train_loss_epoch``: ``EpochEnd.loss`` and
``.terms``, ``TrainResult.epoch_losses``.

A step's loss is the mean over its examples already (its micro-batches and accumulated
batches weighed by their size; under DDP, every rank's: ``step.py``), so the epoch's is
``sum(loss * examples) / sum(examples)`` over its steps — the mean over its training
examples, a short last batch weighing what it holds; a skipped step (``nonfinite="skip"``)
is left out. The running sums are part of ``RunState`` and of every checkpoint (plain
floats and ints), so a run resumed in mid-epoch reports the uninterrupted run's mean.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["EpochLoss", "recorded", "weighed"]


class EpochLoss:
    """The running sums of the epoch in progress.

    ``total``: the sum of each step's loss times its examples, ``examples`` theirs;
    ``terms``: the same sums of a loss function's terms (``RunState.add_terms``), over
    ``term_examples``, the examples of the steps that gave them.
    """

    __slots__ = ("examples", "term_examples", "terms", "total")

    def __init__(self) -> None:
        self.total, self.examples = 0.0, 0
        self.terms: dict[str, float] = {}
        self.term_examples = 0

    def add(self, loss: float, examples: int) -> None:
        """A step's loss (the mean over its ``examples``)."""
        self.total += loss * examples
        self.examples += examples

    def add_terms(self, terms: Mapping[str, float], examples: int) -> None:
        """A step's terms, each a mean over its ``examples`` as its loss."""
        if terms:
            for k, v in terms.items():
                self.terms[k] = self.terms.get(k, 0.0) + v * examples
            self.term_examples += examples

    def take(self) -> tuple[float | None, dict[str, float]]:
        """The epoch's mean loss (None: no step was taken) and terms; the sums start afresh."""
        loss = self.total / self.examples if self.examples else None
        n = self.term_examples
        terms = {k: v / n for k, v in self.terms.items()} if n else {}
        self.total, self.examples, self.terms, self.term_examples = 0.0, 0, {}, 0
        return loss, terms

    def state(self) -> dict[str, Any]:
        """The sums as a checkpoint holds them (floats, ints, a dict: weights_only)."""
        return {
            "total": self.total,
            "examples": self.examples,
            "terms": dict(self.terms),
            "term_examples": self.term_examples,
        }

    @classmethod
    def restored(cls, state: Any) -> EpochLoss:
        """The sums ``state()`` wrote; fresh ones from a checkpoint from before they were kept."""
        out = cls()
        if not isinstance(state, Mapping):
            return out
        total, examples = state.get("total"), state.get("examples")
        if isinstance(total, float) and isinstance(examples, int) and examples >= 0:
            out.total, out.examples = total, examples
        terms, n = state.get("terms"), state.get("term_examples")
        if isinstance(terms, Mapping) and isinstance(n, int) and n >= 0:
            out.terms = {str(k): float(v) for k, v in terms.items()}
            out.term_examples = n
        return out


def weighed(
    batches: Sequence[tuple[torch.Tensor, int, Mapping[str, Any]]],
) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """The mean loss and terms of ``batches`` (each ``(loss, examples, terms)``: a batch
    mean, a 0-d tensor or a number each), weighed by their examples, left on the device
    (a ``LightningGraph``'s epoch: its ``train_loss_epoch``); and their examples."""
    device = batches[0][0].device
    sizes = torch.tensor([n for _, n, _ in batches], dtype=torch.float32, device=device)
    examples = int(sum(n for _, n, _ in batches))

    def mean(values: list[Any]) -> torch.Tensor:
        stacked = torch.stack([torch.as_tensor(v, device=device).float() for v in values])
        return (stacked * sizes).sum() / max(examples, 1)

    terms = {k: mean([t[k] for _, _, t in batches]) for k in batches[-1][2]}
    return mean([loss for loss, _, _ in batches]), terms, examples


def recorded(loss: float | None) -> float:
    """An epoch's entry in ``TrainResult.epoch_losses``: NaN for one whose every step was
    skipped (one entry per finished epoch, so that ``epoch_losses[e]`` is epoch ``e``'s)."""
    return math.nan if loss is None else loss
