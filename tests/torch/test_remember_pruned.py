"""A run stopped by a pruner its key does not hold (an Optuna trial passed as an excluded
argument) is not remembered: a later call — without the trial, or in another study —
trains in full rather than recalling the stopped run. A pruner in the function's own
code (early stopping) is part of the key: its stopped run is recalled as it ended."""

from __future__ import annotations

import torch
from torch import nn

import somatize.torch as st
from somatize import DiskKeeper, Done, Graph, Node, Opaque


class Linear(Node):
    def __init__(self) -> None:
        self.lin = nn.Linear(4, 3)

    def forward(self, x, ctx):
        return Done(Opaque(self.lin(x)))


gen = torch.Generator().manual_seed(0)
BATCHES = [
    (torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen)) for _ in range(4)
]


class StopAtOnce:
    """A pruner as an Optuna Trial is one: report, should_prune (a study's verdict)."""

    def __init__(self) -> None:
        self.reports: list[int] = []

    def report(self, value: float, step: int) -> None:
        self.reports.append(step)

    def should_prune(self) -> bool:
        return True


def train_one(seed: int, trial=None) -> st.TrainResult:
    torch.manual_seed(seed)
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        epochs=3,
        checkpoint=st.run_checkpointing(every_steps=2),
        pruner=trial,
        seed=seed,
        options=st.Options(progress=False),
    )
    return trainer.fit(Graph.somatize(Linear()), BATCHES, val=BATCHES[:1], resume="last")


def patient_one(seed: int) -> st.TrainResult:
    torch.manual_seed(seed)
    trainer = st.Trainer(
        loss=nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.0),  # nothing improves: stops early
        epochs=5,
        pruner=st.Patience("val_loss", patience=1),
        seed=seed,
        options=st.Options(progress=False),
    )
    return trainer.fit(Graph.somatize(Linear()), BATCHES, val=BATCHES[:1])


def test_a_run_pruned_by_an_excluded_trial_is_not_recalled_without_it(tmp_path):
    train = st.remember(train_one, keeper=DiskKeeper(tmp_path / "runs"), exclude=("trial",))
    trial = StopAtOnce()
    stopped = train(0, trial=trial)
    assert stopped.pruned and stopped.epochs == 1 and trial.reports
    assert not (tmp_path / "runs" / "remembered" / stopped.key).exists()  # checkpoints too

    full = train(0)  # the same key: trained in full, from scratch
    assert not full.recalled and not full.pruned and full.epochs == 3
    plain = train_one(0)
    assert all(torch.equal(full.state[k], plain.state[k]) for k in plain.state)
    again = train(0)  # the full run is remembered as any other
    assert again.recalled and again.epochs == 3


def test_a_run_stopped_by_its_own_early_stopping_is_recalled_as_it_ended(tmp_path):
    train = st.remember(patient_one, keeper=DiskKeeper(tmp_path / "runs"))
    first = train(0)
    assert first.pruned and first.epochs < 5
    again = train(0)
    assert again.recalled and again.pruned and again.epochs == first.epochs


def test_a_finished_run_with_no_pruner_in_its_excluded_argument_is_remembered(tmp_path):
    train = st.remember(train_one, keeper=DiskKeeper(tmp_path / "runs"), exclude=("trial",))
    assert not train(1).recalled and train(1).recalled
