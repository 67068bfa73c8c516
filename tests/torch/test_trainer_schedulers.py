"""The Trainer's LR schedulers: stepped per step or per epoch (after the epoch's
evaluation), and metric-driven ones (ReduceLROnPlateau) with what they need."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import somatize.torch as st
from somatize import Recorder
from somatize.watchers import StepEnd
from tests.torch.trainer_helpers import batches, make_graph, quiet, sgd


@pytest.mark.parametrize(
    ("every", "want"),
    [("step", [0.8, 0.4, 0.2, 0.1, 0.05, 0.025]), ("epoch", [0.8, 0.8, 0.8, 0.4, 0.4, 0.4])],
)
def test_scheduler_steps_per_step_or_per_epoch(every, want):
    rec = Recorder()
    made = []
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.8),
        scheduler=lambda opt: (
            made.append(torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)) or made[-1]
        ),
        epochs=2,
        watchers=[rec],
        options=quiet(scheduler_every=every),
    )
    trainer.fit(make_graph(), batches(3))
    assert [e.lr for e in rec.of(StepEnd)] == pytest.approx(want)  # the rate each step used
    assert made[0].get_last_lr()[0] == pytest.approx(want[-1] * 0.5)


# -- metric-driven schedulers ------------------------------------------------------------


def test_reduce_lr_on_plateau_steps_with_the_monitored_metric_after_each_evaluation():
    made = []
    scores = iter([0.5, 0.4, 0.4, 0.4])

    def sched(opt):
        made.append(
            torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=0)
        )
        return made[-1]

    rec = Recorder()
    trainer = st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.8),
        scheduler=sched,
        epochs=4,
        metrics={"score": lambda out, y: torch.tensor(next(scores))},
        watchers=[rec],
        # a scripted metric: the sanity check's call would take a score too
        options=quiet(monitor="val_score", mode="max", sanity_val_batches=0),
    )
    trainer.fit(make_graph(), batches(2), val=batches(1))
    # epoch 1: 0.5 is the best so far; epoch 2: worse (patience 0) halves; then again twice
    assert [e.lr for e in rec.of(StepEnd)] == pytest.approx([0.8] * 4 + [0.4] * 2 + [0.2] * 2)
    assert made[0].optimizer.param_groups[0]["lr"] == pytest.approx(0.1)


def test_reduce_lr_on_plateau_needs_validation_data_and_a_known_metric():
    def plateau(opt):
        return torch.optim.lr_scheduler.ReduceLROnPlateau(opt)

    trainer = st.Trainer(loss=F.cross_entropy, optimizer=sgd, scheduler=plateau, options=quiet())
    with pytest.raises(ValueError, match="ReduceLROnPlateau .* no val= data"):
        trainer.fit(make_graph(), batches(1))
    trainer = st.Trainer(
        loss=F.cross_entropy, optimizer=sgd, scheduler=plateau, options=quiet(monitor="val_nll")
    )
    with pytest.raises(KeyError, match="monitor='val_nll'"):
        trainer.fit(make_graph(), batches(1), val=batches(1))


def test_a_per_epoch_scheduler_steps_after_the_epochs_evaluation():
    seen = []

    class Spy(torch.optim.lr_scheduler.StepLR):
        def step(self, *a, **k):
            seen.append("sched")
            super().step(*a, **k)

    def metric(out, y):
        seen.append("eval")
        return torch.tensor(0.0)

    st.Trainer(
        loss=F.cross_entropy,
        optimizer=sgd,
        scheduler=lambda opt: Spy(opt, 1),
        epochs=2,
        metrics={"m": metric},
        options=quiet(scheduler_every="epoch"),
    ).fit(make_graph(), batches(1), val=batches(1))
    assert seen[-4:] == ["eval", "sched", "eval", "sched"]
