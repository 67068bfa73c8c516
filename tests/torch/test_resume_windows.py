"""Resuming where an outside audit found it differed from never stopping: a run that died
during the evaluation after a step whose checkpoint was written (its first evaluation,
before any step, saw ``ctx.step`` 0), and a warm-up scheduler restored from a checkpoint
(warned about as a horizon shorter than the run, which a fresh run rightly is not)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim import lr_scheduler as lr

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from tests.torch.test_checkpoint_resume import Crash, CrashAt


class Annealed(Node):
    """Its output scaled by the step number: a temperature or a KL weight on ``ctx.step``."""

    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x) * (1.0 + 0.01 * ctx.step)))


def graph() -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(Annealed())


def data(n: int = 4):
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(6, 4, generator=gen), torch.randint(0, 3, (6,), generator=gen))
        for _ in range(n)
    ]


class DieOnce:
    """A metric that raises once, on its first call: the process dies in the evaluation."""

    def __init__(self, armed: bool) -> None:
        self.armed = armed

    def __call__(self, out, y):
        if self.armed:
            self.armed = False
            raise Crash
        return st.accuracy(out, y)


def test_an_evaluation_resumed_before_any_step_sees_the_step_it_resumed_at(tmp_path):
    def fit(folder, metric, resume=None):
        return st.Trainer(
            loss=F.cross_entropy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
            epochs=2,
            metrics={"acc": metric},
            checkpoint=st.Checkpointing(tmp_path / folder, every_steps=4),  # 4 batches an epoch
            options=st.Options(progress=False, sanity_val_batches=0),
        ).fit(graph(), data(), val=data(2), resume=resume)

    reference = fit("ref", DieOnce(False))
    with pytest.raises(Crash):
        fit("run", DieOnce(True))  # dies in epoch 0's evaluation, after step 4's checkpoint
    resumed = fit("run", DieOnce(False), resume="last")
    assert resumed.metrics == reference.metrics  # the evaluation at step 4 saw ctx.step 4
    assert resumed.losses == reference.losses


def _fit(tmp_path, scheduler, watchers=(), resume=None):
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        scheduler=scheduler,
        epochs=3,
        checkpoint=st.Checkpointing(tmp_path / "ckpt", every_steps=2),
        watchers=watchers,
        options=st.Options(progress=False),
    ).fit(graph(), data(7), resume=resume)


@pytest.mark.parametrize(
    "scheduler",
    [
        lambda opt: lr.LinearLR(opt, start_factor=0.1, total_iters=5),
        lambda opt: lr.ConstantLR(opt, factor=0.5, total_iters=4),
        lambda opt: lr.ChainedScheduler(
            [lr.LinearLR(opt, start_factor=0.1, total_iters=5), lr.ExponentialLR(opt, 0.99)]
        ),
    ],
    ids=["linear-warm-up", "constant", "chained-warm-up"],
)
def test_a_warm_up_restored_from_a_checkpoint_is_not_warned_about(tmp_path, scheduler):
    reference = _fit(tmp_path / "ref", scheduler)  # a fresh run: not warned (warnings: errors)
    with pytest.raises(Crash):
        _fit(tmp_path, scheduler, watchers=[CrashAt(11)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resumed = _fit(tmp_path, scheduler, resume="last")
    assert resumed.losses == reference.losses


def test_a_decay_restored_from_a_checkpoint_that_ends_early_is_still_warned_about(tmp_path):
    decay = lambda opt: lr.PolynomialLR(opt, total_iters=10)  # noqa: E731
    with pytest.warns(UserWarning, match="total_iters=10"), pytest.raises(Crash):
        _fit(tmp_path, decay, watchers=[CrashAt(5)])
    with pytest.warns(UserWarning, match=r"PolynomialLR restored from .* total_iters=10"):
        _fit(tmp_path, decay, resume="last")
