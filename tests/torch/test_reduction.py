"""A sum-reduced loss under ``micro_batches=k`` would take steps k times too small (each
chunk weighs by its share of the batch, exact for a mean): refused when ``fit`` starts
for a loss that says ``reduction="sum"``, and on the first micro-batch for any loss
function whose value is the sum of its halves' (reduction.py)."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize.errors import SettingError
from somatize.torch.reduction import check_summed_value, summed
from somatize.watchers import Recorder, StepEnd


def data(n: int = 4):
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(16, 4, generator=gen), torch.randint(0, 3, (16,), generator=gen))
        for _ in range(n)
    ]


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(4, 3)


def trainer(loss, micro_batches=4, watchers=(), **options) -> st.Trainer:
    return st.Trainer(
        loss=loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.01),
        micro_batches=micro_batches,
        watchers=watchers,
        options=st.Options(progress=False, shuffle=False, **options),
    )


def plain(loss, lr=0.01) -> nn.Module:
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for x, y in data():
        loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return model


@pytest.mark.parametrize(
    "loss, said",
    [
        (nn.CrossEntropyLoss(reduction="sum"), "nn.CrossEntropyLoss(reduction='sum')"),
        (
            functools.partial(F.cross_entropy, reduction="sum"),
            "functools.partial(cross_entropy, reduction='sum')",
        ),
    ],
    ids=["module", "partial"],
)
def test_a_loss_that_says_it_sums_is_refused_under_micro_batches_when_fit_starts(loss, said):
    steps = Recorder()
    model = net()
    before = model.weight.detach().clone()
    with pytest.raises(SettingError) as caught:
        trainer(loss, watchers=[steps]).fit(model, data())
    message = str(caught.value)
    assert message.startswith(f"{said} sums over examples")
    assert "with a sum, every step would be 4 times too small" in message
    assert "reduction='mean'" in message and "micro_batches=1" in message
    assert not steps.events and torch.equal(model.weight, before)  # before anything ran


def test_a_loss_function_that_sums_is_refused_on_its_first_micro_batch():
    """The audit's case: a lambda hides its reduction; its value on a chunk is the sum of
    its halves' values, which the first micro-batch measures."""
    summing = lambda o, y: F.cross_entropy(o, y, reduction="sum")  # noqa: E731
    model = net()
    before = model.weight.detach().clone()
    with pytest.raises(SettingError) as caught:
        trainer(summing).fit(model, data())
    message = str(caught.value)
    assert message.startswith("the loss function (a lambda) sums over examples (its value on")
    assert "micro_batches=4" in message and "4 times too small" in message
    assert torch.equal(model.weight, before)  # refused before the first optimizer step


@pytest.mark.parametrize(
    "loss",
    [
        F.cross_entropy,
        nn.CrossEntropyLoss(),
        lambda o, y: F.cross_entropy(o, y) + 1e-3 * o.pow(2).sum() / len(o),  # mean + penalty
        lambda o, y: torch.cdist(o, o).mean() + F.cross_entropy(o, y),  # over pairs of rows
    ],
    ids=["mean", "mean-module", "mean-penalty", "pairs"],
)
def test_a_mean_or_another_kind_of_loss_trains_under_micro_batches(loss):
    result = trainer(loss).fit(net(), data())
    assert result.steps == 4


def test_a_mean_loss_under_micro_batches_equals_the_full_batch_step():
    model = net()
    trainer(F.cross_entropy).fit(model, data())
    reference = plain(F.cross_entropy)
    assert torch.allclose(model.weight, reference.weight, atol=1e-6)


def test_a_sum_without_micro_batches_or_with_accumulate_is_not_refused():
    """micro_batches=1 steps on the loss as given (a plain loop's sum); accumulate weighs
    each batch by its share of the group, as Lightning divides by accumulate_grad_batches."""
    summing = nn.CrossEntropyLoss(reduction="sum")
    model = net()
    trainer(summing, micro_batches=1).fit(model, data())
    assert torch.allclose(model.weight, plain(summing).weight, atol=1e-6)
    steps = Recorder()
    trainer(summing, micro_batches=1, watchers=[steps], accumulate=2).fit(net(), data())
    assert len([e for e in steps.events if isinstance(e, StepEnd)]) == 2


def test_the_measure_tells_a_sum_from_a_mean_and_skips_what_it_cannot_split():
    out, y = torch.randn(8, 3), torch.randint(0, 3, (8,))
    total = lambda o, t: F.cross_entropy(o, t, reduction="sum")  # noqa: E731
    with pytest.raises(SettingError, match="micro_batches=2"):
        check_summed_value(total, out, y, total(out, y), 2)
    check_summed_value(F.cross_entropy, out, y, F.cross_entropy(out, y), 2)  # a mean
    check_summed_value(total, (out, out), y, total(out, y), 2)  # a tuple: not checked
    check_summed_value(total, out[:1], y[:1], total(out[:1], y[:1]), 2)  # one row
    assert summed(nn.MSELoss(reduction="sum")) == "nn.MSELoss(reduction='sum')"
    assert summed(nn.MSELoss()) is None and summed(F.mse_loss) is None
