"""``st.accuracy``: an evaluation's accuracy is the set's hits over its rows, exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torchmetrics.functional.classification import multiclass_accuracy

import somatize.torch as st


def batches(hit: torch.Tensor, size: int = 64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One-hot "logits" that hit the target where ``hit`` says, in batches of ``size``."""
    y = torch.arange(len(hit)) % 10
    predicted = torch.where(hit, y, (y + 1) % 10)
    return list(zip(F.one_hot(predicted, 10).float().split(size), y.split(size), strict=True))


def accuracy_of(data: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    trainer = st.Trainer(loss=F.cross_entropy, metrics={"acc": st.accuracy})
    return trainer.evaluate(nn.Identity(), data)["acc"]


@pytest.mark.parametrize(("rows", "size"), [(300, 64), (301, 17), (999, 50), (257, 32)])
def test_the_evaluated_accuracy_is_the_hits_over_the_rows_as_torchmetrics_computes_it(rows, size):
    gen = torch.Generator().manual_seed(rows)
    hit = torch.rand(rows, generator=gen) < 0.8
    data = batches(hit, size)
    got = accuracy_of(data)
    # in float32 a batch of 44 rows' fraction is rounded: 0.9750000026 for 292 hits of 300
    assert got == int(hit.sum()) / rows  # exactly, as Python divides
    out, y = torch.cat([b[0] for b in data]), torch.cat([b[1] for b in data])
    whole = multiclass_accuracy(out, y, num_classes=10, average="micro")
    assert got == pytest.approx(float(whole), abs=1e-7)  # torchmetrics computes in float32


def test_two_evaluations_with_as_many_hits_tie_however_the_batches_hold_them():
    # 300 rows in batches of 64 and a last one of 44: the same 290 hits, spread two ways
    early, late = torch.ones(300, dtype=torch.bool), torch.ones(300, dtype=torch.bool)
    early[:10] = False  # the misses in the first batch
    late[-10:] = False  # the misses in the short last batch
    a, b = accuracy_of(batches(early)), accuracy_of(batches(late))
    assert a == b == 290 / 300  # a tie: neither ranks ahead for Checkpointing(best=)/Patience


def test_a_batch_s_accuracy_is_float64_on_the_cpu():
    got = st.accuracy(torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]]), torch.tensor([1, 1, 1]))
    assert got.dtype == torch.float64 and got.item() == 2 / 3
