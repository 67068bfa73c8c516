"""A scheduler sized in epochs (as ported from a LightningModule, where a bare scheduler is
stepped once an epoch) but stepped after every optimizer step: warned of before the first
step, from its rates replayed on a throwaway copy (decay.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim import lr_scheduler as lr

import somatize.torch as st
from somatize.torch.decay import check_decay, decayed_at, rates
from somatize.watchers import Recorder, StepEnd

PER_EPOCH, EPOCHS = 16, 10


def data(n: int = PER_EPOCH):
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen))
        for _ in range(n)
    ]


def check(scheduler, planned=PER_EPOCH * EPOCHS, per_epoch=PER_EPOCH):
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=0.1)
    check_decay(scheduler(opt), opt, planned, per_epoch)


def fit(scheduler, epochs=EPOCHS, **options):
    torch.manual_seed(0)
    steps = Recorder()
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        scheduler=scheduler,
        epochs=epochs,
        watchers=[steps],
        options=st.Options(progress=False, **options),
    )
    result = trainer.fit(nn.Linear(4, 3), data())
    return result, [e.lr for e in steps.events if isinstance(e, StepEnd)]


@pytest.mark.parametrize(
    "scheduler, fix",
    [
        (lambda opt: lr.StepLR(opt, 3, 0.1), "StepLR(opt, step_size=48, ...)"),
        (lambda opt: lr.MultiStepLR(opt, [5, 8], 0.1), "MultiStepLR(opt, milestones=[80, 128]"),
        (lambda opt: lr.MultiStepLR(opt, [5, 8], 0.5), "MultiStepLR(opt, milestones=[80, 128]"),
        (lambda opt: lr.ExponentialLR(opt, 0.8), "ExponentialLR(opt, gamma=0.98615)"),
        (lambda opt: lr.LambdaLR(opt, lambda epoch: 0.7**epoch), "size it in optimizer steps ("),
    ],
    ids=["step", "multistep", "multistep-mild", "exponential", "lambda"],
)
def test_a_scheduler_sized_in_epochs_and_stepped_every_step_is_warned_about(scheduler, fix):
    with pytest.warns(UserWarning) as said:
        check(scheduler)
    (message,) = [str(w.message) for w in said]
    name = type(scheduler(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1))).__name__
    assert f"the {name} brings the learning rate from 0.1 down to" in message
    assert "of the 160 this run plans" in message
    assert "An epoch is 16 optimizer steps here" in message and "runs 16 times too fast" in message
    assert "Options(scheduler_every='epoch')" in message and fix in message


def test_fit_warns_of_a_step_lr_ported_from_lightning_and_goes_on():
    """The audit's case: StepLR(3, 0.1) over 10 epochs of 16 steps ends at 1e-54."""
    with pytest.warns(UserWarning, match=r"the StepLR brings the learning rate from 0\.1") as w:
        result, used = fit(lambda opt: lr.StepLR(opt, 3, 0.1))
    assert "it ends at 1e-54" in str(w[0].message) and "step_size=48" in str(w[0].message)
    assert result.steps == 160 and used[-1] < 1e-50  # a warning: the run goes on as asked
    result, used = fit(lambda opt: lr.StepLR(opt, 3, 0.1), scheduler_every="epoch")  # no warning
    assert used[-1] == pytest.approx(0.1 * 0.1**3)  # stepped 9 times, as Lightning would


@pytest.mark.parametrize(
    "scheduler",
    [
        lambda opt: lr.StepLR(opt, 3 * PER_EPOCH, 0.1),  # sized in steps
        lambda opt: lr.MultiStepLR(opt, [5 * PER_EPOCH, 8 * PER_EPOCH], 0.1),
        lambda opt: lr.ExponentialLR(opt, 0.8 ** (1 / PER_EPOCH)),
        lambda opt: lr.MultiStepLR(opt, [53, 106], 0.1),  # ImageNet's thirds
        lambda opt: lr.LambdaLR(opt, lambda s: 1 - s / 160),  # linear, to 0
        lambda opt: lr.CyclicLR(opt, 0.001, 0.1, step_size_up=4),  # cycles
        lambda opt: lr.CosineAnnealingWarmRestarts(opt, T_0=8),  # restarts
        lambda opt: lr.LinearLR(opt, start_factor=0.01, total_iters=20),  # warm-up
        lambda opt: lr.CosineAnnealingLR(opt, T_max=160),  # to 0, at the end
    ],
    ids=[
        "step-in-steps",
        "multistep-in-steps",
        "exponential-in-steps",
        "imagenet-thirds",
        "linear-to-zero",
        "cyclic",
        "warm-restarts",
        "warm-up",
        "cosine",
    ],
)
def test_a_schedule_sized_in_optimizer_steps_is_not_warned_about(scheduler):
    check(scheduler)  # warnings are errors here


def test_a_one_epoch_run_or_one_of_unknown_epochs_is_not_checked():
    """No epoch to have sized it by: a decay within the one epoch is what it is meant to do."""
    check(lambda opt: lr.StepLR(opt, 3, 0.1), planned=16, per_epoch=16)
    check(lambda opt: lr.StepLR(opt, 3, 0.1), planned=160, per_epoch=None)
    result, used = fit(lambda opt: lr.StepLR(opt, 3, 0.1), epochs=1)
    assert result.steps == 16 and used[-1] < 1e-5


def test_the_replay_gives_the_rates_fit_uses_and_leaves_the_scheduler_as_it_was():
    """Differential against the run: the rates replayed on the copy are those the steps of
    the fit then use, and the replay moved neither the scheduler nor its optimizer."""
    param = nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([param], lr=0.1)
    sched = lr.SequentialLR(
        opt, [lr.LinearLR(opt, 0.1, total_iters=4), lr.StepLR(opt, 5, 0.5)], milestones=[4]
    )
    replayed = rates(sched, opt, 40)
    assert sched.last_epoch == 0 and opt.param_groups[0]["lr"] == pytest.approx(0.01)
    assert opt.param_groups[0]["params"][0] is param and not opt.state
    plain = []
    for _ in range(40):
        plain.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert replayed == plain


def test_decayed_at_reads_a_floor_reached_early_and_kept():
    assert decayed_at([1.0] * 2 + [0.001] * 30) == 2
    assert decayed_at([1.0] * 10 + [0.5] * 10 + [0.25] * 12) is None  # reached late
    assert decayed_at([1.0] + [0.001, 1.0] * 16) is None  # climbs back: cyclic
    assert decayed_at([1.0] * 2 + [0.6] * 30) is None  # fell by less than half
    assert decayed_at([1.0, 0.001, 0.001]) is None  # too few steps to say
