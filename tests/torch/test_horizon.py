"""A scheduler built for fewer steps than a fresh run plans: warned of (a cosine that would
cycle, a decay that would sit at its end) or refused before the first step (a OneCycleLR,
which torch raises at in mid-run); ``Trainer.planned_steps`` is what to size it by."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim import lr_scheduler as lr

import somatize.torch as st
from somatize import Done, Graph, Node, Opaque
from somatize.errors import SettingError
from somatize.watchers import Recorder, StepEnd


class Linear(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


def data(n: int = 10):
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen))
        for _ in range(n)
    ]


def graph() -> Graph:
    torch.manual_seed(0)
    return Graph.somatize(Linear())


def trainer(scheduler=None, epochs=3, max_steps=None, watchers=(), **options) -> st.Trainer:
    return st.Trainer(
        loss=F.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        scheduler=scheduler,
        epochs=epochs,
        max_steps=max_steps,
        watchers=watchers,
        options=st.Options(progress=False, **options),
    )


def test_a_cosine_ported_from_lightning_warns_that_it_would_cycle():
    """T_max=epochs is Lightning's per-epoch sizing; stepped per optimizer step, the rate
    would fall to 0 at step 10 and climb back up over the next 10."""
    cosine = lambda opt: lr.CosineAnnealingLR(opt, T_max=3)  # noqa: E731
    with pytest.warns(UserWarning) as said:
        result = trainer(cosine).fit(graph(), data())
    (message,) = [str(w.message) for w in said]
    assert "CosineAnnealingLR was built for T_max=3, but this run steps it 30 times" in message
    assert "climbs back up" in message and "CosineAnnealingWarmRestarts" in message
    assert "T_max=30 (trainer.planned_steps(train) gives it)" in message
    assert "Options(scheduler_every='epoch')" in message
    assert result.steps == 30  # a warning: the run goes on


@pytest.mark.parametrize(
    "scheduler, every",
    [
        (lambda opt: lr.CosineAnnealingLR(opt, T_max=3), "epoch"),  # sized in epochs
        (lambda opt: lr.CosineAnnealingLR(opt, T_max=30), "step"),  # sized in steps
        (lambda opt: lr.CosineAnnealingWarmRestarts(opt, T_0=5), "step"),  # restarts on purpose
        (lambda opt: lr.LinearLR(opt, total_iters=5), "step"),  # a warm-up, then the lr
        (lambda opt: lr.StepLR(opt, step_size=10, gamma=0.5), "step"),  # no horizon
    ],
    ids=["cosine-epochs", "cosine-steps", "warm-restarts", "warm-up", "step-lr"],
)
def test_a_scheduler_sized_for_the_run_or_meant_to_end_early_is_not_warned_about(scheduler, every):
    result = trainer(scheduler, scheduler_every=every).fit(graph(), data())  # warnings: errors
    assert result.steps == 30


@pytest.mark.parametrize(
    "scheduler, said",
    [
        (lambda opt: lr.PolynomialLR(opt, total_iters=10), "its rate reaches 0 at step 10"),
        (
            lambda opt: lr.LinearLR(opt, start_factor=1.0, end_factor=0.0, total_iters=10),
            "decays to end_factor=0.0 of lr at step 10 and stays there for the other 20",
        ),
    ],
    ids=["polynomial", "linear-decay"],
)
def test_a_decay_that_would_sit_at_its_end_rate_is_warned_about(scheduler, said):
    with pytest.warns(UserWarning, match=r"total_iters=10, but this run steps it 30 times") as w:
        trainer(scheduler).fit(graph(), data())
    assert said in str(w[0].message)


def test_a_one_cycle_shorter_than_the_run_is_refused_before_the_first_step():
    steps = Recorder()
    one_cycle = lambda opt: lr.OneCycleLR(opt, max_lr=0.1, total_steps=10)  # noqa: E731
    with pytest.raises(SettingError) as caught:
        trainer(one_cycle, watchers=[steps]).fit(graph(), data())
    message = str(caught.value)
    assert "OneCycleLR was built for total_steps=10, but this run steps it 30 times" in message
    assert "total_steps=30 (trainer.planned_steps(train) gives it)" in message
    assert not [e for e in steps.events if isinstance(e, StepEnd)]  # (torch: at step 11)


def test_sized_by_planned_steps_a_one_cycle_runs_to_its_end():
    t = trainer(epochs=3, accumulate=2)
    planned = t.planned_steps(data())  # 10 batches in groups of 2, 3 epochs
    assert planned == 15
    t.scheduler = lambda opt: lr.OneCycleLR(opt, max_lr=0.1, total_steps=planned)
    t.watchers = [Recorder()]
    result = t.fit(graph(), data())
    rates = [e.lr for e in t.watchers[0].events if isinstance(e, StepEnd)]
    assert result.steps == planned == len(rates)
    assert rates[-1] < rates[0] < max(rates) <= 0.1  # up, then down below where it began


def _warmup_then(opt, last, warmup=5):
    return lr.SequentialLR(
        opt, [lr.LinearLR(opt, start_factor=0.1, total_iters=warmup), last], milestones=[warmup]
    )


def test_a_warmup_then_cosine_whose_cosine_is_short_warns_with_what_is_left():
    """The usual transformer schedule: SequentialLR's last scheduler runs from its milestone
    to the end of the run, so its T_max is what is left after the warm-up."""
    short = lambda opt: _warmup_then(opt, lr.CosineAnnealingLR(opt, T_max=10))  # noqa: E731
    with pytest.warns(UserWarning) as said:
        result = trainer(short).fit(graph(), data())
    (message,) = [str(w.message) for w in said]
    assert (
        "the SequentialLR's CosineAnnealingLR was built for T_max=10 from step 5, but this run "
        "steps it 30 times" in message
    )
    assert "falls to eta_min at step 15 and then climbs back up" in message
    assert "T_max=25 (what is left after its milestone 5)" in message
    assert result.steps == 30


def test_a_warmup_then_cosine_sized_by_what_is_left_runs_to_eta_min_unwarned():
    t = trainer()
    left = t.planned_steps(data()) - 5
    t.scheduler = lambda opt: _warmup_then(opt, lr.CosineAnnealingLR(opt, T_max=left))
    t.watchers = [Recorder()]
    result = t.fit(graph(), data())  # warnings are errors here: none
    rates = [e.lr for e in t.watchers[0].events if isinstance(e, StepEnd)]
    assert result.steps == 30 and rates[-1] < 1e-3 < rates[5]  # down to eta_min at the end


def test_a_one_cycle_after_a_milestone_that_would_overrun_is_refused():
    late = lambda opt: _warmup_then(  # noqa: E731
        opt, lr.OneCycleLR(opt, max_lr=0.1, total_steps=20)
    )
    with pytest.raises(SettingError, match=r"OneCycleLR was built for total_steps=20 from step 5"):
        trainer(late).fit(graph(), data())


def test_each_scheduler_of_a_chain_is_checked_over_the_whole_run():
    chained = lambda opt: lr.ChainedScheduler(  # noqa: E731
        [lr.LinearLR(opt, start_factor=0.1, total_iters=5), lr.PolynomialLR(opt, total_iters=12)]
    )
    with pytest.warns(UserWarning) as said:
        trainer(chained).fit(graph(), data())
    (message,) = [str(w.message) for w in said]  # the warm-up ends on purpose: not warned of
    assert "the ChainedScheduler's PolynomialLR was built for total_iters=12, but" in message
    assert "total_iters=30 (trainer.planned_steps(train) gives it)" in message


@pytest.mark.parametrize(
    "settings",
    [
        {"epochs": 3},
        {"epochs": 3, "accumulate": 3},  # 10 batches: groups of 3, 3, 3, 1
        {"epochs": 4, "limit_train_batches": 0.5},
        {"epochs": 5, "max_steps": 12},
        {"epochs": None, "max_steps": 7},
    ],
    ids=["epochs", "accumulate", "limit", "max-steps", "max-steps-only"],
)
def test_planned_steps_are_the_steps_fit_takes(settings):
    t = trainer(**settings)
    assert t.planned_steps(data()) == t.fit(graph(), data()).steps


def test_planned_steps_of_data_without_a_length_are_unknown_but_max_steps_bounds_them():
    class Stream:  # an iterable with no len()
        def __iter__(self):
            return iter(data())

    assert trainer(epochs=2).planned_steps(Stream()) is None
    assert trainer(epochs=None, max_steps=4).planned_steps(Stream()) == 4
    cosine = lambda opt: lr.CosineAnnealingLR(opt, T_max=3)  # noqa: E731
    assert trainer(cosine, epochs=2).fit(graph(), Stream()).steps == 20  # unknown: no warning


def test_per_epoch_steps_count_the_epochs_that_end_before_max_steps():
    """Stepped per epoch, a scheduler is stepped at each epoch's end: max_steps=25 of 10
    steps an epoch ends 2 of them, however many epochs are asked for."""
    short = lambda opt: lr.CosineAnnealingLR(opt, T_max=1)  # noqa: E731
    with pytest.warns(UserWarning, match=r"T_max=1, but this run steps it 2 times") as w:
        trainer(short, epochs=10, max_steps=25, scheduler_every="epoch").fit(graph(), data())
    assert "Size it in epochs: T_max=2" in str(w[0].message)
    fits = lambda opt: lr.CosineAnnealingLR(opt, T_max=2)  # noqa: E731
    trainer(fits, epochs=10, max_steps=25, scheduler_every="epoch").fit(graph(), data())


def test_planned_steps_under_torchrun_count_a_ranks_share(monkeypatch):
    """Each rank steps once per step of the run, on its share of the batches: with 2
    processes, half of them (a list's every other batch, a loader's DistributedSampler)."""
    from torch.utils.data import DataLoader, TensorDataset

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    loader = DataLoader(TensorDataset(torch.randn(80, 4), torch.randint(0, 3, (80,))), 8)
    assert trainer(epochs=3).planned_steps(data()) == 15  # 10 batches: 5 a rank
    assert trainer(epochs=3).planned_steps(loader) == 15  # 40 examples a rank: 5 batches
