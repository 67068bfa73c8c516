"""Extending a run: more epochs continue it; a shorter scheduler or an early stop is said."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque


class Linear(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(3, 2)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def data(n: int = 3):
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(4, 3, generator=gen), torch.randint(0, 2, (4,), generator=gen))
        for _ in range(n)
    ]


def graph():
    torch.manual_seed(0)
    return Graph.somatize(Linear())


def trainer(directory, epochs, scheduler=None, pruner=None):
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        scheduler=scheduler,
        epochs=epochs,
        checkpoint=st.Checkpointing(directory),
        pruner=pruner,
        options=st.Options(progress=False),
    )


def test_resuming_a_finished_run_with_more_epochs_continues_it(tmp_path):
    trainer(tmp_path / "a", 2).fit(graph(), data())
    extended = trainer(tmp_path / "a", 4).fit(graph(), data(), resume="last")
    straight = trainer(tmp_path / "b", 4).fit(graph(), data())
    assert (extended.steps, extended.epochs) == (12, 4)
    assert extended.losses == straight.losses
    for k, v in straight.state.items():
        assert torch.equal(extended.state[k], v)


def test_a_restored_scheduler_built_for_a_shorter_run_is_warned_about(tmp_path):
    def cosine(epochs):
        return lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=3 * epochs)

    trainer(tmp_path, 2, cosine(2)).fit(graph(), data())
    with pytest.warns(
        UserWarning, match=r"CosineAnnealingLR restored .* T_max=6, but this run plans 12"
    ):
        trainer(tmp_path, 4, cosine(4)).fit(graph(), data(), resume="last")


def test_a_fixed_horizon_shorter_than_the_run_is_warned_about_too(tmp_path):
    def linear(opt):  # a decay (a warm-up, which ends on purpose, is not warned about)
        return torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.1, total_iters=6)

    trainer(tmp_path, 2, linear).fit(graph(), data())
    with pytest.warns(UserWarning, match="total_iters=6, but this run plans 9"):
        trainer(tmp_path, 3, linear).fit(graph(), data(), resume="last")


def test_a_restored_warmup_then_cosine_is_checked_from_its_milestone(tmp_path):
    def schedule(epochs):
        def make(opt):
            warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=2)
            cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=3 * epochs - 2)
            return torch.optim.lr_scheduler.SequentialLR(opt, [warm, cosine], milestones=[2])

        return make

    trainer(tmp_path, 2, schedule(2)).fit(graph(), data())  # sized for its 6 steps: quiet
    with pytest.warns(
        UserWarning,
        match=r"the SequentialLR's CosineAnnealingLR restored .* T_max=4 from step 2, but this "
        r"run plans 12",
    ):
        trainer(tmp_path, 4, schedule(4)).fit(graph(), data(), resume="last")


def test_resuming_an_early_stopped_run_says_so(tmp_path):
    stop = st.Patience("val_loss", patience=1, mode="max")  # a falling loss: stops at once
    first = trainer(tmp_path, 5, pruner=stop).fit(graph(), data(), val=data(1))
    assert first.pruned and first.epochs < 5
    with pytest.warns(UserWarning, match="stopped early by its pruner at step"):
        again = trainer(tmp_path, 10, pruner=stop).fit(graph(), data(), val=data(1), resume="last")
    assert again.steps == first.steps and again.pruned


def test_resuming_a_run_past_this_trainers_limits_says_nothing_is_trained(tmp_path):
    first = trainer(tmp_path, 4).fit(graph(), data())
    with pytest.warns(
        UserWarning, match=r"already at step 12 \(epoch 4\), past this Trainer's epochs=2"
    ):
        again = trainer(tmp_path, 2).fit(graph(), data(), resume="last")
    assert again.steps == first.steps == 12


def test_resuming_a_run_whose_factory_builds_a_short_scheduler_names_the_factory(tmp_path):
    """A cosine of T_max=4 in a 6-step run: the fresh run warns; resumed at the same length,
    the warning names the factory's sizing, not a resume into a longer run."""

    def short(opt):
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)

    with pytest.warns(UserWarning, match=r"CosineAnnealingLR was built for T_max=4, but this run"):
        trainer(tmp_path, 2, short).fit(graph(), data())
    with pytest.warns(UserWarning) as seen:
        trainer(tmp_path, 2, short).fit(graph(), data(), resume="last")
    message = "\n".join(str(w.message) for w in seen)
    assert "T_max=4, but this run plans 6; the scheduler factory builds it so" in message
    assert "Size it in optimizer steps, T_max=6" in message
    assert "Resume into a run of the same length" not in message
